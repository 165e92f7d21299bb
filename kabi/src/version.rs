//! Which libibverbs the process runs, and whether uiw's private-ABI mirror fits it.
//!
//! rdma-core names its provider ABI with `IBVERBS_PABI_VERSION`: 34 for v34.0–v56.x, then 57
//! (v57–v58), 59 (v59–v63), 64 (v64) and 65 (v65). That number names the symbol a provider
//! registers with (`verbs_register_driver_N`), the version node of every private symbol
//! (`IBVERBS_PRIVATE_N`) and the provider's file name (`lib<name>-rdmavN.so`). Within one name
//! the layouts still move: v34/v35 lack `query_qp_data_in_order` in `verbs_context_ops`,
//! `ibv_qp_ex` grows in v44 and v45, and v62 adds two `verbs_context_ops` slots and a
//! `verbs_context` member under the name 59. So the provider keys everything on the *release*,
//! read from libibverbs' file name, and registers only when [`detect`] names one whose layouts
//! it knows (`kabi/README.md` lists them). A provider that guessed wrong would corrupt
//! libibverbs' memory.

use core::ffi::{c_void, CStr};

use crate::private::{QP_EX_MAX_SLOTS, QP_EX_MIN_SLOTS};

/// First and last rdma-core releases whose private ABI the mirror matches.
pub const MIN_SUPPORTED: u32 = 36;
pub const MAX_SUPPORTED: u32 = 65;

/// Every private ABI name (`IBVERBS_PABI_VERSION`) of a supported release, oldest first. The
/// provider is installed under each `libuiw-rdmavN.so` so that any of them finds it.
pub const PABIS: &[u32] = &[34, 57, 59, 64, 65];

/// `lib<name>-rdmav<pabi>.so`: the file name libibverbs loads a provider from.
pub fn provider_file_name(name: &str, pabi: u32) -> String {
    format!("lib{name}-rdmav{pabi}.so")
}

/// The rdma-core release of the running libibverbs, e.g. 44 for `libibverbs.so.1.14.44.0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LibVersion {
    pub release: u32,
}

impl LibVersion {
    /// Number of function slots in this release's `ibv_qp_ex`.
    pub fn qp_ex_slots(self) -> usize {
        match self.release {
            0..=43 => QP_EX_MIN_SLOTS,
            44 => QP_EX_MIN_SLOTS + 1,
            _ => QP_EX_MAX_SLOTS,
        }
    }

    /// The release's private ABI name (`IBVERBS_PABI_VERSION` in rdma-core's CMakeLists.txt),
    /// for supported releases.
    pub fn pabi(self) -> Option<u32> {
        match self.release {
            36..=56 => Some(34),
            57..=58 => Some(57),
            59..=63 => Some(59),
            64 => Some(64),
            65 => Some(65),
            _ => None,
        }
    }

    pub fn is_supported(self) -> bool {
        (MIN_SUPPORTED..=MAX_SUPPORTED).contains(&self.release) && self.pabi().is_some()
    }
}

/// Why uiw will not register with the running libibverbs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionError {
    /// libibverbs' file could not be found or its name carries no release number.
    Unknown(String),
    /// A release outside [`MIN_SUPPORTED`]..=[`MAX_SUPPORTED`].
    Unsupported(LibVersion, String),
}

impl core::fmt::Display for VersionError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            VersionError::Unknown(why) => write!(
                f,
                "cannot tell which rdma-core release libibverbs belongs to ({why}); \
                 uiw supports v{MIN_SUPPORTED}..v{MAX_SUPPORTED} and will not guess"
            ),
            VersionError::Unsupported(v, path) => write!(
                f,
                "{path} is rdma-core v{}, but uiw knows the private provider ABI only of \
                 v{MIN_SUPPORTED}..v{MAX_SUPPORTED} (IBVERBS_PRIVATE_{}); a uiw built for that \
                 release is needed",
                v.release,
                PABIS.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("/")
            ),
        }
    }
}

