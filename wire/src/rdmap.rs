//! RDMAP headers (RFC 5040 §4) and the RFC 7306 extensions.
//!
//! * control byte (§4.2): RV(2) = 1, reserved(2), opcode(4);
//! * Read Request header (§4.4): sink STag, sink TO, read size, source STag,
//!   source TO (28 bytes after the untagged DDP header, QN 1);
//! * Terminate (§4.8): Terminate Control (layer 4 bits, etype 4 bits,
//!   error code 8 bits, M/D/R header-control bits, 13 reserved bits), then
//!   DDP Segment Length (16 bits) and the echoed DDP header when D is set, and
//!   the echoed RDMAP (Read Request) header when R is set (QN 2);
//! * RFC 7306 (checked against its text, see wire/README.md "RFC 7306"):
//!   opcodes 0x8 Immediate Data, 0x9 Immediate Data with SE, 0xA Atomic
//!   Request, 0xB Atomic Response (§4.1 Figure 2, §10); Immediate Data is 8
//!   bytes after the untagged DDP header on QN 0 (§6.2, §6.3); the Atomic
//!   Request header (52 bytes, §5.2.1 Figure 4) goes on QN 1 beside the Read
//!   Requests, the Atomic Response header (12 bytes, §5.2.2 Figure 6) on QN 3
//!   (§5.2). Write with Immediate is a Write followed by an Immediate Data
//!   message (§1, §6). Used only between uiw peers that negotiated them
//!   (`mpa::FLAG_UIW_EXT`/`FLAG_UIW_EXT_ACK`); siw implements none of it.
//!
//! siw lays out its Terminate Control wrongly on little-endian hosts (layer
//! and error type swapped inside byte 0, M/D/R in the *low* bits of byte 2),
//! see `captures/README.md`. [`Terminate::parse`] accepts both layouts and
//! reports which one it saw; [`Terminate::encode`] always emits RFC 5040.

use crate::error::{TermCode, WireError};

pub const RDMAP_VERSION: u8 = 1;
pub const READ_REQ_LEN: usize = 28;
/// Atomic Request header after the untagged DDP header (RFC 7306 §5.2.1 Figure 4).
pub const ATOMIC_REQ_LEN: usize = 52;
/// Atomic Response header (RFC 7306 §5.2.2 Figure 6).
pub const ATOMIC_RESP_LEN: usize = 12;
/// Immediate Data: exactly 8 bytes after the DDP header (RFC 7306 §6.2 Figure 7, §6.3).
pub const IMMEDIATE_LEN: usize = 8;
/// Terminate Control word + DDP segment length.
pub const TERM_FIXED_LEN: usize = 6;

/// RDMAP opcodes (RFC 5040 §4.3; RFC 7306 §4.1 Figure 2 and §10 add 0x8–0xB).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    Write = 0,
    ReadRequest = 1,
    ReadResponse = 2,
    Send = 3,
    SendInv = 4,
    SendSe = 5,
    SendSeInv = 6,
    Terminate = 7,
    ImmediateData = 8,
    ImmediateDataSe = 9,
    AtomicRequest = 10,
    AtomicResponse = 11,
}

impl Opcode {
    pub fn from_u8(v: u8) -> Option<Opcode> {
        use Opcode::*;
        Some(match v {
            0 => Write,
            1 => ReadRequest,
            2 => ReadResponse,
            3 => Send,
            4 => SendInv,
            5 => SendSe,
            6 => SendSeInv,
            7 => Terminate,
            8 => ImmediateData,
            9 => ImmediateDataSe,
            10 => AtomicRequest,
            11 => AtomicResponse,
            _ => return None,
        })
    }

    /// Uses the tagged buffer model (RFC 5040 §4.3 table).
    pub fn is_tagged(self) -> bool {
        matches!(self, Opcode::Write | Opcode::ReadResponse)
    }

    /// Untagged queue number this opcode travels on.
    pub fn queue(self) -> Option<u32> {
        use crate::ddp::qn;
        match self {
            Opcode::Send | Opcode::SendInv | Opcode::SendSe | Opcode::SendSeInv => Some(qn::SEND),
            Opcode::ImmediateData | Opcode::ImmediateDataSe => Some(qn::SEND),
            Opcode::ReadRequest => Some(qn::READ_REQUEST),
            Opcode::Terminate => Some(qn::TERMINATE),
            Opcode::AtomicRequest => Some(qn::ATOMIC_REQUEST),
            Opcode::AtomicResponse => Some(qn::ATOMIC_RESPONSE),
            Opcode::Write | Opcode::ReadResponse => None,
        }
    }

