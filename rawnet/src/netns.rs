//! Entering a named network namespace (`ip netns add NAME`) on the calling thread only.
//! Sockets the thread creates afterwards, and children it spawns, live in that namespace.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// Move the calling thread into `/run/netns/<name>`.
pub fn enter(name: &str) -> io::Result<()> {
    if name.contains('/') || name.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "bad namespace name"));
    }
    let f = File::open(format!("/run/netns/{name}"))
        .map_err(|e| io::Error::new(e.kind(), format!("network namespace {name}: {e}")))?;
    // SAFETY: setns(2) on a descriptor we own; it changes only this thread's namespace.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
