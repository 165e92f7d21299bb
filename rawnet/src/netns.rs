//! Entering a named network namespace (`ip netns add NAME`) on the calling thread only.
//! Sockets the thread creates afterwards, and children it spawns, live in that namespace.

use std::fs::File;
use std::io;

/// Move the calling thread into `/run/netns/<name>`.
pub fn enter(name: &str) -> io::Result<()> {
    if name.contains('/') || name.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "bad namespace name"));
    }
    let f = File::open(format!("/run/netns/{name}"))
        .map_err(|e| io::Error::new(e.kind(), format!("network namespace {name}: {e}")))?;
    uiw_kabi::raw::enter_netns(&f)
}