    /// An RFC 7306 extension opcode.
    pub fn is_extension(self) -> bool {
        (self as u8) >= 8
    }

    pub fn is_send(self) -> bool {
        matches!(
            self,
            Opcode::Send | Opcode::SendInv | Opcode::SendSe | Opcode::SendSeInv
        )
    }

    /// Fixed RDMAP header bytes following the DDP header (0 if none).
    pub fn body_len(self) -> usize {
        match self {
            Opcode::ReadRequest => READ_REQ_LEN,
            Opcode::AtomicRequest => ATOMIC_REQ_LEN,
            Opcode::AtomicResponse => ATOMIC_RESP_LEN,
            _ => 0,
        }
    }

    /// Whether the whole ULPDU after the DDP header is RDMAP control data
    /// (buffered by the core, never placed into user memory).
    pub fn is_control(self) -> bool {
        matches!(
            self,
            Opcode::ReadRequest
                | Opcode::Terminate
                | Opcode::AtomicRequest
                | Opcode::AtomicResponse
                | Opcode::ImmediateData
                | Opcode::ImmediateDataSe
        )
    }
}

/// RDMAP control byte (RFC 5040 §4.2), reserved bits kept for round trips.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdmapCtrl {
    pub rv: u8,
    pub rsvd: u8,
    pub opcode: u8,
}

impl RdmapCtrl {
    pub fn new(op: Opcode) -> RdmapCtrl {
        RdmapCtrl {
            rv: RDMAP_VERSION,
            rsvd: 0,
            opcode: op as u8,
        }
    }
    pub fn from_byte(b: u8) -> RdmapCtrl {
        RdmapCtrl {
            rv: b >> 6,
            rsvd: (b >> 4) & 3,
            opcode: b & 0x0f,
        }
    }
    pub fn to_byte(&self) -> u8 {
        (self.rv & 3) << 6 | (self.rsvd & 3) << 4 | (self.opcode & 0x0f)
    }
    pub fn op(&self) -> Option<Opcode> {
        Opcode::from_u8(self.opcode)
    }
}

fn be32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn be64(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_be_bytes(a)
}

/// RDMA Read Request header (RFC 5040 §4.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ReadRequest {
    pub sink_stag: u32,
    pub sink_to: u64,
    pub size: u32,
    pub src_stag: u32,
    pub src_to: u64,
}

impl ReadRequest {
    pub fn parse(b: &[u8]) -> Result<ReadRequest, WireError> {
        if b.len() < READ_REQ_LEN {
            return Err(WireError::Truncated { need: READ_REQ_LEN });
        }
        Ok(ReadRequest {
            sink_stag: be32(b, 0),
            sink_to: be64(b, 4),
            size: be32(b, 12),
            src_stag: be32(b, 16),
            src_to: be64(b, 20),
        })
    }
    pub fn encode(&self, out: &mut [u8]) -> usize {
        out[0..4].copy_from_slice(&self.sink_stag.to_be_bytes());
        out[4..12].copy_from_slice(&self.sink_to.to_be_bytes());
        out[12..16].copy_from_slice(&self.size.to_be_bytes());
        out[16..20].copy_from_slice(&self.src_stag.to_be_bytes());
        out[20..28].copy_from_slice(&self.src_to.to_be_bytes());
        READ_REQ_LEN
    }
}

/// RFC 7306 Atomic Operation Codes (AOpCode, §5.2.1 Figure 5; the registry
/// of §10.1: 0x0 FetchAdd, 0x1 Reserved, 0x2 CmpSwap). Both are masked
/// operations (§5.1.1, §5.1.2); an RNIC that offers atomics implements both
/// (§1.1, §5). There is no Swap: §5.2.1's field texts mention one, but
/// Figure 5 and the registry leave its code reserved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum AtomicOp {
    FetchAdd = 0,
    CompareSwap = 2,
}

impl AtomicOp {
    pub fn from_u8(v: u8) -> Option<AtomicOp> {
        match v {
            0 => Some(AtomicOp::FetchAdd),
            2 => Some(AtomicOp::CompareSwap),
            _ => None,
        }
    }
}

