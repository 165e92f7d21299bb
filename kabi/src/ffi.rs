//! The functions libibverbs exports to providers under its private version node
//! (`IBVERBS_PRIVATE_34` in rdma-core v36–v56, `_57`, `_59`, `_64`, `_65` after it).
//!
//! rdma-core's own providers link against these names, so each build of a provider fits one
//! private ABI: a reference to `verbs_set_ops@IBVERBS_PRIVATE_34` makes `dlopen` fail against a
//! libibverbs that only defines `verbs_set_ops@IBVERBS_PRIVATE_65`. uiw serves every supported
//! release from one build instead: it does not link them, but looks them up with `dlvsym` in
//! the libibverbs the process loaded, under the version node of that libibverbs' release
//! ([`PrivateFns::resolve`]), before it registers.

use core::ffi::{c_int, c_void};
use std::ffi::CString;

use crate::private::VerbsDeviceOps;
use crate::verbs::*;

/// Adds a provider to libibverbs' list; called from the provider's ELF constructor.
/// (`verbs_register_driver_N`.)
pub type RegisterDriverFn = unsafe extern "C" fn(ops: *const VerbsDeviceOps);

/// `calloc`s `alloc_size` bytes, initialises the `verbs_context` found `context_offset` bytes in
/// (passed as a pointer value, as the C macro does), and takes ownership of `cmd_fd` (closing it
/// on failure). Returns the start of the allocation or NULL.
pub type InitAndAllocContextFn = unsafe extern "C" fn(
    device: *mut ibv_device,
    cmd_fd: c_int,
    alloc_size: usize,
    context_offset: *mut verbs_context,
    driver_id: u32,
) -> *mut c_void;

/// Undoes `verbs_init_context` (closes cmd_fd and async_fd, frees private state).
pub type UninitContextFn = unsafe extern "C" fn(context: *mut verbs_context);

/// Copies every non-NULL slot of a `struct verbs_context_ops` (in the running release's layout,
/// see [`crate::private::context_ops_slots`]) into the context's dispatch tables.
pub type SetOpsFn = unsafe extern "C" fn(vctx: *mut verbs_context, ops: *const c_void);

/// The private libibverbs functions uiw calls, as found in the running libibverbs.
#[derive(Clone, Copy)]
pub struct PrivateFns {
    /// The private ABI they were found under (`IBVERBS_PRIVATE_<pabi>`).
    pub pabi: u32,
    pub register_driver: RegisterDriverFn,
    pub init_and_alloc_context: InitAndAllocContextFn,
    pub uninit_context: UninitContextFn,
    pub set_ops: SetOpsFn,
}

impl PrivateFns {
    /// Looks the functions up in the already loaded libibverbs at `library` (the file
    /// [`crate::version::detect`] found), under version node `IBVERBS_PRIVATE_<pabi>`.
    /// Fails, naming the missing symbol, when that libibverbs does not define them: its file
    /// name then lied about its release, and nothing should be registered.
    pub fn resolve(library: &str, pabi: u32) -> Result<Self, String> {
        let path = CString::new(library).map_err(|_| format!("{library:?} has a NUL byte"))?;
        // SAFETY: RTLD_NOLOAD only returns a handle to an object already loaded (libibverbs is
        // our DT_NEEDED, so it is); it runs no constructors. The handle is never closed, so the
        // library stays as long as the process, as it would anyway.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if handle.is_null() {
            return Err(format!("{library} is not loaded in this process"));
        }
        let node = CString::new(format!("IBVERBS_PRIVATE_{pabi}")).expect("no NUL");
        let find = |name: &str| -> Result<*mut c_void, String> {
            let sym = CString::new(name).expect("no NUL");
            // SAFETY: dlvsym only reads the loader's tables; the strings are NUL-terminated.
            let p = unsafe { libc::dlvsym(handle, sym.as_ptr(), node.as_ptr()) };
            if p.is_null() {
                Err(format!("{library} does not define {name}@{}", node.to_string_lossy()))
            } else {
                Ok(p)
            }
        };
        let register = find(&format!("verbs_register_driver_{pabi}"))?;
        let init = find("_verbs_init_and_alloc_context")?;
        let uninit = find("verbs_uninit_context")?;
        let set_ops = find("verbs_set_ops")?;
        // SAFETY: each symbol is the function driver.h declares under that name for this
        // private ABI, with the C signature the matching fn type spells out (unchanged from
        // v36 to v65, see kabi/README.md); a function's address converts to its pointer type.
        unsafe {
            Ok(PrivateFns {
                pabi,
                register_driver: core::mem::transmute::<*mut c_void, RegisterDriverFn>(register),
                init_and_alloc_context: core::mem::transmute::<*mut c_void, InitAndAllocContextFn>(init),
                uninit_context: core::mem::transmute::<*mut c_void, UninitContextFn>(uninit),
                set_ops: core::mem::transmute::<*mut c_void, SetOpsFn>(set_ops),
            })
        }
    }

    /// The version node these were found under, for messages.
    pub fn node(&self) -> String {
        format!("IBVERBS_PRIVATE_{}", self.pabi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_the_installed_libibverbs_under_its_own_node_only() {
        let (v, path) = crate::version::detect().expect("a supported libibverbs");
        let pabi = v.pabi().unwrap();
        let fns = PrivateFns::resolve(&path, pabi).expect("the running libibverbs' own node");
        assert_eq!(fns.node(), format!("IBVERBS_PRIVATE_{pabi}"));
        let other = crate::version::PABIS.iter().find(|&&p| p != pabi).unwrap();
        let err = PrivateFns::resolve(&path, *other).err().expect("another release's node");
        assert!(err.contains(&format!("verbs_register_driver_{other}@IBVERBS_PRIVATE_{other}")), "{err}");
        assert!(PrivateFns::resolve("/nonexistent/libibverbs.so.1", pabi).is_err());
    }
}
