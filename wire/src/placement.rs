//! Placement: where received payload goes and where transmitted payload
//! comes from, plus the caller-implemented memory checks.
//!
//! The core never holds pointers. Inbound tagged segments (Write, Read
//! Response) are checked through [`Memory::check_tagged`] (RFC 5041 §7.2
//! tagged buffer errors: invalid STag, base/bounds, STag not associated, TO
//! wrap; access rights as RFC 5040 §7.1 adds) and then placed at
//! `(STag, TO)`; untagged Sends go into a posted receive at `(wr_id,
//! offset)`. On transmit, payload is read from the posting work request
//! (`wr_id`, offset) or, for Read Responses, from a local STag.

use crate::error::TaggedError;
use crate::rdmap::AtomicOperation;

/// Access a tagged check is made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Our own sink buffer of an RDMA Read (Read Response placement).
    LocalWrite,
    /// Peer writes into our memory (RDMA Write).
    RemoteWrite,
    /// Peer reads our memory (Read Request data source).
    RemoteRead,
    /// Peer atomically updates our memory (RFC 7306).
    RemoteAtomic,
}

/// Destination of received payload bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Put the bytes at tagged offset `to` of the region named by `stag`
    /// (already checked with [`Memory::check_tagged`]).
    Tagged { stag: u32, to: u64 },
    /// Put the bytes at byte `offset` of posted receive `wr_id`'s buffers.
    Recv { wr_id: u64, offset: u32 },
    /// Drop the bytes (P2P RTR, or input after an error).
    Discard,
}

impl Placement {
    /// The placement `n` bytes further on.
    pub fn advance(self, n: u32) -> Placement {
        match self {
            Placement::Tagged { stag, to } => Placement::Tagged {
                stag,
                to: to.wrapping_add(n as u64),
            },
            Placement::Recv { wr_id, offset } => Placement::Recv {
                wr_id,
                offset: offset + n,
            },
            Placement::Discard => Placement::Discard,
        }
    }
}

/// Source of transmitted payload bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Byte `offset` of the gather list of posted work request `wr_id`.
    Wr { wr_id: u64, offset: u32 },
    /// Local memory named by `stag` at tagged offset `to` (Read Responses).
    Tagged { stag: u32, to: u64 },
    /// No payload.
    None,
}

impl Source {
    pub fn advance(self, n: u32) -> Source {
        match self {
            Source::Wr { wr_id, offset } => Source::Wr {
                wr_id,
                offset: offset + n,
            },
            Source::Tagged { stag, to } => Source::Tagged {
                stag,
                to: to.wrapping_add(n as u64),
            },
            Source::None => Source::None,
        }
    }
}

/// Memory-region checks the engine implements (memory registration,
/// protection domains and rights live there, not in the core).
pub trait Memory {
    /// Check that `len` bytes at `(stag, to)` may be accessed as `access`.
    /// For [`Access::RemoteAtomic`] that includes the 64-bit alignment of the
    /// buffer address (RFC 7306 §5.2.1, §8.2): [`TaggedError::Misaligned`].
    fn check_tagged(&self, stag: u32, to: u64, len: u32, access: Access)
        -> Result<(), TaggedError>;

    /// Invalidate `stag` (Send with Invalidate, RFC 5040 §5.2). Default: not
    /// supported → the STag "cannot be invalidated".
    fn invalidate(&mut self, stag: u32) -> Result<(), TaggedError> {
        let _ = stag;
        Err(TaggedError::InvalidStag)
    }

    /// Perform an RFC 7306 atomic on the 8 bytes at `(stag, to)` (already
    /// checked) and return the original value: store `op.apply(original)`
    /// atomically with respect to every other atomic on that memory (§5.3),
    /// masks included (§5.1.1, §5.1.2), in the memory's own byte order (§5.1.1).
    /// An error (the region went away since the check) answers the Atomic
    /// Request with a Terminate (RFC 5040 §7.2), never a made-up value.
    /// Default: refuses (`InvalidStag`) — engines that never negotiate
    /// extensions need not care.
    fn atomic(&mut self, stag: u32, to: u64, op: AtomicOperation) -> Result<u64, TaggedError> {
        let _ = (stag, to, op);
        Err(TaggedError::InvalidStag)
    }
}

/// Byte movement for the copying convenience API
/// ([`crate::conn::Connection::handle_bytes`] /
/// [`crate::conn::Connection::poll_transmit`]); the zero-copy API needs
/// only [`Memory`].
pub trait MemoryIo: Memory {
    /// Copy `out.len()` payload bytes from `src`.
    fn read(&self, src: Source, out: &mut [u8]);
    /// Store `data` at `dst`.
    fn write(&mut self, dst: Placement, data: &[u8]);
}