/// What an Atomic Request asks the responder to do to the 64-bit value at its
/// target, masks included (RFC 7306 §5.1.1, §5.1.2). [`AtomicOperation::apply`]
/// gives the value to store; an engine runs it atomically.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicOperation {
    /// §5.1.1: `add` is added field by field; a bit set in `add_mask` marks the
    /// most significant bit of a field, whose carry out is discarded. A mask of
    /// 0 is one plain 64-bit addition.
    FetchAdd { add: u64, add_mask: u64 },
    /// §5.1.2: if `compare` equals the original value in the bits set in
    /// `compare_mask`, the bits set in `swap_mask` are replaced by those of
    /// `swap`; otherwise memory is left as it was. Both masks all ones is the
    /// plain compare and swap.
    CmpSwap {
        compare: u64,
        compare_mask: u64,
        swap: u64,
        swap_mask: u64,
    },
}

impl AtomicOperation {
    /// The plain (unmasked) FetchAdd of `ibv_post_send`'s `IBV_WR_ATOMIC_FETCH_AND_ADD`.
    pub fn fetch_add(add: u64) -> AtomicOperation {
        AtomicOperation::FetchAdd { add, add_mask: 0 }
    }

    /// The plain compare and swap of `IBV_WR_ATOMIC_CMP_AND_SWP`.
    pub fn cmp_swap(compare: u64, swap: u64) -> AtomicOperation {
        AtomicOperation::CmpSwap {
            compare,
            compare_mask: u64::MAX,
            swap,
            swap_mask: u64::MAX,
        }
    }

    pub fn op(&self) -> AtomicOp {
        match self {
            AtomicOperation::FetchAdd { .. } => AtomicOp::FetchAdd,
            AtomicOperation::CmpSwap { .. } => AtomicOp::CompareSwap,
        }
    }

    /// The value the target holds after the operation, given `orig` before it.
    pub fn apply(&self, orig: u64) -> u64 {
        match *self {
            AtomicOperation::FetchAdd { add, add_mask } => {
                // Add with each field's top bit cleared in both operands: a field's carry
                // can reach its top bit but never the next field. The top bits are then
                // added without carry (xor), which discards their carry out (§5.1.1).
                let low = !add_mask;
                ((orig & low).wrapping_add(add & low)) ^ ((orig ^ add) & add_mask)
            }
            AtomicOperation::CmpSwap {
                compare,
                compare_mask,
                swap,
                swap_mask,
            } => {
                if (compare ^ orig) & compare_mask == 0 {
                    (orig & !swap_mask) | (swap & swap_mask)
                } else {
                    orig
                }
            }
        }
    }
}

/// Atomic Operation Request header (RFC 7306 §5.2.1 Figure 4): reserved (28
/// bits) | AOpCode (4 bits), Request Identifier, Remote STag, Remote Tagged
/// Offset, Add or Swap Data, Add or Swap Mask, Compare Data, Compare Mask —
/// 52 bytes right after the untagged DDP header (QN 1), big-endian.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AtomicRequest {
    /// The whole first word (reserved bits + AOpCode in the low 4 bits); the
    /// reserved bits are zero on transmit and ignored on receive.
    pub op_word: u32,
    /// Chosen by the requester, echoed in the Atomic Response.
    pub req_id: u32,
    pub stag: u32,
    /// Must address a 64-bit aligned buffer address (§5.2.1, §8.2).
    pub to: u64,
    pub add_swap: u64,
    pub add_swap_mask: u64,
    /// Zero for FetchAdd (§5.2.1).
    pub compare: u64,
    /// All ones for FetchAdd (§5.2.1).
    pub compare_mask: u64,
}

impl AtomicRequest {
    /// The request for `op` with the fields §5.2.1 fixes for it: FetchAdd sends
    /// Compare Data 0 and Compare Mask all ones.
    pub fn new(req_id: u32, stag: u32, to: u64, op: AtomicOperation) -> AtomicRequest {
        let (add_swap, add_swap_mask, compare, compare_mask) = match op {
            AtomicOperation::FetchAdd { add, add_mask } => (add, add_mask, 0, u64::MAX),
            AtomicOperation::CmpSwap {
                compare,
                compare_mask,
                swap,
                swap_mask,
            } => (swap, swap_mask, compare, compare_mask),
        };
        AtomicRequest {
            op_word: op.op() as u32,
            req_id,
            stag,
            to,
            add_swap,
            add_swap_mask,
            compare,
            compare_mask,
        }
    }