/// Parses the release out of a libibverbs file name: `libibverbs.so.1.14.44.0` → 44.
pub fn parse_file_name(name: &str) -> Option<LibVersion> {
    let rest = name.rsplit('/').next()?.strip_prefix("libibverbs.so.")?;
    let mut parts = rest.split('.');
    let (_soname_major, _soname_minor) = (parts.next()?, parts.next()?);
    let release = parts.next()?.parse().ok()?;
    Some(LibVersion { release })
}

#[link(name = "ibverbs")]
extern "C" {
    // Any symbol of libibverbs' public ABI serves to find the file it was loaded from.
    fn ibv_get_device_list(num_devices: *mut core::ffi::c_int) -> *mut *mut c_void;
}

/// Finds the file the running libibverbs was loaded from and reads its release.
pub fn detect() -> Result<(LibVersion, String), VersionError> {
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    let sym = ibv_get_device_list as *const c_void;
    // SAFETY: dladdr only reads the loader's tables; `info` is a valid out-parameter.
    if unsafe { libc::dladdr(sym, &mut info) } == 0 || info.dli_fname.is_null() {
        return Err(VersionError::Unknown("dladdr found no file for ibv_get_device_list".into()));
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
    let loaded = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned();
    let real = std::fs::canonicalize(&loaded)
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|_| loaded.clone());
    match parse_file_name(&real) {
        Some(v) if v.is_supported() => Ok((v, real)),
        Some(v) => Err(VersionError::Unsupported(v, real)),
        None => Err(VersionError::Unknown(format!("{real} has no release in its name"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_distribution_file_names() {
        assert_eq!(parse_file_name("/usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.44.0"),
                   Some(LibVersion { release: 44 }));
        assert_eq!(parse_file_name("libibverbs.so.1.14.50.1"), Some(LibVersion { release: 50 }));
        // Debian unstable's rdma-core 65.0 bumped the soname's minor.
        assert_eq!(parse_file_name("/usr/lib/x86_64-linux-gnu/libibverbs.so.1.18.65.0"),
                   Some(LibVersion { release: 65 }));
        assert_eq!(parse_file_name("/lib/libibverbs.so.1"), None);
        assert_eq!(parse_file_name("/lib/libfoo.so.1.14.44.0"), None);
    }

    #[test]
    fn slot_counts_follow_the_releases() {
        let slots = |r| LibVersion { release: r }.qp_ex_slots();
        assert_eq!((slots(36), slots(43), slots(44), slots(45), slots(56)), (20, 20, 21, 22, 22));
        assert_eq!(slots(65), 22);
        assert!(!LibVersion { release: 35 }.is_supported());
        assert!(LibVersion { release: 57 }.is_supported());
        assert!(LibVersion { release: 65 }.is_supported());
        assert!(!LibVersion { release: 66 }.is_supported());
    }

    #[test]
    fn private_abi_names_follow_the_releases() {
        let pabi = |r| LibVersion { release: r }.pabi();
        assert_eq!((pabi(35), pabi(36), pabi(44), pabi(56)), (None, Some(34), Some(34), Some(34)));
        assert_eq!((pabi(57), pabi(58), pabi(59), pabi(63)), (Some(57), Some(57), Some(59), Some(59)));
        assert_eq!((pabi(64), pabi(65), pabi(66)), (Some(64), Some(65), None));
        // Every supported release's name is one the provider is installed under.
        for r in MIN_SUPPORTED..=MAX_SUPPORTED {
            assert!(PABIS.contains(&pabi(r).unwrap()), "v{r}");
        }
        assert_eq!(provider_file_name("uiw", 65), "libuiw-rdmav65.so");
    }

    #[test]
    fn detects_the_installed_library() {
        let (v, path) = detect().expect("libibverbs from Debian's libibverbs1 is versioned");
        assert!(v.is_supported(), "{path}");
    }
}
