//! Error types of the wire core and their mapping to RFC Terminate codes
//! (RFC 5040 §7, RFC 5041 §7, RFC 5044 §8 / RFC 6581 §8) and to
//! libibverbs work-completion status values.

use core::fmt;

/// libibverbs `enum ibv_wc_status` values (numeric values as in `verbs.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcStatus {
    Success = 0,
    LocLenErr = 1,
    LocQpOpErr = 2,
    LocProtErr = 4,
    WrFlushErr = 5,
    MwBindErr = 6,
    BadRespErr = 7,
    LocAccessErr = 8,
    RemInvReqErr = 9,
    RemAccessErr = 10,
    RemOpErr = 11,
    RetryExcErr = 12,
    RnrRetryExcErr = 13,
    FatalErr = 19,
    RespTimeoutErr = 20,
    GeneralErr = 21,
}

impl WcStatus {
    /// The libibverbs numeric value.
    pub fn as_u32(self) -> u32 {
        self as u32
    }
}

/// Terminate "Layer" nibble (RFC 5040 §4.8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Layer {
    Rdmap = 0,
    Ddp = 1,
    /// Lower layer protocol: MPA (RFC 5044 §8, RFC 6581 §8).
    Llp = 2,
}

impl Layer {
    pub fn from_u8(v: u8) -> Option<Layer> {
        match v {
            0 => Some(Layer::Rdmap),
            1 => Some(Layer::Ddp),
            2 => Some(Layer::Llp),
            _ => None,
        }
    }
}

/// A Terminate error triple: (layer, error type, error code).
///
/// Values per RFC 5040 §7 (RDMAP), RFC 5041 §7 (DDP), RFC 5044 §8 and
/// RFC 6581 §8 (MPA). The constants below name every code the core emits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TermCode {
    pub layer: u8,
    pub etype: u8,
    pub ecode: u8,
}

impl TermCode {
    pub const fn new(layer: u8, etype: u8, ecode: u8) -> TermCode {
        TermCode {
            layer,
            etype,
            ecode,
        }
    }

    // RDMAP, RFC 5040 §7.1/7.2
    pub const RDMAP_LOCAL_CATASTROPHIC: TermCode = TermCode::new(0, 0, 0);
    pub const RDMAP_INVALID_STAG: TermCode = TermCode::new(0, 1, 0x00);
    pub const RDMAP_BASE_BOUNDS: TermCode = TermCode::new(0, 1, 0x01);
    pub const RDMAP_ACCESS_RIGHTS: TermCode = TermCode::new(0, 1, 0x02);
    pub const RDMAP_STAG_NOT_ASSOC: TermCode = TermCode::new(0, 1, 0x03);
    pub const RDMAP_TO_WRAP: TermCode = TermCode::new(0, 1, 0x04);
    pub const RDMAP_CANNOT_INVALIDATE: TermCode = TermCode::new(0, 1, 0x09);
    pub const RDMAP_INVALID_VERSION: TermCode = TermCode::new(0, 2, 0x05);
    pub const RDMAP_UNEXPECTED_OPCODE: TermCode = TermCode::new(0, 2, 0x06);
    pub const RDMAP_CATASTROPHIC_STREAM: TermCode = TermCode::new(0, 2, 0x07);
    pub const RDMAP_CATASTROPHIC_GLOBAL: TermCode = TermCode::new(0, 2, 0x08);
    pub const RDMAP_UNSPECIFIED: TermCode = TermCode::new(0, 2, 0xff);

    // DDP, RFC 5041 §7
    pub const DDP_LOCAL_CATASTROPHIC: TermCode = TermCode::new(1, 0, 0);
    pub const DDP_T_INVALID_STAG: TermCode = TermCode::new(1, 1, 0x00);
    pub const DDP_T_BASE_BOUNDS: TermCode = TermCode::new(1, 1, 0x01);
    pub const DDP_T_STAG_NOT_ASSOC: TermCode = TermCode::new(1, 1, 0x02);
    pub const DDP_T_TO_WRAP: TermCode = TermCode::new(1, 1, 0x03);
    pub const DDP_T_INVALID_VERSION: TermCode = TermCode::new(1, 1, 0x04);
    pub const DDP_U_INVALID_QN: TermCode = TermCode::new(1, 2, 0x01);
    pub const DDP_U_NO_BUFFER: TermCode = TermCode::new(1, 2, 0x02);
    pub const DDP_U_INVALID_MSN: TermCode = TermCode::new(1, 2, 0x03);
    pub const DDP_U_INVALID_MO: TermCode = TermCode::new(1, 2, 0x04);
    pub const DDP_U_TOO_LONG: TermCode = TermCode::new(1, 2, 0x05);
    pub const DDP_U_INVALID_VERSION: TermCode = TermCode::new(1, 2, 0x06);

    // MPA, RFC 5044 §8 + RFC 6581 §8
    pub const MPA_STREAM_LOST: TermCode = TermCode::new(2, 0, 0x01);
    pub const MPA_CRC: TermCode = TermCode::new(2, 0, 0x02);
    pub const MPA_MARKER_MISMATCH: TermCode = TermCode::new(2, 0, 0x03);
    pub const MPA_INVALID_REQ_REP: TermCode = TermCode::new(2, 0, 0x04);
    pub const MPA_LOCAL_CATASTROPHIC: TermCode = TermCode::new(2, 0, 0x05);
    pub const MPA_INSUFFICIENT_IRD: TermCode = TermCode::new(2, 0, 0x06);
    pub const MPA_NO_MATCHING_RTR: TermCode = TermCode::new(2, 0, 0x07);

    pub fn layer(&self) -> Option<Layer> {
        Layer::from_u8(self.layer)
    }

