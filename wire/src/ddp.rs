//! DDP headers (RFC 5041 §4).
//!
//! ```text
//! byte 0: T | L | Rsvd(4) | DV(2)          DDP control  (§4.2)
//! byte 1: RsvdULP[0..8]                    = RDMAP control (RFC 5040 §4.2)
//! tagged   (§4.3): STag(32) TO(64)                           → 14 bytes
//! untagged (§4.4): RsvdULP[8..40](32) QN(32) MSN(32) MO(32)  → 18 bytes
//! ```
//! RDMAP uses the untagged RsvdULP word as "Invalidate STag" (Send with
//! Invalidate) or reserved. Parsers keep every reserved bit so encoding a
//! parsed header reproduces the input byte for byte. Semantic checks (DV=1,
//! RV=1) are left to the receiver logic so it can answer with the right
//! Terminate code.

use crate::error::WireError;
use crate::rdmap::RdmapCtrl;

pub const TAGGED_HDR_LEN: usize = 14;
pub const UNTAGGED_HDR_LEN: usize = 18;
pub const FLAG_TAGGED: u8 = 0x80;
pub const FLAG_LAST: u8 = 0x40;
pub const DDP_VERSION: u8 = 1;

/// Untagged queue numbers used by RDMAP: RFC 5040 §5.1 (0 Send, 1 Read
/// Request, 2 Terminate — all that siw knows) and RFC 7306 §4.1 Figure 2,
/// §5.2 and §10.2 (Immediate Data on queue 0 like a Send, Atomic Requests on
/// queue 1 beside the Read Requests, Atomic Responses on the new queue 3).
pub mod qn {
    pub const SEND: u32 = 0;
    pub const READ_REQUEST: u32 = 1;
    pub const TERMINATE: u32 = 2;
    /// RFC 7306 §5.2, §5.2.1 rule 5: "the same Queue Number as RDMA Read
    /// Requests (QN=1)" — one MSN sequence and one IRD/ORD for both.
    pub const ATOMIC_REQUEST: u32 = READ_REQUEST;
    /// RFC 7306 §5.2, §5.2.2 rule 3, §10.2 ("Queue 3 (Atomic Response
    /// operations)").
    pub const ATOMIC_RESPONSE: u32 = 3;
    /// Queues 0..COUNT exist; each has its own MSN sequence (RFC 5041 §5.3).
    pub const COUNT: usize = 4;
}

/// Buffer-model specific fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferModel {
    /// RFC 5041 §4.3.
    Tagged { stag: u32, to: u64 },
    /// RFC 5041 §4.4. `rsvd_ulp` is RDMAP's Invalidate STag / reserved word.
    Untagged {
        rsvd_ulp: u32,
        qn: u32,
        msn: u32,
        mo: u32,
    },
}

/// A parsed DDP header including the RDMAP control byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DdpHeader {
    pub last: bool,
    /// The 4 reserved bits of the DDP control byte (should be 0).
    pub rsvd: u8,
    /// DDP version, must be 1.
    pub dv: u8,
    pub rdmap: RdmapCtrl,
    pub model: BufferModel,
}

impl DdpHeader {
    pub fn tagged(stag: u32, to: u64, last: bool, rdmap: RdmapCtrl) -> DdpHeader {
        DdpHeader {
            last,
            rsvd: 0,
            dv: DDP_VERSION,
            rdmap,
            model: BufferModel::Tagged { stag, to },
        }
    }

    pub fn untagged(
        qn: u32,
        msn: u32,
        mo: u32,
        rsvd_ulp: u32,
        last: bool,
        rdmap: RdmapCtrl,
    ) -> DdpHeader {
        DdpHeader {
            last,
            rsvd: 0,
            dv: DDP_VERSION,
            rdmap,
            model: BufferModel::Untagged {
                rsvd_ulp,
                qn,
                msn,
                mo,
            },
        }
    }

    pub fn is_tagged(&self) -> bool {
        matches!(self.model, BufferModel::Tagged { .. })
    }