    pub fn op(&self) -> Option<AtomicOp> {
        AtomicOp::from_u8((self.op_word & 0x0f) as u8)
    }

    /// What the responder is to do, or `None` for a reserved AOpCode. The fields
    /// an operation does not use are ignored, as §5.2.1 asks of the receiver.
    pub fn operation(&self) -> Option<AtomicOperation> {
        Some(match self.op()? {
            AtomicOp::FetchAdd => AtomicOperation::FetchAdd {
                add: self.add_swap,
                add_mask: self.add_swap_mask,
            },
            AtomicOp::CompareSwap => AtomicOperation::CmpSwap {
                compare: self.compare,
                compare_mask: self.compare_mask,
                swap: self.add_swap,
                swap_mask: self.add_swap_mask,
            },
        })
    }

    pub fn parse(b: &[u8]) -> Result<AtomicRequest, WireError> {
        if b.len() < ATOMIC_REQ_LEN {
            return Err(WireError::Truncated {
                need: ATOMIC_REQ_LEN,
            });
        }
        Ok(AtomicRequest {
            op_word: be32(b, 0),
            req_id: be32(b, 4),
            stag: be32(b, 8),
            to: be64(b, 12),
            add_swap: be64(b, 20),
            add_swap_mask: be64(b, 28),
            compare: be64(b, 36),
            compare_mask: be64(b, 44),
        })
    }
    pub fn encode(&self, out: &mut [u8]) -> usize {
        out[0..4].copy_from_slice(&self.op_word.to_be_bytes());
        out[4..8].copy_from_slice(&self.req_id.to_be_bytes());
        out[8..12].copy_from_slice(&self.stag.to_be_bytes());
        out[12..20].copy_from_slice(&self.to.to_be_bytes());
        out[20..28].copy_from_slice(&self.add_swap.to_be_bytes());
        out[28..36].copy_from_slice(&self.add_swap_mask.to_be_bytes());
        out[36..44].copy_from_slice(&self.compare.to_be_bytes());
        out[44..52].copy_from_slice(&self.compare_mask.to_be_bytes());
        ATOMIC_REQ_LEN
    }
}

/// Atomic Operation Response header (RFC 7306 §5.2.2 Figure 6, Appendix A.2):
/// Original Request Identifier (32 bits), Original Remote Data Value (64
/// bits) — 12 bytes after the untagged DDP header (QN 3). (§4's prose says
/// "32 bytes long"; Figure 6, Appendix A.2 and Wireshark have 12.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AtomicResponse {
    pub req_id: u32,
    pub orig_value: u64,
}

impl AtomicResponse {
    pub fn parse(b: &[u8]) -> Result<AtomicResponse, WireError> {
        if b.len() < ATOMIC_RESP_LEN {
            return Err(WireError::Truncated {
                need: ATOMIC_RESP_LEN,
            });
        }
        Ok(AtomicResponse {
            req_id: be32(b, 0),
            orig_value: be64(b, 4),
        })
    }
    pub fn encode(&self, out: &mut [u8]) -> usize {
        out[0..4].copy_from_slice(&self.req_id.to_be_bytes());
        out[4..12].copy_from_slice(&self.orig_value.to_be_bytes());
        ATOMIC_RESP_LEN
    }
}

/// Byte layout a Terminate Control word was found in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TermLayout {
    /// RFC 5040 §4.8.
    Rfc,
    /// Linux siw on little-endian hosts (nibbles of byte 0 swapped, M/D/R in
    /// bits 0..2 of byte 2).
    Siw,
}

/// Terminate message body (RFC 5040 §4.8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Terminate {
    pub code: TermCode,
    /// M: DDP Segment Length valid.
    pub m: bool,
    /// D: DDP header included.
    pub d: bool,
    /// R: RDMAP header (Read Request) included.
    pub r: bool,
    /// DDP segment length (MPA ULPDU length) of the terminated segment.
    pub seg_len: u16,
    /// Echoed DDP header bytes (14 or 18 valid bytes; `ddp_hdr_len` says).
    pub ddp_hdr: [u8; 18],
    pub ddp_hdr_len: u8,
    /// Echoed Read Request header.
    pub rdmap_hdr: Option<ReadRequest>,
}

