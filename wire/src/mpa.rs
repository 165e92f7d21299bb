//! MPA: Marker PDU Aligned framing (RFC 5044) with the enhanced connection
//! establishment of RFC 6581.
//!
//! * Request/Reply frames (RFC 5044 §7.1): 16-byte key, flags byte
//!   (M 0x80, C 0x40, R 0x20, then reserved bits; RFC 6581 §5 uses 0x10 as
//!   the "enhanced" bit siw needs before it reads IRD/ORD), revision byte,
//!   16-bit private-data length, private data (≤ 512 bytes).
//! * RFC 6581 §9 IRD/ORD words at the start of the private data when
//!   revision = 2 and the enhanced bit is set: see [`IrdOrd`].
//! * FPDU framing (RFC 5044 §4.2/§6): 16-bit ULPDU length, ULPDU, pad to a
//!   4-byte boundary (counting the length field), 4-byte CRC32c (zero when
//!   CRC is not negotiated, but always present).
//!
//! ## Decisions
//! * **Markers are never used.** A Request asking for markers (M=1) is
//!   answered with a Reply that has R=1 (reject), exactly as siw does (see
//!   `h2g-markers.pcap`); a Reply with M=1 is a protocol error for an
//!   initiator that did not ask for them. The deframer therefore never has to
//!   strip markers.
//! * **CRC** is used if either side sets C (RFC 5044 §7.1): the responder
//!   honours a request, and may itself require it.
//! * **MULPDU**: like siw, a full FPDU is the TCP MSS rounded down to a
//!   multiple of 8 ([`fpdu_max`]); MULPDU = that minus the 2-byte length and
//!   the 4-byte CRC ([`mulpdu`]). Because `fpdu_max - 4` is a multiple of 4,
//!   full FPDUs carry no pad.
//! * RFC 7306 §1.1 leaves the discovery of the extensions to the ULP or the
//!   RNIC. uiw offers them with reserved flag bit 0x01 in its Request
//!   ([`FLAG_UIW_EXT`]) and a uiw responder accepts with reserved bit 0x02 in
//!   its Reply ([`FLAG_UIW_EXT_ACK`]); the extensions are used only then.
//!   Two bits, because siw builds its Reply from the Request's header and
//!   so echoes every flag bit it was sent, reserved ones included
//!   (`siw_proc_mpareq`): an echoed 0x01 says nothing about the responder.

use crate::error::WireError;

pub const KEY_REQ: &[u8; 16] = b"MPA ID Req Frame";
pub const KEY_REP: &[u8; 16] = b"MPA ID Rep Frame";
/// Flags byte bits (RFC 5044 §7.1, RFC 6581 §5).
pub const FLAG_MARKERS: u8 = 0x80;
pub const FLAG_CRC: u8 = 0x40;
pub const FLAG_REJECT: u8 = 0x20;
pub const FLAG_ENHANCED: u8 = 0x10;
/// uiw private use of a reserved bit, in a Request: "RFC 7306 extensions offered".
pub const FLAG_UIW_EXT: u8 = 0x01;
/// uiw private use of a reserved bit, in a Reply: "RFC 7306 extensions accepted" (a
/// different bit from the offer, which a Reply that echoes the Request repeats).
pub const FLAG_UIW_EXT_ACK: u8 = 0x02;
/// Fixed part of a Request/Reply frame.
pub const RR_HDR_LEN: usize = 20;
/// RFC 5044 §7.1.
pub const MAX_PRIVATE_DATA: usize = 512;
/// Length of the RFC 6581 IRD/ORD words.
pub const IRD_ORD_LEN: usize = 4;
/// Mask of the 14-bit IRD/ORD values (RFC 6581 §9).
pub const IRD_ORD_MASK: u16 = 0x3fff;
/// MPA ULPDU length field size.
pub const LEN_FIELD: usize = 2;
/// CRC field size.
pub const CRC_LEN: usize = 4;

/// Request or Reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    Request,
    Reply,
}

/// Fixed 20-byte header of an MPA Request or Reply frame (RFC 5044 §7.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RrHeader {
    pub kind: FrameKind,
    /// Full flags byte (M, C, R, enhanced and reserved bits kept verbatim).
    pub flags: u8,
    pub revision: u8,
    pub pd_len: u16,
}

