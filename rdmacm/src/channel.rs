//! The event channel: a queue of events plus a file descriptor that is readable exactly
//! while events are queued, so applications can poll(2)/epoll it and set it O_NONBLOCK.
//!
//! The fd the application sees is one end of a socket pair; every queued event has one
//! token byte in it. `pop` reads a token with read(2) — which blocks or fails with EAGAIN
//! according to the flags the application set on the fd — and then takes the oldest event.
//! Events removed without being read (their id was destroyed or migrated) take a token
//! back with a non-blocking recv, so the fd does not stay readable for nothing; a reader
//! that finds a token but no event (it raced with such a removal) simply reads again.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

use crate::sys;

pub struct Channel<T> {
    /// The application's end (`rdma_event_channel.fd`).
    rfd: OwnedFd,
    /// Ours: one byte per queued event.
    wfd: OwnedFd,
    q: Mutex<VecDeque<T>>,
    /// The thread that last called `pop`: whether another thread than the one removing events
    /// may be about to read (see [`Channel::read_by_another_thread`]).
    reader: Mutex<Option<std::thread::ThreadId>>,
}

impl<T> Channel<T> {
    pub fn new() -> io::Result<Channel<T>> {
        let (rfd, wfd) = sys::socketpair()?;
        Ok(Channel {
            rfd,
            wfd,
            q: Mutex::new(VecDeque::new()),
            reader: Mutex::new(None),
        })
    }

    /// The fd to hand to the application.
    pub fn fd(&self) -> RawFd {
        self.rfd.as_raw_fd()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<T>> {
        self.q.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queue an event and make the fd readable.
    pub fn push(&self, ev: T) {
        let mut q = self.lock();
        q.push_back(ev);
        // A full socket buffer (hundreds of thousands of unread events) would lose the
        // token; the reader then still finds the event on its next wakeup.
        let _ = sys::send(self.wfd.as_raw_fd(), &[1]);
    }

    /// The next event: blocks while none is queued, unless the application made the fd
    /// non-blocking (then `EAGAIN`). A signal interrupting the wait gives `EINTR`.
    pub fn pop(&self) -> io::Result<T> {
        *self.reader.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::thread::current().id());
        loop {
            let mut b = [0u8; 1];
            match sys::read(self.rfd.as_raw_fd(), &mut b) {
                Ok(1) => {}
                Ok(_) => return Err(io::Error::from_raw_os_error(libc::EIO)),
                Err(e) => return Err(e),
            }
            if let Some(ev) = self.lock().pop_front() {
                return Ok(ev);
            }
        }
    }

    /// Whether some queued event matches `pred`.
    pub fn any(&self, pred: impl FnMut(&T) -> bool) -> bool {
        self.lock().iter().any(pred)
    }

    /// Whether the last reader of this channel was a thread other than the caller: an
    /// application with a thread of its own for events, which may have seen the fd readable
    /// and be on its way to `pop`.
    pub fn read_by_another_thread(&self) -> bool {
        let r = *self.reader.lock().unwrap_or_else(|e| e.into_inner());
        r.is_some_and(|t| t != std::thread::current().id())
    }

    /// Remove (and return) every queued event `pred` selects, taking their tokens back.
    pub fn remove_where(&self, mut pred: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut q = self.lock();
        let mut out = Vec::new();
        let mut keep = VecDeque::with_capacity(q.len());
        for ev in q.drain(..) {
            if pred(&ev) {
                out.push(ev);
            } else {
                keep.push_back(ev);
            }
        }
        *q = keep;
        for _ in 0..out.len() {
            let mut b = [0u8; 1];
            if sys::recv_dontwait(self.rfd.as_raw_fd(), &mut b).is_err() {
                break; // a reader already holds it: it will find the queue shorter
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn readable(fd: RawFd) -> bool {
        sys::poll1(fd, libc::POLLIN, 0).unwrap() & libc::POLLIN != 0
    }

    #[test]
    fn fd_is_readable_exactly_while_events_are_queued() {
        let c: Channel<u32> = Channel::new().unwrap();
        assert!(c.fd() > 2);
        assert!(!readable(c.fd()));
        c.push(1);
        c.push(2);
        assert!(readable(c.fd()));
        assert_eq!(c.pop().unwrap(), 1);
        assert!(readable(c.fd()));
        assert_eq!(c.pop().unwrap(), 2);
        assert!(!readable(c.fd()));
    }

    #[test]
    fn nonblocking_fd_gives_eagain() {
        let c: Channel<u32> = Channel::new().unwrap();
        sys::set_nonblocking(&c.rfd, true).unwrap();
        assert_eq!(c.pop().unwrap_err().raw_os_error(), Some(libc::EAGAIN));
        c.push(7);
        assert_eq!(c.pop().unwrap(), 7);
        assert_eq!(c.pop().unwrap_err().raw_os_error(), Some(libc::EAGAIN));
    }

    #[test]
    fn knows_whether_another_thread_reads() {
        let c: Arc<Channel<u32>> = Arc::new(Channel::new().unwrap());
        assert!(!c.read_by_another_thread(), "nobody read yet");
        c.push(1);
        assert_eq!(c.pop().unwrap(), 1);
        assert!(!c.read_by_another_thread(), "this thread is the reader");
        c.push(2);
        let r = c.clone();
        std::thread::spawn(move || r.pop().unwrap()).join().unwrap();
        assert!(c.read_by_another_thread());
        c.push(3);
        assert!(c.any(|&v| v == 3) && !c.any(|&v| v == 2));
    }

    #[test]
    fn removed_events_take_their_tokens() {
        let c: Channel<u32> = Channel::new().unwrap();
        for i in 0..5 {
            c.push(i);
        }
        assert_eq!(c.remove_where(|v| v % 2 == 0), vec![0, 2, 4]);
        assert_eq!(c.pop().unwrap(), 1);
        assert_eq!(c.pop().unwrap(), 3);
        assert!(!readable(c.fd()));
    }

    #[test]
    fn blocking_pop_wakes_on_push() {
        let c: Arc<Channel<u32>> = Arc::new(Channel::new().unwrap());
        let c2 = c.clone();
        let t = std::thread::spawn(move || c2.pop().unwrap());
        std::thread::sleep(std::time::Duration::from_millis(50));
        c.push(42);
        assert_eq!(t.join().unwrap(), 42);
    }
}
