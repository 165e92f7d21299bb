//! The functions libibverbs exports to providers under `IBVERBS_PRIVATE_34`.
//! Providers link against libibverbs for these, as rdma-core's own providers do.

use core::ffi::{c_int, c_void};

use crate::private::{VerbsContextOps, VerbsDeviceOps};
use crate::verbs::*;

#[link(name = "ibverbs")]
extern "C" {
    /// Adds a provider to libibverbs' list; called from the provider's ELF constructor.
    pub fn verbs_register_driver_34(ops: *const VerbsDeviceOps);

    /// `calloc`s `alloc_size` bytes, initialises the `verbs_context` found `context_offset`
    /// bytes in (passed as a pointer value, as the C macro does), and takes ownership of
    /// `cmd_fd` (closing it on failure). Returns the start of the allocation or NULL.
    pub fn _verbs_init_and_alloc_context(
        device: *mut ibv_device,
        cmd_fd: c_int,
        alloc_size: usize,
        context_offset: *mut verbs_context,
        driver_id: u32,
    ) -> *mut c_void;

    /// Undoes `verbs_init_context` (closes cmd_fd and async_fd, frees private state).
    pub fn verbs_uninit_context(context: *mut verbs_context);

    /// Copies every non-NULL slot of `ops` into the context's dispatch tables.
    pub fn verbs_set_ops(vctx: *mut verbs_context, ops: *const VerbsContextOps);

    /// Fills the generic `ibv_cq` fields (context, channel, cq_context, lock, cond).
    pub fn verbs_init_cq(
        cq: *mut ibv_cq,
        context: *mut ibv_context,
        channel: *mut ibv_comp_channel,
        cq_context: *mut c_void,
    );
}