impl RrHeader {
    pub fn markers(&self) -> bool {
        self.flags & FLAG_MARKERS != 0
    }
    pub fn crc(&self) -> bool {
        self.flags & FLAG_CRC != 0
    }
    pub fn reject(&self) -> bool {
        self.flags & FLAG_REJECT != 0
    }
    pub fn enhanced(&self) -> bool {
        self.flags & FLAG_ENHANCED != 0
    }
    /// Whether the private data starts with RFC 6581 IRD/ORD words.
    pub fn has_ird_ord(&self) -> bool {
        self.revision == 2 && self.enhanced()
    }

    /// Parse the 20-byte fixed part.
    pub fn parse(buf: &[u8]) -> Result<RrHeader, WireError> {
        if buf.len() < RR_HDR_LEN {
            return Err(WireError::Truncated { need: RR_HDR_LEN });
        }
        let kind = if &buf[..16] == KEY_REQ {
            FrameKind::Request
        } else if &buf[..16] == KEY_REP {
            FrameKind::Reply
        } else {
            return Err(WireError::BadMpaKey);
        };
        let pd_len = u16::from_be_bytes([buf[18], buf[19]]);
        if pd_len as usize > MAX_PRIVATE_DATA {
            return Err(WireError::PrivateDataTooLong(pd_len));
        }
        Ok(RrHeader {
            kind,
            flags: buf[16],
            revision: buf[17],
            pd_len,
        })
    }

    pub fn encode(&self, out: &mut [u8; RR_HDR_LEN]) {
        out[..16].copy_from_slice(match self.kind {
            FrameKind::Request => KEY_REQ,
            FrameKind::Reply => KEY_REP,
        });
        out[16] = self.flags;
        out[17] = self.revision;
        out[18..20].copy_from_slice(&self.pd_len.to_be_bytes());
    }
}

/// RFC 6581 §9 IRD/ORD words, the first 4 bytes of the private data.
///
/// IRD word: bit 15 = peer-to-peer, bit 14 = zero-length Send RTR, low 14 bits
/// IRD. ORD word: bit 15 = zero-length Write RTR, bit 14 = zero-length Read
/// RTR, low 14 bits ORD.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IrdOrd {
    pub ird: u16,
    pub ord: u16,
    pub p2p: bool,
    pub send_rtr: bool,
    pub write_rtr: bool,
    pub read_rtr: bool,
}

impl IrdOrd {
    pub fn parse(b: &[u8]) -> Result<IrdOrd, WireError> {
        if b.len() < IRD_ORD_LEN {
            return Err(WireError::MissingIrdOrd);
        }
        let i = u16::from_be_bytes([b[0], b[1]]);
        let o = u16::from_be_bytes([b[2], b[3]]);
        Ok(IrdOrd {
            ird: i & IRD_ORD_MASK,
            ord: o & IRD_ORD_MASK,
            p2p: i & 0x8000 != 0,
            send_rtr: i & 0x4000 != 0,
            write_rtr: o & 0x8000 != 0,
            read_rtr: o & 0x4000 != 0,
        })
    }

    pub fn encode(&self) -> [u8; 4] {
        let mut i = self.ird.min(IRD_ORD_MASK);
        let mut o = self.ord.min(IRD_ORD_MASK);
        if self.p2p {
            i |= 0x8000;
        }
        if self.send_rtr {
            i |= 0x4000;
        }
        if self.write_rtr {
            o |= 0x8000;
        }
        if self.read_rtr {
            o |= 0x4000;
        }
        let mut out = [0u8; 4];
        out[..2].copy_from_slice(&i.to_be_bytes());
        out[2..].copy_from_slice(&o.to_be_bytes());
        out
    }
}

/// A complete Request or Reply frame, borrowing its private data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RrFrame<'a> {
    pub hdr: RrHeader,
    /// All private data bytes, including IRD/ORD words if present.
    pub private_data: &'a [u8],
}

impl<'a> RrFrame<'a> {
    /// Parse a frame at the start of `buf`. Returns the frame and the number
    /// of bytes it occupies; `Truncated` if `buf` is too short.
    pub fn parse(buf: &'a [u8]) -> Result<(RrFrame<'a>, usize), WireError> {
        let hdr = RrHeader::parse(buf)?;
        let total = RR_HDR_LEN + hdr.pd_len as usize;
        if buf.len() < total {
            return Err(WireError::Truncated { need: total });
        }
        let private_data = &buf[RR_HDR_LEN..total];
        if hdr.has_ird_ord() && private_data.len() < IRD_ORD_LEN {
            return Err(WireError::MissingIrdOrd);
        }
        Ok((RrFrame { hdr, private_data }, total))
    }