    /// Header length on the wire (14 or 18).
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        if self.is_tagged() {
            TAGGED_HDR_LEN
        } else {
            UNTAGGED_HDR_LEN
        }
    }

    /// Header length implied by a DDP control byte.
    pub fn len_for_ctrl(ctrl: u8) -> usize {
        if ctrl & FLAG_TAGGED != 0 {
            TAGGED_HDR_LEN
        } else {
            UNTAGGED_HDR_LEN
        }
    }

    /// The DDP control byte.
    pub fn ctrl_byte(&self) -> u8 {
        let mut b = (self.rsvd & 0x0f) << 2 | (self.dv & 3);
        if self.is_tagged() {
            b |= FLAG_TAGGED;
        }
        if self.last {
            b |= FLAG_LAST;
        }
        b
    }

    /// Parse at the start of `buf`; returns the header and its length.
    pub fn parse(buf: &[u8]) -> Result<(DdpHeader, usize), WireError> {
        if buf.is_empty() {
            return Err(WireError::Truncated {
                need: TAGGED_HDR_LEN,
            });
        }
        let c = buf[0];
        let len = Self::len_for_ctrl(c);
        if buf.len() < len {
            return Err(WireError::Truncated { need: len });
        }
        let rdmap = RdmapCtrl::from_byte(buf[1]);
        let be32 = |o: usize| u32::from_be_bytes([buf[o], buf[o + 1], buf[o + 2], buf[o + 3]]);
        let model = if c & FLAG_TAGGED != 0 {
            let mut to = [0u8; 8];
            to.copy_from_slice(&buf[6..14]);
            BufferModel::Tagged {
                stag: be32(2),
                to: u64::from_be_bytes(to),
            }
        } else {
            BufferModel::Untagged {
                rsvd_ulp: be32(2),
                qn: be32(6),
                msn: be32(10),
                mo: be32(14),
            }
        };
        Ok((
            DdpHeader {
                last: c & FLAG_LAST != 0,
                rsvd: (c >> 2) & 0x0f,
                dv: c & 3,
                rdmap,
                model,
            },
            len,
        ))
    }

    /// Encode into `out` (at least [`DdpHeader::len`] bytes); returns the length.
    pub fn encode(&self, out: &mut [u8]) -> usize {
        out[0] = self.ctrl_byte();
        out[1] = self.rdmap.to_byte();
        match self.model {
            BufferModel::Tagged { stag, to } => {
                out[2..6].copy_from_slice(&stag.to_be_bytes());
                out[6..14].copy_from_slice(&to.to_be_bytes());
                TAGGED_HDR_LEN
            }
            BufferModel::Untagged {
                rsvd_ulp,
                qn,
                msn,
                mo,
            } => {
                out[2..6].copy_from_slice(&rsvd_ulp.to_be_bytes());
                out[6..10].copy_from_slice(&qn.to_be_bytes());
                out[10..14].copy_from_slice(&msn.to_be_bytes());
                out[14..18].copy_from_slice(&mo.to_be_bytes());
                UNTAGGED_HDR_LEN
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rdmap::Opcode;

    #[test]
    fn tagged_literal() {
        // siw-write-p2p frame 8 (zero-length Write RTR), after the MPA length.
        let b = [0xc1, 0x40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0];
        let (h, n) = DdpHeader::parse(&b).unwrap();
        assert_eq!(n, 14);
        assert!(h.last && h.is_tagged());
        assert_eq!(h.dv, 1);
        assert_eq!(h.rdmap.opcode, Opcode::Write as u8);
        assert_eq!(h.model, BufferModel::Tagged { stag: 1, to: 0 });
        let mut out = [0u8; 18];
        assert_eq!(h.encode(&mut out), 14);
        assert_eq!(&out[..14], &b);
    }

    #[test]
    fn untagged_literal() {
        // siw-write frame 8: Send, QN 0, MSN 1, MO 0.
        let b = [0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];
        let (h, n) = DdpHeader::parse(&b).unwrap();
        assert_eq!(n, 18);
        assert_eq!(
            h.model,
            BufferModel::Untagged {
                rsvd_ulp: 0,
                qn: 0,
                msn: 1,
                mo: 0
            }
        );
        assert_eq!(h.rdmap.opcode, Opcode::Send as u8);
        let mut out = [0u8; 18];
        h.encode(&mut out);
        assert_eq!(out, b);
        for i in 0..18 {
            assert!(matches!(
                DdpHeader::parse(&b[..i]),
                Err(WireError::Truncated { .. })
            ));
        }
    }

    #[test]
    fn reserved_bits_round_trip() {
        let b = [0xbe, 0x7f, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];
        let (h, _) = DdpHeader::parse(&b).unwrap();
        assert_eq!(h.dv, 2);
        assert_eq!(h.rsvd, 0x0f);
        let mut out = [0u8; 14];
        h.encode(&mut out);
        assert_eq!(out, b);
    }
}