    /// Status for the *requester's* work request when this Terminate is
    /// received from the peer (the remote side found the error).
    pub fn remote_wc_status(&self) -> WcStatus {
        match (self.layer, self.etype, self.ecode) {
            (0, 1, _) | (1, 1, _) => WcStatus::RemAccessErr,
            (0, 2, 0x05) | (0, 2, 0x06) => WcStatus::RemInvReqErr,
            (1, 2, _) => WcStatus::RemOpErr,
            (0, 2, _) => WcStatus::RemOpErr,
            (2, _, _) => WcStatus::FatalErr,
            _ => WcStatus::RemOpErr,
        }
    }
}

impl fmt::Display for TermCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let l = match self.layer {
            0 => "RDMAP",
            1 => "DDP",
            2 => "MPA",
            _ => "?",
        };
        write!(f, "{}/{:#x}/{:#04x}", l, self.etype, self.ecode)
    }
}

/// Parse errors of the wire codecs. Parsers return these, never panic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    /// More bytes are needed; the value is the total length needed so far
    /// (a lower bound).
    Truncated { need: usize },
    /// MPA key is neither "MPA ID Req Frame" nor "MPA ID Rep Frame".
    BadMpaKey,
    /// Private data length over RFC 5044 §7.1's 512 byte limit.
    PrivateDataTooLong(u16),
    /// An MPA v2 request/reply announced the enhanced bit but carries
    /// fewer than 4 bytes of private data.
    MissingIrdOrd,
    /// ULPDU length too short to hold the DDP header it announces.
    UlpduTooShort(u16),
    /// Unknown or not-allowed RDMAP opcode for this header.
    BadOpcode(u8),
    /// Terminate message body malformed.
    BadTerminate,
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self)
    }
}

impl std::error::Error for WireError {}

/// Tagged-buffer check failures returned by [`crate::placement::Memory`].
/// RFC 5041 §7.2 / RFC 5040 §7.1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaggedError {
    InvalidStag,
    BaseBounds,
    AccessRights,
    StagNotAssociated,
    ToWrap,
    /// An atomic whose target buffer address is not 64-bit aligned (RFC 7306
    /// §5.1.1, §5.1.2, §8.2).
    Misaligned,
}

impl TaggedError {
    /// Code when detected by DDP on inbound tagged placement (Write, Read
    /// Response). DDP has no "access rights" code; like siw, report base/bounds.
    pub fn ddp_code(self) -> TermCode {
        match self {
            TaggedError::InvalidStag => TermCode::DDP_T_INVALID_STAG,
            TaggedError::BaseBounds => TermCode::DDP_T_BASE_BOUNDS,
            TaggedError::AccessRights => TermCode::DDP_T_BASE_BOUNDS,
            TaggedError::StagNotAssociated => TermCode::DDP_T_STAG_NOT_ASSOC,
            TaggedError::ToWrap => TermCode::DDP_T_TO_WRAP,
            // Only atomics check alignment, and they are RDMAP's; should DDP see it, the
            // address is what is wrong.
            TaggedError::Misaligned => TermCode::DDP_T_BASE_BOUNDS,
        }
    }

    /// Code when detected by RDMAP on a Read Request's (or Atomic's)
    /// data source: RFC 5040 §7.1 "Remote Protection Error", and RFC 7306
    /// §8.2's Remote Operation Error for a misaligned atomic.
    pub fn rdmap_code(self) -> TermCode {
        match self {
            TaggedError::InvalidStag => TermCode::RDMAP_INVALID_STAG,
            TaggedError::BaseBounds => TermCode::RDMAP_BASE_BOUNDS,
            TaggedError::AccessRights => TermCode::RDMAP_ACCESS_RIGHTS,
            TaggedError::StagNotAssociated => TermCode::RDMAP_STAG_NOT_ASSOC,
            TaggedError::ToWrap => TermCode::RDMAP_TO_WRAP,
            // RFC 7306 §8.2: "RDMA Layer Remote Operation Error with Error Code Name
            // 'Catastrophic error, localized to RDMAP Stream'".
            TaggedError::Misaligned => TermCode::RDMAP_CATASTROPHIC_STREAM,
        }
    }
}

/// Errors returned by the posting API of [`crate::conn::Connection`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PostError {
    /// Connection not in a state that accepts this operation.
    InvalidState,
    /// Operation needs RFC 7306 extensions the peer did not negotiate.
    NotSupported,
    /// Bad argument (e.g. Send with Invalidate without STag).
    InvalidArgument,
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self)
    }
}

impl std::error::Error for PostError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wc_values() {
        assert_eq!(WcStatus::Success.as_u32(), 0);
        assert_eq!(WcStatus::LocProtErr.as_u32(), 4);
        assert_eq!(WcStatus::RemAccessErr.as_u32(), 10);
        assert_eq!(WcStatus::FatalErr.as_u32(), 19);
        assert_eq!(WcStatus::GeneralErr.as_u32(), 21);
    }

    #[test]
    fn tagged_mapping() {
        assert_eq!(
            TaggedError::AccessRights.ddp_code(),
            TermCode::DDP_T_BASE_BOUNDS
        );
        assert_eq!(
            TaggedError::AccessRights.rdmap_code(),
            TermCode::RDMAP_ACCESS_RIGHTS
        );
        assert_eq!(
            TermCode::RDMAP_INVALID_STAG.remote_wc_status(),
            WcStatus::RemAccessErr
        );
        assert_eq!(
            TermCode::RDMAP_UNEXPECTED_OPCODE.remote_wc_status(),
            WcStatus::RemInvReqErr
        );
        assert_eq!(format!("{}", TermCode::DDP_U_NO_BUFFER), "DDP/0x2/0x02");
    }
}
