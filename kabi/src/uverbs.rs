//! Records of the kernel's uverbs ABI (`rdma/ib_user_verbs.h`) that uiw produces itself,
//! because libibverbs reads them from file descriptors a kernel would own.

use crate::verbs::{ib_uverbs_async_event_desc, ib_uverbs_comp_event_desc};

/// The 16-byte record `ibv_get_async_event` reads from `context->async_fd`:
/// the object's user pointer (`ibv_cq*`, `ibv_qp*`, `ibv_srq*`, or the port number) and the
/// `ibv_event_type`.
pub fn async_event_record(element: u64, event_type: u32) -> [u8; 16] {
    let desc = ib_uverbs_async_event_desc { element, event_type, reserved: 0 };
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&desc.element.to_ne_bytes());
    out[8..12].copy_from_slice(&desc.event_type.to_ne_bytes());
    out
}

/// The 8-byte record `ibv_get_cq_event` reads from a completion channel: the `ibv_cq*`.
pub fn comp_event_record(cq_handle: u64) -> [u8; 8] {
    let desc = ib_uverbs_comp_event_desc { cq_handle };
    desc.cq_handle.to_ne_bytes()
}

/// `IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL`, the legacy write() command
/// `ibv_create_comp_channel` sends to `cmd_fd`.
pub const CMD_CREATE_COMP_CHANNEL: u32 = crate::verbs::ib_uverbs_write_cmds::IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL;

/// A parsed legacy uverbs write command: `struct ib_uverbs_cmd_hdr` and the `response`
/// pointer every legacy command carries first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteCmd {
    pub command: u32,
    pub in_words: u16,
    pub out_words: u16,
    pub response: u64,
}

impl WriteCmd {
    /// Parses `hdr` + `response` from the bytes libibverbs wrote; `None` if too short or if
    /// the header's size does not match the buffer (`in_words` counts 4-byte words).
    pub fn parse(buf: &[u8]) -> Option<WriteCmd> {
        if buf.len() < 16 {
            return None;
        }
        let command = u32::from_ne_bytes(buf[0..4].try_into().ok()?);
        let in_words = u16::from_ne_bytes(buf[4..6].try_into().ok()?);
        let out_words = u16::from_ne_bytes(buf[6..8].try_into().ok()?);
        let response = u64::from_ne_bytes(buf[8..16].try_into().ok()?);
        if usize::from(in_words) * 4 != buf.len() {
            return None;
        }
        Some(WriteCmd { command, in_words, out_words, response })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_have_the_kernel_sizes() {
        assert_eq!(core::mem::size_of::<ib_uverbs_async_event_desc>(), 16);
        assert_eq!(core::mem::size_of::<ib_uverbs_comp_event_desc>(), 8);
        let r = async_event_record(0x1122_3344_5566_7788, 3);
        assert_eq!(&r[..8], &0x1122_3344_5566_7788u64.to_ne_bytes());
        assert_eq!(&r[8..12], &3u32.to_ne_bytes());
        assert_eq!(&r[12..], &[0; 4]);
    }

    #[test]
    fn parses_the_create_comp_channel_command() {
        let mut b = Vec::new();
        b.extend_from_slice(&CMD_CREATE_COMP_CHANNEL.to_ne_bytes());
        b.extend_from_slice(&6u16.to_ne_bytes()); // 24 bytes
        b.extend_from_slice(&1u16.to_ne_bytes());
        b.extend_from_slice(&0xdead_beefu64.to_ne_bytes());
        b.extend_from_slice(&[0; 8]);
        let c = WriteCmd::parse(&b).unwrap();
        assert_eq!((c.command, c.out_words, c.response), (CMD_CREATE_COMP_CHANNEL, 1, 0xdead_beef));
        assert_eq!(WriteCmd::parse(&b[..20]), None);
        assert_eq!(WriteCmd::parse(&b[..8]), None);
    }
}
