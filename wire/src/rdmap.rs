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
/// Atomic Request body after the untagged DDP header (RFC 7306 §5.1).
pub const ATOMIC_REQ_LEN: usize = 52;
/// Atomic Response body (RFC 7306 §5.2).
pub const ATOMIC_RESP_LEN: usize = 12;
/// Immediate Data payload (RFC 7306 §6).
pub const IMMEDIATE_LEN: usize = 8;
/// Terminate Control word + DDP segment length.
pub const TERM_FIXED_LEN: usize = 6;

/// RDMAP opcodes (RFC 5040 §4.3, RFC 7306 §7).
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

/// RFC 7306 atomic operation codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum AtomicOp {
    FetchAdd = 0,
    Swap = 1,
    CompareSwap = 2,
}

impl AtomicOp {
    pub fn from_u8(v: u8) -> Option<AtomicOp> {
        match v {
            0 => Some(AtomicOp::FetchAdd),
            1 => Some(AtomicOp::Swap),
            2 => Some(AtomicOp::CompareSwap),
            _ => None,
        }
    }
}

/// Atomic Request header (RFC 7306 §5.1): reserved(28) | atomic opcode(4),
/// request identifier, remote STag, remote TO, add/swap data, add/swap mask,
/// compare data, compare mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AtomicRequest {
    /// The whole first word (reserved bits + opcode in the low 4 bits).
    pub op_word: u32,
    pub req_id: u32,
    pub stag: u32,
    pub to: u64,
    pub add_swap: u64,
    pub add_swap_mask: u64,
    pub compare: u64,
    pub compare_mask: u64,
}

impl AtomicRequest {
    pub fn op(&self) -> Option<AtomicOp> {
        AtomicOp::from_u8((self.op_word & 0x0f) as u8)
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

/// Atomic Response header (RFC 7306 §5.2).
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