impl Terminate {
    pub fn new(code: TermCode) -> Terminate {
        Terminate {
            code,
            m: false,
            d: false,
            r: false,
            seg_len: 0,
            ddp_hdr: [0; 18],
            ddp_hdr_len: 0,
            rdmap_hdr: None,
        }
    }

    /// Echoed DDP header bytes, if any.
    pub fn echoed_ddp(&self) -> Option<&[u8]> {
        if self.d && self.ddp_hdr_len > 0 {
            Some(&self.ddp_hdr[..self.ddp_hdr_len as usize])
        } else {
            None
        }
    }

    /// Encoded length of the body.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        let mut n = TERM_FIXED_LEN;
        if self.d {
            n += self.ddp_hdr_len as usize;
        }
        if self.r && self.rdmap_hdr.is_some() {
            n += READ_REQ_LEN;
        }
        n
    }

    /// Encode RFC-correctly into `out` (≥ [`Terminate::len`] bytes).
    pub fn encode(&self, out: &mut [u8]) -> usize {
        out[0] = (self.code.layer & 0x0f) << 4 | (self.code.etype & 0x0f);
        out[1] = self.code.ecode;
        out[2] = (self.m as u8) << 7 | (self.d as u8) << 6 | (self.r as u8) << 5;
        out[3] = 0;
        out[4..6].copy_from_slice(&self.seg_len.to_be_bytes());
        let mut n = TERM_FIXED_LEN;
        if self.d {
            let l = self.ddp_hdr_len as usize;
            out[n..n + l].copy_from_slice(&self.ddp_hdr[..l]);
            n += l;
        }
        if self.r {
            if let Some(rr) = &self.rdmap_hdr {
                n += rr.encode(&mut out[n..]);
            }
        }
        n
    }

    /// Parse a Terminate body (the ULPDU after the untagged DDP header),
    /// tolerating siw's layout. Never panics.
    pub fn parse(b: &[u8]) -> Result<(Terminate, TermLayout), WireError> {
        if b.len() < 4 {
            return Err(WireError::Truncated { need: 4 });
        }
        let rfc_flags = b[2] & 0xe0;
        let siw_flags = b[2] & 0x07;
        let hi = b[0] >> 4;
        let lo = b[0] & 0x0f;
        // siw puts M/D/R in the low 3 bits of byte 2 and swaps byte 0's
        // nibbles. Decide by the flag bits first, then by layer validity.
        let layout = if rfc_flags == 0 && siw_flags != 0 {
            TermLayout::Siw
        } else if rfc_flags != 0 {
            TermLayout::Rfc
        } else if hi > 2 && lo <= 2 {
            TermLayout::Siw
        } else {
            TermLayout::Rfc
        };
        let (layer, etype, m, d, r) = match layout {
            TermLayout::Rfc => (hi, lo, b[2] & 0x80 != 0, b[2] & 0x40 != 0, b[2] & 0x20 != 0),
            TermLayout::Siw => (lo, hi, b[2] & 0x01 != 0, b[2] & 0x02 != 0, b[2] & 0x04 != 0),
        };
        let mut t = Terminate::new(TermCode::new(layer, etype, b[1]));
        t.m = m;
        t.d = d;
        t.r = r;
        if b.len() >= TERM_FIXED_LEN {
            t.seg_len = u16::from_be_bytes([b[4], b[5]]);
        } else if m || d || r {
            return Err(WireError::BadTerminate);
        }
        let mut off = TERM_FIXED_LEN;
        if d {
            if b.len() <= off {
                return Err(WireError::BadTerminate);
            }
            let l = crate::ddp::DdpHeader::len_for_ctrl(b[off]);
            if b.len() < off + l {
                return Err(WireError::BadTerminate);
            }
            t.ddp_hdr[..l].copy_from_slice(&b[off..off + l]);
            t.ddp_hdr_len = l as u8;
            off += l;
        }
        if r {
            if b.len() < off + READ_REQ_LEN {
                return Err(WireError::BadTerminate);
            }
            t.rdmap_hdr = Some(ReadRequest::parse(&b[off..])?);
        }
        Ok((t, layout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcodes() {
        for v in 0..16u8 {
            match Opcode::from_u8(v) {
                Some(op) => assert_eq!(op as u8, v),
                None => assert!(v >= 12),
            }
        }
        assert!(Opcode::Write.is_tagged());
        assert!(!Opcode::Send.is_tagged());
        assert_eq!(Opcode::Terminate.queue(), Some(2));
        assert!(Opcode::AtomicRequest.is_extension());
        assert_eq!(RdmapCtrl::from_byte(0x47).op(), Some(Opcode::Terminate));
        assert_eq!(RdmapCtrl::new(Opcode::SendSeInv).to_byte(), 0x46);
    }

    #[test]
    fn read_request_literal() {
        // siw-read.pcap frame 33 after the untagged DDP header.
        let b = [
            0xdb, 0x68, 0x77, 0x00, 0x00, 0x00, 0x55, 0x63, 0xff, 0x4d, 0x00, 0x00, 0x00, 0x00,
            0x20, 0x00, 0xce, 0xf1, 0x76, 0x00, 0x00, 0x00, 0x56, 0x31, 0xd8, 0x0b, 0x80, 0x00,
        ];
        let r = ReadRequest::parse(&b).unwrap();
        assert_eq!(r.sink_stag, 0xdb687700);
        assert_eq!(r.sink_to, 0x00005563ff4d0000);
        assert_eq!(r.size, 8192);
        assert_eq!(r.src_stag, 0xcef17600);
        assert_eq!(r.src_to, 0x00005631d80b8000);
        let mut out = [0u8; 28];
        r.encode(&mut out);
        assert_eq!(out, b);
        assert!(ReadRequest::parse(&b[..27]).is_err());
    }

    // h2g-badread.pcap frame 9, Terminate body after the DDP header.
    const SIW_TERM: [u8; 52] = [
        0x10, 0x00, 0x07, 0x00, 0x00, 0x00, 0x41, 0x41, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x01, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00, 0xc0, 0xff, 0x01, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x40, 0xde, 0xad, 0xbe, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00,
    ];

    #[test]
    fn siw_terminate_tolerant() {
        let (t, layout) = Terminate::parse(&SIW_TERM).unwrap();
        assert_eq!(layout, TermLayout::Siw);
        assert_eq!(t.code, TermCode::RDMAP_INVALID_STAG);
        assert!(t.m && t.d && t.r);
        assert_eq!(t.seg_len, 0);
        assert_eq!(t.echoed_ddp().unwrap().len(), 18);
        let rr = t.rdmap_hdr.unwrap();
        assert_eq!(rr.sink_stag, 0x00c0ff01);
        assert_eq!(rr.size, 64);
        assert_eq!(rr.src_stag, 0xdeadbe00);
        assert_eq!(rr.src_to, 0x1000);
        // Re-encoded RFC-correctly: layer/etype nibbles and M/D/R fixed,
        // everything else identical.
        let mut out = [0u8; 64];
        let n = t.encode(&mut out);
        assert_eq!(n, 52);
        assert_eq!(&out[..4], &[0x01, 0x00, 0xe0, 0x00]);
        assert_eq!(&out[4..52], &SIW_TERM[4..]);
        let (t2, l2) = Terminate::parse(&out[..n]).unwrap();
        assert_eq!(l2, TermLayout::Rfc);
        assert_eq!(t2, t);
    }

    #[test]
    fn terminate_truncated() {
        for n in 0..SIW_TERM.len() {
            let r = Terminate::parse(&SIW_TERM[..n]);
            assert!(r.is_err(), "len {n}");
        }
        // Bare control word, no headers (e.g. CRC error): RFC layout.
        let (t, l) = Terminate::parse(&[0x20, 0x02, 0x00, 0x00, 0x00, 0x00]).unwrap();
        assert_eq!(l, TermLayout::Rfc);
        assert_eq!(t.code, TermCode::MPA_CRC);
    }

    /// RFC 7306 §5.2.1 Figure 4 (and Appendix A.1), written out by hand: a CmpSwap
    /// (AOpCode 0010b in the low 4 bits of the first word), every field distinct.
    const CMP_SWAP_REQ: [u8; 52] = [
        0x00, 0x00, 0x00, 0x02, // Reserved (28 bits) | AOpCode
        0x00, 0x00, 0x00, 0x2a, // Request Identifier
        0x11, 0x22, 0x33, 0x44, // Remote STag
        0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x10, 0x08, // Remote Tagged Offset
        0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, // Add or Swap Data (Swap Data)
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // Add or Swap Mask (Swap Mask)
        0xc1, 0xc2, 0xc3, 0xc4, 0xc5, 0xc6, 0xc7, 0xc8, // Compare Data
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // Compare Mask
    ];

    /// A plain FetchAdd: Add Mask 0 is "Atomic Add of 64-bit" (§5.1.1); Compare Data is
    /// zero and Compare Mask all ones on transmit for FetchAdd (§5.2.1).
    const FETCH_ADD_REQ: [u8; 52] = [
        0x00, 0x00, 0x00, 0x00, // Reserved | AOpCode 0000b (FetchAdd)
        0x00, 0x00, 0x00, 0x01, // Request Identifier
        0x00, 0x00, 0x0b, 0x00, // Remote STag
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, // Remote Tagged Offset
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, // Add Data
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // Add Mask
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // Compare Data
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // Compare Mask
    ];

    #[test]
    fn atomic_request_layout_is_rfc7306_figure_4() {
        let op = AtomicOperation::cmp_swap(0xc1c2_c3c4_c5c6_c7c8, 0xa1a2_a3a4_a5a6_a7a8);
        let req = AtomicRequest::new(0x2a, 0x1122_3344, 0x7f00_0000_1008, op);
        let mut out = [0u8; ATOMIC_REQ_LEN];
        assert_eq!(req.encode(&mut out), 52);
        assert_eq!(out, CMP_SWAP_REQ);
        let back = AtomicRequest::parse(&CMP_SWAP_REQ).unwrap();
        assert_eq!(back, req);
        assert_eq!(back.operation(), Some(op));

        let req = AtomicRequest::new(1, 0xb00, 0x100, AtomicOperation::fetch_add(5));
        req.encode(&mut out);
        assert_eq!(out, FETCH_ADD_REQ);
        assert_eq!(
            AtomicRequest::parse(&FETCH_ADD_REQ).unwrap().operation(),
            Some(AtomicOperation::FetchAdd { add: 5, add_mask: 0 })
        );
    }

    #[test]
    fn reserved_atomic_opcodes_are_refused() {
        // §10.1: 0x1 is Reserved (no Swap), 0x3-0xF unassigned. The 28 reserved bits
        // are ignored on receive (§5.2.1).
        for code in [1u32, 3, 0xf] {
            let req = AtomicRequest { op_word: code, ..Default::default() };
            assert_eq!(req.operation(), None, "AOpCode {code}");
        }
        let req = AtomicRequest { op_word: 0xffff_fff2, ..Default::default() };
        assert_eq!(req.op(), Some(AtomicOp::CompareSwap));
    }

    /// RFC 7306 §5.1.1's pseudocode for a masked FetchAdd, transcribed bit by bit.
    fn rfc_masked_fetch_add(orig: u64, add: u64, add_mask: u64) -> u64 {
        let mut bit_location: u64 = 1;
        let mut carry = 0u64;
        let mut remote = 0u64;
        for bit in 0..64 {
            if bit != 0 {
                bit_location <<= 1;
            }
            let val1 = (orig & bit_location) >> bit;
            let val2 = (add & bit_location) >> bit;
            let mut sum = carry + val1 + val2;
            carry = (sum & 2) >> 1;
            sum &= 1;
            if sum != 0 {
                remote |= bit_location;
            }
            carry = (carry != 0 && (add_mask & bit_location) == 0) as u64;
        }
        remote
    }

    /// RFC 7306 §5.1.2's pseudocode for a masked CmpSwap.
    fn rfc_masked_cmp_swap(orig: u64, compare: u64, compare_mask: u64, swap: u64, swap_mask: u64) -> u64 {
        if ((compare ^ orig) & compare_mask) == 0 {
            (orig & !swap_mask) | (swap & swap_mask)
        } else {
            orig
        }
    }

    #[test]
    fn masked_atomics_follow_the_rfc_pseudocode() {
        // Hand-worked: two 32-bit fields (top bits 31 and 63). The low field wraps and
        // its carry is discarded; with mask 0 it carries into the high field.
        let two_fields = AtomicOperation::FetchAdd { add: 1, add_mask: 0x8000_0000_8000_0000 };
        assert_eq!(two_fields.apply(0x0000_0001_ffff_ffff), 0x0000_0001_0000_0000);
        assert_eq!(AtomicOperation::fetch_add(1).apply(0x0000_0001_ffff_ffff), 0x0000_0002_0000_0000);
        // Mask all ones: 64 one-bit fields, every carry discarded.
        let bits = AtomicOperation::FetchAdd { add: 0b0110, add_mask: u64::MAX };
        assert_eq!(bits.apply(0b0011), 0b0101);
        // Compare on the low byte only, swap the high byte only.
        let cs = AtomicOperation::CmpSwap {
            compare: 0x77,
            compare_mask: 0xff,
            swap: 0xab00_0000_0000_0000,
            swap_mask: 0xff00_0000_0000_0000,
        };
        assert_eq!(cs.apply(0x1100_0000_0000_1277), 0xab00_0000_0000_1277);
        assert_eq!(cs.apply(0x1100_0000_0000_1278), 0x1100_0000_0000_1278);
        // And against the transcribed pseudocode on many values (a fixed LCG).
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            x
        };
        for _ in 0..2000 {
            let (orig, a, m, c, cm) = (next(), next(), next() & next(), next(), next() | next());
            let fa = AtomicOperation::FetchAdd { add: a, add_mask: m };
            assert_eq!(fa.apply(orig), rfc_masked_fetch_add(orig, a, m), "{orig:#x} + {a:#x} mask {m:#x}");
            assert_eq!(AtomicOperation::fetch_add(a).apply(orig), orig.wrapping_add(a));
            let cs = AtomicOperation::CmpSwap { compare: c, compare_mask: cm, swap: a, swap_mask: m };
            assert_eq!(cs.apply(orig), rfc_masked_cmp_swap(orig, c, cm, a, m));
            // A compare that matches in the masked bits.
            let hit = AtomicOperation::CmpSwap { compare: orig ^ !cm, compare_mask: cm, swap: a, swap_mask: m };
            assert_eq!(hit.apply(orig), (orig & !m) | (a & m));
        }
    }

    #[test]
    fn atomic_response_layout_is_rfc7306_figure_6() {
        // §5.2.2 Figure 6: Original Request Identifier, Original Remote Data Value.
        let bytes = [0x00, 0x00, 0x00, 0x2a, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08];
        let r = AtomicResponse::parse(&bytes).unwrap();
        assert_eq!(r, AtomicResponse { req_id: 0x2a, orig_value: 0x0102_0304_0506_0708 });
        let mut out = [0u8; ATOMIC_RESP_LEN];
        assert_eq!(r.encode(&mut out), 12);
        assert_eq!(out, bytes);
    }

    #[test]
    fn rfc7306_opcodes_and_queues() {
        // §4.1 Figure 2 and §10: opcode, queue number; §4.2 Figure 3: header length.
        let table = [
            (0x8, Opcode::ImmediateData, 0, 0),
            (0x9, Opcode::ImmediateDataSe, 0, 0),
            (0xa, Opcode::AtomicRequest, 1, 52),
            (0xb, Opcode::AtomicResponse, 3, 12),
        ];
        for (code, op, queue, body) in table {
            assert_eq!(Opcode::from_u8(code), Some(op));
            assert_eq!(op as u8, code);
            assert_eq!(op.queue(), Some(queue), "{op:?}");
            assert_eq!(op.body_len(), body, "{op:?}");
            assert!(op.is_extension() && !op.is_tagged() && op.is_control());
        }
        for code in 0xc..=0xf {
            assert_eq!(Opcode::from_u8(code), None, "opcode {code:#x} is unassigned");
        }
    }

    #[test]
    fn atomics_round_trip() {
        let a = AtomicRequest {
            op_word: 2,
            req_id: 7,
            stag: 0x1234,
            to: 0x1000,
            add_swap: 5,
            add_swap_mask: u64::MAX,
            compare: 3,
            compare_mask: u64::MAX,
        };
        let mut out = [0u8; 52];
        assert_eq!(a.encode(&mut out), 52);
        assert_eq!(AtomicRequest::parse(&out).unwrap(), a);
        assert_eq!(a.op(), Some(AtomicOp::CompareSwap));
        let r = AtomicResponse {
            req_id: 7,
            orig_value: 0xdead,
        };
        let mut o2 = [0u8; 12];
        r.encode(&mut o2);
        assert_eq!(o2, [0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0xde, 0xad]);
        assert_eq!(AtomicResponse::parse(&o2).unwrap(), r);
        assert!(AtomicResponse::parse(&o2[..11]).is_err());
    }
}
