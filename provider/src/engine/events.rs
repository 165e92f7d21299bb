//! Event delivery through file descriptors libibverbs reads, in the kernel's record formats:
//! async events (`ibv_get_async_event`, 16-byte `ib_uverbs_async_event_desc`) and completion
//! events (`ibv_get_cq_event`, 8-byte `ib_uverbs_comp_event_desc`). The engine only writes
//! whole records to pipes it owns; opening them is the FFI layer's job.

use std::io::Write;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU32, Ordering};

use parking_lot::Mutex;
use uiw_kabi::sys::{recv_dontwait, Epoll, EPOLL_IN};

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
    /// A completion channel's: what a thread blocked in `read()` of the channel waits on
    /// (see [`EventQueue::wait_fd`]).
    waiters: Option<Epoll>,
    /// The streams in `waiters` (socket, QP number).
    watched: Mutex<Vec<(RawFd, u32)>>,
}

/// The wait set's token for the channel itself (QP streams report their QP number).
const CHANNEL_TOKEN: u64 = u64::MAX;

/// A completion event record (`ib_uverbs_comp_event_desc`: the CQ's handle).
pub type CompEvent = [u8; 8];

thread_local! {
    /// While this thread serves the QPs of the channel it reads ([`EventQueue::serve_ready`]):
    /// that channel (its address) and the first completion event its serving raised, which
    /// goes straight to the reader instead of through the queue's socket and back.
    static HANDOFF: std::cell::Cell<(usize, Option<CompEvent>)> = const { std::cell::Cell::new((0, None)) };
}

/// `EPOLLIN | EPOLLRDHUP | EPOLLET`: a stream's arrivals, each once.
const STREAM_INPUT: u32 = (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLET) as u32;

/// Async events: 16-byte `ib_uverbs_async_event_desc` records.
pub type AsyncSink = EventQueue;
/// Completion events: 8-byte `ib_uverbs_comp_event_desc` records.
pub type ChannelSink = EventQueue;

impl EventQueue {
    /// `tx` is our end; `unread` another descriptor of the application's end.
    pub fn new(tx: UnixStream, unread: UnixStream, record: usize) -> EventQueue {
        let _ = tx.set_nonblocking(true);
        EventQueue { tx: Mutex::new(tx), unread, record, waiters: None, watched: Mutex::new(Vec::new()) }
    }

    /// A completion channel's queue (8-byte records), with the wait set a reader of the
    /// channel sleeps on: the application's end (readable while events wait) and the streams
    /// of the QPs whose CQs complete into the channel ([`EventQueue::watch_stream`]).
    pub fn channel(tx: UnixStream, unread: UnixStream) -> EventQueue {
        let mut q = EventQueue::new(tx, unread, 8);
        q.waiters = Epoll::new().ok().filter(|e| e.add(q.unread.as_raw_fd(), CHANNEL_TOKEN, EPOLL_IN).is_ok());
        q
    }

    /// A reader of this channel is woken by the arrivals on `fd`, the stream of QP `qpn`
    /// (one of whose CQs completes into the channel). Watching a stream twice is harmless.
    pub fn watch_stream(&self, fd: RawFd, qpn: u32) {
        if let Some(w) = &self.waiters {
            if w.add(fd, u64::from(qpn), STREAM_INPUT).is_ok() {
                self.watched.lock().push((fd, qpn));
            }
        }
    }

    /// The stream on `fd` no longer wakes readers of this channel.
    pub fn unwatch_stream(&self, fd: RawFd) {
        if let Some(w) = &self.waiters {
            let _ = w.delete(fd);
            self.watched.lock().retain(|&(f, _)| f != fd);
        }
    }

    /// The QPs whose streams wake a reader of this channel.
    pub fn watched_qps(&self) -> smallvec::SmallVec<[u32; 4]> {
        self.watched.lock().iter().map(|&(_, q)| q).collect()
    }

