//! Event delivery through file descriptors libibverbs reads, in the kernel's record formats:
//! async events (`ibv_get_async_event`, 16-byte `ib_uverbs_async_event_desc`) and completion
//! events (`ibv_get_cq_event`, 8-byte `ib_uverbs_comp_event_desc`). The engine only writes
//! whole records to pipes it owns; opening them is the FFI layer's job.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU32, Ordering};

use parking_lot::Mutex;
use uiw_kabi::sys::recv_dontwait;

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

/// An event queue libibverbs reads: a socket pair whose far end is the application's fd
/// (`async_fd`, or a completion channel's fd). The engine keeps a second descriptor of that far
/// end, so that destroying an object can take back its events the application never read: the
/// kernel counts an event as reported only once it is read, and the destroy waits for exactly
/// those to be acknowledged. Every record starts with the object's handle (u64).
#[derive(Debug)]
pub struct EventQueue {
    tx: Mutex<UnixStream>,
    unread: UnixStream,
    record: usize,
}

/// Async events: 16-byte `ib_uverbs_async_event_desc` records.
pub type AsyncSink = EventQueue;
/// Completion events: 8-byte `ib_uverbs_comp_event_desc` records.
pub type ChannelSink = EventQueue;

impl EventQueue {
    /// `tx` is our end; `unread` another descriptor of the application's end.
    pub fn new(tx: UnixStream, unread: UnixStream, record: usize) -> EventQueue {
        let _ = tx.set_nonblocking(true);
        EventQueue { tx: Mutex::new(tx), unread, record }
    }

    fn push(&self, rec: &[u8], reported: &AtomicU32) {
        // If the application never reads its fd and the queue fills, further events are dropped
        // rather than blocking the data path.
        if self.tx.lock().write_all(rec).is_ok() {
            reported.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Queues one event for `ibv_get_async_event`; `reported` counts it.
    pub fn raise(&self, element: u64, event_type: u32, reported: &AtomicU32) {
        self.push(&async_event_record(element, event_type), reported);
    }

    /// Queues one completion event for `ibv_get_cq_event`.
    pub fn notify(&self, cq_handle: u64, reported: &AtomicU32) {
        self.push(&comp_event_record(cq_handle), reported);
    }

    /// Destroying `element`: removes its unread events from the queue (keeping the others in
    /// order) and returns how many of its events the application did read — the count its
    /// destroy must wait to see acknowledged.
    pub fn settle(&self, element: u64, reported: &AtomicU32) -> u32 {
        let tx = self.tx.lock();
        let mut queued = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = recv_dontwait(&self.unread, &mut buf) {
            if n == 0 {
                break;
            }
            queued.extend_from_slice(&buf[..n]);
        }
        let mut withdrawn = 0;
        let mut keep = Vec::with_capacity(queued.len());
        for rec in queued.chunks(self.record) {
            if rec.len() == self.record && u64::from_ne_bytes(rec[..8].try_into().unwrap()) == element {
                withdrawn += 1;
            } else {
                keep.extend_from_slice(rec);
            }
        }
        let _ = (&*tx).write_all(&keep);
        let n = reported.load(Ordering::Acquire).saturating_sub(withdrawn);
        reported.store(n, Ordering::Release);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn settle_takes_back_only_the_unread_events_of_one_object() {
        let (app, ours) = UnixStream::pair().unwrap();
        let q = EventQueue::new(ours, app.try_clone().unwrap(), 16);
        let (ra, rb) = (AtomicU32::new(0), AtomicU32::new(0));
        q.raise(0xa, 1, &ra);
        q.raise(0xb, 1, &rb);
        let mut rec = [0u8; 16];
        (&app).read_exact(&mut rec).unwrap(); // the application reads A's first event
        q.raise(0xa, 2, &ra);
        q.raise(0xb, 2, &rb);
        assert_eq!(q.settle(0xa, &ra), 1, "A: one read, one withdrawn");
        (&app).read_exact(&mut rec).unwrap();
        assert_eq!(u64::from_ne_bytes(rec[..8].try_into().unwrap()), 0xb);
        (&app).read_exact(&mut rec).unwrap();
        assert_eq!((u64::from_ne_bytes(rec[..8].try_into().unwrap()), rec[8]), (0xb, 2));
        assert_eq!(q.settle(0xb, &rb), 2);
    }
}