    /// RFC 6581 IRD/ORD, if this frame carries them.
    pub fn ird_ord(&self) -> Option<IrdOrd> {
        if self.hdr.has_ird_ord() {
            IrdOrd::parse(self.private_data).ok()
        } else {
            None
        }
    }

    /// Private data meant for the ULP (without the IRD/ORD words).
    pub fn ulp_private_data(&self) -> &'a [u8] {
        if self.hdr.has_ird_ord() && self.private_data.len() >= IRD_ORD_LEN {
            &self.private_data[IRD_ORD_LEN..]
        } else {
            self.private_data
        }
    }

    /// Append the encoded frame to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut h = [0u8; RR_HDR_LEN];
        let mut hdr = self.hdr;
        hdr.pd_len = self.private_data.len() as u16;
        hdr.encode(&mut h);
        out.extend_from_slice(&h);
        out.extend_from_slice(self.private_data);
    }
}

/// Build and append a Request/Reply frame: `ird_ord` (if any) is put in front
/// of `ulp_pd` and the enhanced bit is set for revision 2.
pub fn encode_rr(
    kind: FrameKind,
    flags: u8,
    revision: u8,
    ird_ord: Option<IrdOrd>,
    ulp_pd: &[u8],
    out: &mut Vec<u8>,
) {
    let mut flags = flags;
    let mut pd_len = ulp_pd.len();
    if ird_ord.is_some() {
        flags |= FLAG_ENHANCED;
        pd_len += IRD_ORD_LEN;
    }
    let pd_len = pd_len.min(MAX_PRIVATE_DATA);
    let hdr = RrHeader {
        kind,
        flags,
        revision,
        pd_len: pd_len as u16,
    };
    let mut h = [0u8; RR_HDR_LEN];
    hdr.encode(&mut h);
    out.extend_from_slice(&h);
    let mut room = pd_len;
    if let Some(io) = ird_ord {
        out.extend_from_slice(&io.encode());
        room -= IRD_ORD_LEN;
    }
    out.extend_from_slice(&ulp_pd[..room.min(ulp_pd.len())]);
}

/// Pad bytes after a ULPDU of `ulpdu_len` bytes (RFC 5044 §4.2: the length
/// field plus ULPDU plus pad is a multiple of 4).
pub const fn pad_len(ulpdu_len: usize) -> usize {
    (4 - ((LEN_FIELD + ulpdu_len) & 3)) & 3
}

/// Total FPDU size on the wire for a ULPDU of `ulpdu_len` bytes.
pub const fn fpdu_len(ulpdu_len: usize) -> usize {
    LEN_FIELD + ulpdu_len + pad_len(ulpdu_len) + CRC_LEN
}

/// Largest FPDU for a TCP MSS, as siw sizes it: MSS rounded down to a
/// multiple of 8 (MSS 1460 → 1456, MSS 1448 → 1448), capped so the ULPDU
/// length still fits 16 bits.
pub const fn fpdu_max(mss: usize) -> usize {
    let f = mss & !7;
    if f > 65535 - 7 {
        (65535 - 7) & !7
    } else if f < 64 {
        64
    } else {
        f
    }
}

/// The largest ULPDU any MPA sender forms: the MULPDU of the largest FPDU whose
/// length still fits the 16-bit field with pad and CRC (65522).
pub const MAX_ULPDU: usize = mulpdu(65535);

/// Maximum ULPDU length (MULPDU, RFC 5044 §4.1) for a TCP MSS.
pub const fn mulpdu(mss: usize) -> usize {
    fpdu_max(mss) - LEN_FIELD - CRC_LEN
}

#[cfg(test)]
mod tests {
    use super::*;

    // siw-read.pcap frame 21: MPA Request rev 2, enhanced, IRD/ORD 128/128.
    const SIW_REQ: [u8; 24] = [
        0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6d,
        0x65, 0x10, 0x02, 0x00, 0x04, 0x00, 0x80, 0x00, 0x80,
    ];
    // h2g-markers.pcap frame 6: reject reply.
    const SIW_REJECT: [u8; 24] = [
        0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x70, 0x20, 0x46, 0x72, 0x61, 0x6d,
        0x65, 0x30, 0x02, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00,
    ];
    // siw-write-rev1.pcap frame 4: rev 1 request, no private data.
    const REV1_REQ: [u8; 20] = [
        0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6d,
        0x65, 0x00, 0x01, 0x00, 0x00,
    ];

