//! An `eventfd(2)`: how the raw-frame transport tells an epoll loop (the provider's progress
//! thread) that a stream or a listener it serves has news, as a kernel socket's readiness
//! would.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A non-blocking eventfd.
#[derive(Debug)]
pub struct EventFd(File);

impl EventFd {
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: plain eventfd(2) with flags only; the descriptor is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor nothing else owns.
        Ok(EventFd(File::from(unsafe { OwnedFd::from_raw_fd(fd) })))
    }

    /// Makes the descriptor readable (and raises an edge for an edge-triggered epoll).
    pub fn signal(&self) {
        let _ = (&self.0).write(&1u64.to_ne_bytes());
    }

    /// Makes it unreadable again (for a level-triggered waiter).
    pub fn drain(&self) {
        let mut b = [0u8; 8];
        let _ = (&self.0).read(&mut b);
    }

    pub fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}