    /// The descriptor a thread reading this channel (`ibv_get_cq_event`) that found no event
    /// sleeps on (with `poll`, in the launcher's shim: see `ffi::read_channel`): readable once
    /// an event is queued or one of the channel's QP streams has input. `None` for a queue
    /// that is not a channel's (or whose wait set could not be made).
    pub fn wait_fd(&self) -> Option<RawFd> {
        self.waiters.as_ref().map(|w| w.as_raw_fd())
    }

    /// After the reader's sleep on [`EventQueue::wait_fd`] ended: serves, right here
    /// (`serve(qpn)`), the QPs whose streams woke it — their completions then notify the
    /// channel from this thread. While the reader sleeps the progress thread does not watch
    /// those streams (the sleep holds their QPs: see `lease`), so the arrival wakes this thread
    /// alone: one wake-up per message, as a blocking `recv` has (`ib_send_lat -e`: 32.5-37.9 µs
    /// typical half round trip, against 47.2-48.7 with the progress thread waking the reader
    /// second; a blocking TCP ping-pong 26-28). Never blocks.
    ///
    /// The first completion event the serving raises for this channel is returned rather than
    /// queued (counted as reported), for the reader to return: two system calls fewer per
    /// message than a trip through the queue's socket and back. Other events queue as ever.
    pub fn serve_ready(&self, serve: &mut dyn FnMut(u32)) -> Option<CompEvent> {
        let w = self.waiters.as_ref()?;
        let mut evs = Vec::new();
        if w.wait_for(&mut evs, Some(std::time::Duration::ZERO)).is_err() {
            return None;
        }
        /// Ends the hand-off however serving ends: an event raised later on this thread goes
        /// through the queue, and one raised by a serving that panicked (caught at the FFI
        /// edge) joins it.
        struct HandOff<'a>(&'a EventQueue);
        impl Drop for HandOff<'_> {
            fn drop(&mut self) {
                if let (_, Some(rec)) = HANDOFF.with(|h| h.replace((0, None))) {
                    self.0.requeue(&rec);
                }
            }
        }
        HANDOFF.with(|h| h.set((self as *const EventQueue as usize, None)));
        let _end = HandOff(self);
        for (tok, _) in evs {
            if tok != CHANNEL_TOKEN {
                serve(tok as u32);
            }
        }
        HANDOFF.with(|h| h.replace((0, None))).1
    }

    /// An event [`EventQueue::serve_ready`] returned that its reader could not take (a read
    /// shorter than a record): it joins the queue, already counted as reported.
    pub fn requeue(&self, rec: &CompEvent) {
        let _ = self.tx.lock().write_all(rec);
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
        let rec = comp_event_record(cq_handle);
        let me = self as *const EventQueue as usize;
        let handed = HANDOFF.with(|h| match h.get() {
            (q, None) if q == me => {
                h.set((q, Some(rec)));
                true
            }
            _ => false,
        });
        if handed {
            reported.fetch_add(1, Ordering::AcqRel);
            return;
        }
        self.push(&rec, reported);
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

    /// Whether `fd` becomes readable within `ms` (the reader's sleep, as the shim polls).
    fn readable_within(fd: RawFd, ms: u64) -> bool {
        let e = Epoll::new().unwrap();
        e.add(fd, 1, EPOLL_IN).unwrap();
        let mut evs = Vec::new();
        e.wait_for(&mut evs, Some(std::time::Duration::from_millis(ms))).unwrap() > 0
    }

    /// A reader of a completion channel sleeps on its wait descriptor until a watched stream
    /// has input (then serves that stream's QP) or an event is queued; a stream no longer
    /// watched wakes nobody.
    #[test]
    fn a_channel_reader_wakes_for_its_streams_and_its_events() {
        let (app, ours) = UnixStream::pair().unwrap();
        let ch = EventQueue::channel(ours, app.try_clone().unwrap());
        let wait = ch.wait_fd().expect("a channel has a wait descriptor");
        let (mut peer, stream) = UnixStream::pair().unwrap();
        ch.watch_stream(stream.as_raw_fd(), 7);
        ch.watch_stream(stream.as_raw_fd(), 7); // twice: harmless
        assert_eq!(ch.watched_qps().as_slice(), &[7], "a sleeping reader holds each watched QP once");
        let mut served = Vec::new();
        assert!(!readable_within(wait, 20), "nothing came yet");
        ch.serve_ready(&mut |q| served.push(q));
        assert!(served.is_empty());

        peer.write_all(b"FPDU").unwrap();
        assert!(readable_within(wait, 1000), "the stream's input wakes the reader");
        ch.serve_ready(&mut |q| served.push(q));
        assert_eq!(served, vec![7], "the stream's QP is served by the reader");
        assert!(!readable_within(wait, 20), "each arrival wakes once");

        // An event queued (by whichever thread completed into the CQ) wakes it too, and
        // serves nothing; it stays readable until the application reads it.
        let reported = AtomicU32::new(0);
        ch.notify(0x5, &reported);
        assert!(readable_within(wait, 1000));
        ch.serve_ready(&mut |q| served.push(q));
        assert_eq!(served, vec![7]);
        assert!(readable_within(wait, 20), "an unread event keeps the reader awake");
        let mut rec = [0u8; 8];
        (&app).read_exact(&mut rec).unwrap();
        assert_eq!(u64::from_ne_bytes(rec), 0x5);
        assert!(!readable_within(wait, 20));

        // Unwatched, the stream's input wakes nobody.
        ch.unwatch_stream(stream.as_raw_fd());
        assert!(ch.watched_qps().is_empty());
        peer.write_all(b"more").unwrap();
        assert!(!readable_within(wait, 50), "an unwatched stream woke the reader");
    }

    /// The first event a reader's serving raises for its own channel comes back to it
    /// directly, counted as reported; later ones, another channel's, and those raised outside
    /// a serving are queued.
    #[test]
    fn a_reader_takes_the_first_event_its_serving_raised() {
        let (app, ours) = UnixStream::pair().unwrap();
        let ch = EventQueue::channel(ours, app.try_clone().unwrap());
        let (app2, ours2) = UnixStream::pair().unwrap();
        let other = EventQueue::channel(ours2, app2.try_clone().unwrap());
        let (mut peer, stream) = UnixStream::pair().unwrap();
        ch.watch_stream(stream.as_raw_fd(), 7);
        peer.write_all(b"FPDU").unwrap();
        let reported = AtomicU32::new(0);
        let got = ch.serve_ready(&mut |q| {
            assert_eq!(q, 7);
            ch.notify(0x11, &reported);
            other.notify(0x22, &reported);
            ch.notify(0x33, &reported);
        });
        assert_eq!(got, Some(comp_event_record(0x11)), "the first event was not handed to the reader");
        assert_eq!(reported.load(Ordering::Acquire), 3, "every event counts as reported");
        let mut rec = [0u8; 8];
        (&app).read_exact(&mut rec).unwrap();
        assert_eq!(u64::from_ne_bytes(rec), 0x33, "a second event of the serving is queued");
        (&app2).read_exact(&mut rec).unwrap();
        assert_eq!(u64::from_ne_bytes(rec), 0x22, "another channel's event is queued on it");
        // Outside a serving, events queue.
        ch.notify(0x44, &reported);
        (&app).read_exact(&mut rec).unwrap();
        assert_eq!(u64::from_ne_bytes(rec), 0x44);
        // A serving that panics leaves no hand-off behind, and its event is queued.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            peer.write_all(b"more").unwrap();
            ch.serve_ready(&mut |_| {
                ch.notify(0x55, &reported);
                panic!("a serving that fails");
            })
        }));
        assert!(r.is_err());
        (&app).read_exact(&mut rec).unwrap();
        assert_eq!(u64::from_ne_bytes(rec), 0x55, "the panicking serving's event was lost");
        ch.notify(0x66, &reported);
        (&app).read_exact(&mut rec).unwrap();
        assert_eq!(u64::from_ne_bytes(rec), 0x66, "a hand-off outlived the serving");
    }

    #[test]
    fn an_async_queue_has_no_wait_set() {
        let (app, ours) = UnixStream::pair().unwrap();
        let q = EventQueue::new(ours, app.try_clone().unwrap(), 16);
        assert_eq!(q.wait_fd(), None);
        q.serve_ready(&mut |_| panic!("nothing to serve"));
    }
}