    #[test]
    fn parse_siw_request() {
        let (f, n) = RrFrame::parse(&SIW_REQ).unwrap();
        assert_eq!(n, 24);
        assert_eq!(f.hdr.kind, FrameKind::Request);
        assert!(!f.hdr.markers() && !f.hdr.crc() && !f.hdr.reject() && f.hdr.enhanced());
        assert_eq!(f.hdr.revision, 2);
        let io = f.ird_ord().unwrap();
        assert_eq!((io.ird, io.ord, io.p2p), (128, 128, false));
        assert!(f.ulp_private_data().is_empty());
        let mut out = Vec::new();
        f.encode(&mut out);
        assert_eq!(out, SIW_REQ);
        let mut out2 = Vec::new();
        encode_rr(FrameKind::Request, 0, 2, Some(io), &[], &mut out2);
        assert_eq!(out2, SIW_REQ);
    }

    #[test]
    fn parse_reject_and_rev1() {
        let (f, _) = RrFrame::parse(&SIW_REJECT).unwrap();
        assert_eq!(f.hdr.kind, FrameKind::Reply);
        assert!(f.hdr.reject());
        let (f, n) = RrFrame::parse(&REV1_REQ).unwrap();
        assert_eq!(n, 20);
        assert_eq!(f.hdr.revision, 1);
        assert!(f.ird_ord().is_none());
        let mut out = Vec::new();
        encode_rr(FrameKind::Request, 0, 1, None, &[], &mut out);
        assert_eq!(out, REV1_REQ);
    }

    #[test]
    fn p2p_words() {
        // siw-write-p2p.pcap request pd 8000c001, reply pd 80018000
        let r = IrdOrd::parse(&[0x80, 0x00, 0xc0, 0x01]).unwrap();
        assert_eq!(
            r,
            IrdOrd {
                ird: 0,
                ord: 1,
                p2p: true,
                send_rtr: false,
                write_rtr: true,
                read_rtr: true
            }
        );
        assert_eq!(r.encode(), [0x80, 0x00, 0xc0, 0x01]);
        let p = IrdOrd::parse(&[0x80, 0x01, 0x80, 0x00]).unwrap();
        assert_eq!(
            p,
            IrdOrd {
                ird: 1,
                ord: 0,
                p2p: true,
                send_rtr: false,
                write_rtr: true,
                read_rtr: false
            }
        );
        let s = IrdOrd {
            ird: 5,
            ord: 6,
            p2p: true,
            send_rtr: true,
            write_rtr: false,
            read_rtr: false,
        };
        assert_eq!(s.encode(), [0xc0, 0x05, 0x00, 0x06]);
        assert_eq!(IrdOrd::parse(&[1, 2, 3]), Err(WireError::MissingIrdOrd));
    }

    #[test]
    fn truncated_and_corrupt() {
        for n in 0..SIW_REQ.len() {
            assert!(matches!(
                RrFrame::parse(&SIW_REQ[..n]),
                Err(WireError::Truncated { .. })
            ));
        }
        let mut bad = SIW_REQ;
        bad[3] = b'X';
        assert_eq!(RrFrame::parse(&bad), Err(WireError::BadMpaKey));
        let mut big = SIW_REQ;
        big[18] = 0x02;
        big[19] = 0x01; // 513
        assert_eq!(
            RrFrame::parse(&big),
            Err(WireError::PrivateDataTooLong(513))
        );
        // enhanced with pd_len < 4
        let mut short = REV1_REQ.to_vec();
        short[16] = 0x10;
        short[17] = 2;
        short[19] = 2;
        short.extend_from_slice(&[0, 0]);
        assert_eq!(RrFrame::parse(&short), Err(WireError::MissingIrdOrd));
    }

    #[test]
    fn framing_sizes() {
        assert_eq!(pad_len(14), 0);
        assert_eq!(pad_len(34), 0);
        assert_eq!(pad_len(15), 3);
        assert_eq!(pad_len(1450), 0);
        assert_eq!(fpdu_len(14), 20);
        assert_eq!(fpdu_len(8206), 8212);
        assert_eq!(fpdu_max(1460), 1456);
        assert_eq!(mulpdu(1460), 1450);
        assert_eq!(mulpdu(1448), 1442);
        assert_eq!(pad_len(mulpdu(1448)), 0);
        assert!(mulpdu(65495) <= 65535);
        assert_eq!(pad_len(mulpdu(65495)), 0);
    }
}
