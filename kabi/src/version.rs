//! Which libibverbs the process runs, and whether uiw's private-ABI mirror fits it.
//!
//! The private ABI name (`IBVERBS_PRIVATE_34`) is shared by rdma-core v34.0 to v56.x, but the
//! provider-facing structs match our mirror only from v36.0 on (v34/v35 lack
//! `query_qp_data_in_order` in `verbs_context_ops`), and `ibv_qp_ex` grows in v44 and v45.
//! A provider that guessed wrong would corrupt libibverbs' memory, so the provider registers
//! only when [`detect`] names a supported version.

use core::ffi::{c_void, CStr};

use crate::private::{QP_EX_MAX_SLOTS, QP_EX_MIN_SLOTS};

/// First and last rdma-core releases whose private ABI the mirror matches.
pub const MIN_SUPPORTED: u32 = 36;
pub const MAX_SUPPORTED: u32 = 56;

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

    pub fn is_supported(self) -> bool {
        (MIN_SUPPORTED..=MAX_SUPPORTED).contains(&self.release)
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
                "{path} is rdma-core v{}, but uiw's private-ABI mirror fits only \
                 v{MIN_SUPPORTED}..v{MAX_SUPPORTED}",
                v.release
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
        assert_eq!(parse_file_name("/lib/libibverbs.so.1"), None);
        assert_eq!(parse_file_name("/lib/libfoo.so.1.14.44.0"), None);
    }

    #[test]
    fn slot_counts_follow_the_releases() {
        let slots = |r| LibVersion { release: r }.qp_ex_slots();
        assert_eq!((slots(36), slots(43), slots(44), slots(45), slots(56)), (20, 20, 21, 22, 22));
        assert!(!LibVersion { release: 35 }.is_supported());
        assert!(!LibVersion { release: 57 }.is_supported());
    }

    #[test]
    fn detects_the_installed_library() {
        let (v, path) = detect().expect("libibverbs from Debian's libibverbs1 is versioned");
        assert!(v.is_supported(), "{path}");
    }
}
