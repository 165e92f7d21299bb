//! What the engine needs from outside safe Rust to move payload: the application's registered
//! memory, read and written in place, and socket I/O straight from and into it (no
//! intermediate copy). The FFI layer implements [`UserMemory`].
//!
//! Every access names a [`Pinned`] range: one that the memory-region table's checks produced
//! (`super::mr::Span`, base, bounds, rights, protection domain) and that is pinned, so its
//! region cannot be deregistered while the access runs. Safe engine code cannot make up such a
//! range, which is the contract that makes the implementation sound.

use std::io;
use std::os::fd::RawFd;

pub use super::mr::Pinned;
pub use uiw_wire::crc::Crc32c;
pub use uiw_wire::rdmap::AtomicOperation;

/// One piece of an outgoing gather list.
#[derive(Debug, Clone, Copy)]
pub enum IoPart<'a> {
    /// Bytes the engine owns (headers, trailers, control messages, inline data).
    Bytes(&'a [u8]),
    /// Pinned application memory.
    User(&'a Pinned<'a>),
}

impl IoPart<'_> {
    pub fn len(&self) -> usize {
        match self {
            IoPart::Bytes(b) => b.len(),
            IoPart::User(p) => p.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Access to pinned application memory and zero-copy socket I/O.
pub trait UserMemory: Send + Sync {
    /// `readv(fd, [dst, tail])`, non-blocking: payload lands directly in application memory,
    /// and whatever follows it in the stream in `tail`. Returns the total read (0 at EOF).
    fn recv(&self, fd: RawFd, dst: &Pinned, tail: &mut [u8]) -> io::Result<usize>;
    /// `sendmsg(fd, parts, MSG_DONTWAIT | MSG_NOSIGNAL)`: returns how many bytes went out.
    fn send(&self, fd: RawFd, parts: &[IoPart<'_>]) -> io::Result<usize>;
    /// Copies `out.len()` bytes (at most `src.len()`) from application memory.
    fn read(&self, src: &Pinned, out: &mut [u8]);
    /// Updates `crc` with the first `len` bytes (at most `src.len()`) of application memory,
    /// read where they are: the MPA CRC32c (RFC 5044 §6) of a payload sent from, or received
    /// into, registered memory, with no staging copy. Bytes the application changes meanwhile
    /// (a posted buffer it must not touch) only make the CRC wrong: the peer, or this side,
    /// then fails the stream with an MPA CRC error.
    fn crc32c(&self, src: &Pinned, len: usize, crc: &mut Crc32c);
    /// Copies `data` (at most `dst.len()` bytes of it) to application memory.
    fn write(&self, dst: &Pinned, data: &[u8]);
    /// An 8-byte atomic on the first 8 bytes of `dst` (8-byte aligned, at least 8 long): RFC
    /// 7306 FetchAdd or CmpSwap with their masks (§5.1.1, §5.1.2), in native byte order,
    /// atomic with respect to every other atomic on that memory (§5.3); stores
    /// `op.apply(original)` and returns the original value.
    fn atomic(&self, dst: &Pinned, op: AtomicOperation) -> u64;
}
