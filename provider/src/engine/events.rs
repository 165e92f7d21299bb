//! Event delivery through file descriptors libibverbs reads, in the kernel's record formats:
//! async events (`ibv_get_async_event`, 16-byte `ib_uverbs_async_event_desc`) and completion
//! events (`ibv_get_cq_event`, 8-byte `ib_uverbs_comp_event_desc`). The engine only writes
//! whole records to pipes it owns; opening them is the FFI layer's job.

use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicU32, Ordering};

use uiw_kabi::uverbs::{async_event_record, comp_event_record};

/// `enum ibv_event_type` values uiw raises.
pub mod event_type {
    pub const CQ_ERR: u32 = 0;
    pub const QP_FATAL: u32 = 1;
    pub const QP_REQ_ERR: u32 = 2;
    pub const QP_ACCESS_ERR: u32 = 3;
    pub const COMM_EST: u32 = 4;
    pub const SRQ_LIMIT_REACHED: u32 = 15;
    pub const QP_LAST_WQE_REACHED: u32 = 16;
}

/// The write end of a context's async event pipe.
#[derive(Debug)]
pub struct AsyncSink {
    pipe: File,
}

impl AsyncSink {
    pub fn new(pipe: File) -> AsyncSink {
        AsyncSink { pipe }
    }

    /// Queues one event for `ibv_get_async_event`; `reported` counts it for the object's
    /// destroy, which waits until the application has acknowledged as many as were reported.
    pub fn raise(&self, element: u64, event_type: u32, reported: &AtomicU32) {
        // A 16-byte write to a pipe is atomic; if the application never reads its async fd and
        // the pipe fills, further events are dropped rather than blocking the data path.
        if (&self.pipe).write(&async_event_record(element, event_type)).is_ok() {
            reported.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// The write end of a completion channel.
#[derive(Debug)]
pub struct ChannelSink {
    pipe: File,
}

impl ChannelSink {
    pub fn new(pipe: File) -> ChannelSink {
        ChannelSink { pipe }
    }

    pub fn notify(&self, cq_handle: u64, reported: &AtomicU32) {
        if (&self.pipe).write(&comp_event_record(cq_handle)).is_ok() {
            reported.fetch_add(1, Ordering::AcqRel);
        }
    }
}
