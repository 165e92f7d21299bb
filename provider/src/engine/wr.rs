//! Work requests as the engine keeps them once posted: copied out of the caller's
//! `ibv_send_wr`/`ibv_recv_wr` chains (so the application may reuse its structs at once), and
//! checked the way a kernel provider checks them at post time.

use super::cq::{wc_opcode, wc_status, Completion};

/// `enum ibv_wr_opcode`.
pub mod opcode {
    pub const RDMA_WRITE: u32 = 0;
    pub const RDMA_WRITE_WITH_IMM: u32 = 1;
    pub const SEND: u32 = 2;
    pub const SEND_WITH_IMM: u32 = 3;
    pub const RDMA_READ: u32 = 4;
    pub const ATOMIC_CMP_AND_SWP: u32 = 5;
    pub const ATOMIC_FETCH_AND_ADD: u32 = 6;
    pub const LOCAL_INV: u32 = 7;
    pub const BIND_MW: u32 = 8;
    pub const SEND_WITH_INV: u32 = 9;
}

/// `enum ibv_send_flags`.
pub mod send_flags {
    pub const FENCE: u32 = 1;
    pub const SIGNALED: u32 = 1 << 1;
    pub const SOLICITED: u32 = 1 << 2;
    pub const INLINE: u32 = 1 << 3;
}

/// A scatter/gather element: `ibv_sge`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// A WR's scatter/gather list. Most name one or two elements: kept inline, a posted WR costs
/// no allocation for it (a heap list for each WR was a `malloc` and a `free` per receive and
/// per send on an SPDK target's reactor).
pub type SgeList = smallvec::SmallVec<[Sge; 2]>;

/// An `IBV_SEND_INLINE` payload: the short ones (perftest's latency tests, libfabric's small
/// messages) are kept in the WR itself, without an allocation.
pub type InlineBytes = smallvec::SmallVec<[u8; 64]>;

/// Where a send WR's payload comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// Gathered from registered memory at transmit time.
    Sges(SgeList),
    /// `IBV_SEND_INLINE`: copied at post time, no lkey needed.
    Inline(InlineBytes),
}

impl Payload {
    pub fn len(&self) -> u64 {
        match self {
            // One or two SGEs (nearly every WR, and what the list holds inline) are added up
            // without a loop: asked twice per posted WR, the loop was 4 % of an NVMe-oF
            // target's provider instructions.
            Payload::Sges(s) => match s.as_slice() {
                [a] => u64::from(a.length),
                [a, b] => u64::from(a.length) + u64::from(b.length),
                s => s.iter().map(|s| u64::from(s.length)).sum(),
            },
            Payload::Inline(b) => b.len() as u64,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A posted send-queue WR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWqe {
    pub wr_id: u64,
    pub opcode: u32,
    pub flags: u32,
    pub payload: Payload,
    pub remote_addr: u64,
    pub rkey: u32,
    /// Immediate data (network order) or the rkey to invalidate.
    pub imm_or_inv: u32,
    pub compare_add: u64,
    pub swap: u64,
}

/// A posted receive WR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWqe {
    pub wr_id: u64,
    pub sges: SgeList,
}

impl SendWqe {
    /// The `ibv_wc_opcode` this WR completes with.
    pub fn wc_opcode(&self) -> u32 {
        match self.opcode {
            opcode::RDMA_WRITE | opcode::RDMA_WRITE_WITH_IMM => wc_opcode::RDMA_WRITE,
            opcode::RDMA_READ => wc_opcode::RDMA_READ,
            opcode::ATOMIC_CMP_AND_SWP => wc_opcode::COMP_SWAP,
            opcode::ATOMIC_FETCH_AND_ADD => wc_opcode::FETCH_ADD,
            opcode::LOCAL_INV => wc_opcode::LOCAL_INV,
            opcode::BIND_MW => wc_opcode::BIND_MW,
            _ => wc_opcode::SEND,
        }
    }

    /// The completion a flushed WR gets (`IBV_WC_WR_FLUSH_ERR`).
    pub fn flushed(&self, qp_num: u32) -> Completion {
        Completion { wr_id: self.wr_id, status: wc_status::WR_FLUSH_ERR, opcode: self.wc_opcode(), qp_num, ..Default::default() }
    }
}

impl RecvWqe {
    pub fn flushed(&self, qp_num: u32) -> Completion {
        Completion { wr_id: self.wr_id, status: wc_status::WR_FLUSH_ERR, opcode: wc_opcode::RECV, qp_num, ..Default::default() }
    }
}

/// Why a WR was refused at post time (the caller gets `*bad_wr` and this errno).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostError {
    /// More SGEs than the queue was created with: EINVAL.
    TooManySges,
    /// Inline payload larger than `max_inline_data`: EINVAL.
    InlineTooLong,
    /// The queue is full: ENOMEM (as the kernel's providers return).
    QueueFull,
    /// The QP is in a state that does not accept this WR: EINVAL.
    BadState,
    /// An opcode uiw does not implement or the peer did not negotiate: EOPNOTSUPP / EINVAL.
    Unsupported,
    /// An opcode value libibverbs does not define: EINVAL.
    BadOpcode,
}


#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_opcodes_follow_the_wr() {
        let mut w = SendWqe {
            wr_id: 9,
            opcode: opcode::RDMA_WRITE_WITH_IMM,
            flags: 0,
            payload: Payload::Inline(smallvec::smallvec![1, 2, 3]),
            remote_addr: 0,
            rkey: 0,
            imm_or_inv: 0,
            compare_add: 0,
            swap: 0,
        };
        assert_eq!(w.wc_opcode(), wc_opcode::RDMA_WRITE);
        w.opcode = opcode::SEND_WITH_INV;
        assert_eq!(w.wc_opcode(), wc_opcode::SEND);
        let f = w.flushed(5);
        assert_eq!((f.wr_id, f.status, f.qp_num), (9, wc_status::WR_FLUSH_ERR, 5));
        assert_eq!(w.payload.len(), 3);
        assert_eq!(Payload::Sges(smallvec::smallvec![Sge { addr: 0, length: 7, lkey: 1 }, Sge { addr: 0, length: 5, lkey: 1 }]).len(), 12);
    }

    #[test]
    fn a_payload_is_as_long_as_its_sges_together() {
        let sge = |length| Sge { addr: 0, length, lkey: 1 };
        let len = |v: &[u32]| Payload::Sges(v.iter().map(|&n| sge(n)).collect()).len();
        assert_eq!(len(&[]), 0);
        assert_eq!(len(&[9]), 9);
        assert_eq!(len(&[u32::MAX, 2]), u64::from(u32::MAX) + 2, "added in 64 bits");
        assert_eq!(len(&[1, 2, 3, 4]), 10);
        assert_eq!(len(&[u32::MAX; 3]), 3 * u64::from(u32::MAX));
    }
}
