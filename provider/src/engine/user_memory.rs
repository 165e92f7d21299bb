//! What the engine needs from outside safe Rust to move payload: the application's registered
//! memory, read and written at raw addresses, and socket I/O straight from and into it (no
//! intermediate copy). The FFI layer implements [`UserMemory`]; the engine only ever passes ranges it
//! has checked against a registered memory region (or its own buffers), which is the contract
//! that makes the implementation sound.

use std::io;
use std::os::fd::RawFd;

pub use uiw_wire::rdmap::AtomicOp;

/// One piece of an outgoing gather list.
#[derive(Debug, Clone, Copy)]
pub enum IoPart<'a> {
    /// Bytes the engine owns (headers, trailers, control messages, inline data).
    Bytes(&'a [u8]),
    /// `len` bytes of application memory at `addr`, inside a registered region.
    User { addr: u64, len: usize },
}

impl IoPart<'_> {
    pub fn len(&self) -> usize {
        match self {
            IoPart::Bytes(b) => b.len(),
            IoPart::User { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Access to registered application memory and zero-copy socket I/O.
pub trait UserMemory: Send + Sync {
    /// `readv(fd, [addr..addr+len, tail])`, non-blocking: payload lands directly in application
    /// memory, and whatever follows it in the stream in `tail`. Returns the total read (0 at EOF).
    fn recv(&self, fd: RawFd, addr: u64, len: usize, tail: &mut [u8]) -> io::Result<usize>;
    /// `sendmsg(fd, parts, MSG_DONTWAIT | MSG_NOSIGNAL)`: returns how many bytes went out.
    fn send(&self, fd: RawFd, parts: &[IoPart<'_>]) -> io::Result<usize>;
    /// Copies `out.len()` bytes from application memory at `addr`.
    fn read(&self, addr: u64, out: &mut [u8]);
    /// Copies `data` to application memory at `addr`.
    fn write(&self, addr: u64, data: &[u8]);
    /// An 8-byte atomic on application memory at `addr` (8-byte aligned): RFC 7306 Fetch and
    /// Add or Compare and Swap; returns the original value.
    fn atomic(&self, addr: u64, op: AtomicOp, add_swap: u64, compare: u64) -> u64;
}
