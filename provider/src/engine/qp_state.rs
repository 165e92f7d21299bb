//! RC queue-pair state machine and attribute validation for `ibv_modify_qp`
//! and `ibv_create_qp`, enforced the way a kernel RDMA provider enforces it.
//!
//! Everything here is a pure function over plain data: the provider decodes
//! `struct ibv_qp_attr` / `struct ibv_qp_init_attr` into [`QpAttrs`] /
//! [`QpCap`], calls [`validate_modify`] / [`validate_create`], and on success
//! tells the engine what to do from the returned [`Transition`] and stores
//! the new attributes with [`apply`].  Errors carry the errno the verb must
//! return ([`ModifyError::errno`], [`CreateError::errno`]) and a human
//! sentence ([`ModifyError::describe`]) the provider can print when debugging
//! is enabled.
//!
//! # Sources
//!
//! * The transition table is the RC column of the InfiniBand Architecture
//!   Specification Vol. 1, §11.2.4.2 "Modify Queue Pair" (the per-transition
//!   required/optional attribute table, Table 91 "QP State Transition
//!   Properties" in Release 1.2/1.3) as encoded by Linux
//!   `drivers/infiniband/core/verbs.c`: `qp_state_table[][]` and
//!   `ib_modify_qp_is_ok()`.  rxe (`rxe_qp.c`, `__qp_chk_state`) and mlx5
//!   call that function from their modify path and return `-EINVAL` when it
//!   fails.
//! * Checks done before the driver runs are those of
//!   `drivers/infiniband/core/uverbs_cmd.c` (`ib_uverbs_modify_qp`,
//!   `modify_qp`): unknown mask bits → `EOPNOTSUPP`; invalid `port_num`,
//!   `ah_attr.port_num`, state values → `EINVAL`; and `_ib_modify_qp()` in
//!   `verbs.c`: alternate paths on a non-InfiniBand port → `EINVAL`, PSNs
//!   silently masked to 24 bits.
//! * Value checks follow `rxe_qp_chk_attr()` (`rxe_qp.c`): path MTU ≤ port
//!   max, `timeout` ≤ 31, `max_rd_atomic` ≤ device limit, unknown access
//!   flags → `EINVAL`.
//! * Creation follows `siw_create_qp()` (`siw_verbs.c`) — the in-kernel
//!   software iWARP provider uiw mirrors — cross-checked with
//!   `rxe_qp_chk_init()`/`rxe_qp_chk_cap()`.
//!
//! # Errno decisions
//!
//! | condition | errno | source |
//! |---|---|---|
//! | bad transition / missing required / attribute not allowed in this transition | `EINVAL` | `ib_modify_qp_is_ok` via rxe/mlx5 |
//! | `IBV_QP_CAP` (resize) | `EINVAL` | not in any row of `qp_state_table` |
//! | out-of-range value (MTU, timeout, retry counts, RNR timer, rd_atomic, pkey index, access bits) | `EINVAL` | `rxe_qp_chk_attr` |
//! | `port_num` ≠ 1, AV `port_num` ≠ 1 or ≠ QP port at INIT→RTR | `EINVAL` | `uverbs_cmd.c modify_qp` |
//! | `IBV_QP_ALT_PATH` | `EINVAL` | `_ib_modify_qp`: APM only on IB ports |
//! | AV not global / not `::ffff:a.b.c.d` / unusable IPv4 / bad `sgid_index` | `EINVAL` | uiw (iWARP needs an IP peer; same errno as the core's AV checks) |
//! | mask bits outside bits 0..=20 (incl. `IBV_QP_RATE_LIMIT`) | `EOPNOTSUPP` | `ib_uverbs_modify_qp`; siw `siw_verbs_modify_qp` |
//! | table-valid transition uiw does not implement (→SQD, SQD→RTS/SQD, SQE→RTS) | `EOPNOTSUPP` | uiw: a legal request, an absent feature |
//! | `mask == 0` | success, no-op | siw `siw_verbs_modify_qp` |
//! | create: QP type other than RC | `EOPNOTSUPP` | `siw_create_qp`, `rxe_qp_chk_init` |
//! | create: `create_flags` ≠ 0 | `EOPNOTSUPP` | `siw_create_qp` |
//! | create: WR/SGE/inline past limits, zero-sized SQ | `EINVAL` | `siw_create_qp`, `rxe_qp_chk_cap` |
//! | create: object count past `max_qp`/`max_cq`/... | `ENOMEM` | `siw_create_qp`, `siw_alloc_pd`, ... |
//!
//! Two deliberate points where uiw is stricter than some kernel drivers:
//! `IBV_QP_CUR_STATE`, when given, must equal the QP's real state (rxe and
//! mlx5 simply trust the caller's value as the "from" state), and
//! `dest_qp_num` must fit the 24-bit QPN space (IBTA §9.2, BTH DestQP).

#![forbid(unsafe_code)]
#![allow(dead_code)]

use super::limits::DeviceLimits;
use std::fmt;

/// Linux errno values used by this module (asm-generic/errno*.h; identical
/// on x86-64 and aarch64).
pub mod errno {
    /// Cannot allocate memory / resource limit reached.
    pub const ENOMEM: i32 = 12;
    /// Invalid argument.
    pub const EINVAL: i32 = 22;
    /// Operation not supported.
    pub const EOPNOTSUPP: i32 = 95;
}

/// `enum ibv_qp_state`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub enum QpState {
    /// `IBV_QPS_RESET`
    #[default]
    Reset = 0,
    /// `IBV_QPS_INIT`
    Init = 1,
    /// `IBV_QPS_RTR`
    Rtr = 2,
    /// `IBV_QPS_RTS`
    Rts = 3,
    /// `IBV_QPS_SQD`
    Sqd = 4,
    /// `IBV_QPS_SQE`
    Sqe = 5,
    /// `IBV_QPS_ERR`
    Err = 6,
}

impl QpState {
    /// Every state, in numeric order.
    pub const ALL: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];

    /// Decodes an `ibv_qp_state` value; `None` past `IBV_QPS_ERR`.
    pub fn from_u32(v: u32) -> Option<QpState> {
        QpState::ALL.get(v as usize).copied()
    }

    /// Decodes a state value taken from `ibv_qp_attr.<field>`; values past
    /// `IBV_QPS_ERR` are rejected with `EINVAL`, as `uverbs_cmd.c modify_qp`
    /// does for `qp_state` and `cur_qp_state`.
    pub fn parse(v: u32, field: &'static str) -> Result<QpState, ModifyError> {
        QpState::from_u32(v).ok_or(ModifyError::BadStateValue { field, value: v })
    }

    /// The numeric `ibv_qp_state` value.
    pub fn as_u32(self) -> u32 {
        self as u32
    }

    /// Upper-case name as the kernel prints it ("RESET", "INIT", ...).
    pub fn name(self) -> &'static str {
        match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
        }
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `enum ibv_qp_attr_mask` (libibverbs/verbs.h).
pub mod mask {
    pub const STATE: u32 = 1 << 0;
    pub const CUR_STATE: u32 = 1 << 1;
    pub const EN_SQD_ASYNC_NOTIFY: u32 = 1 << 2;
    pub const ACCESS_FLAGS: u32 = 1 << 3;
    pub const PKEY_INDEX: u32 = 1 << 4;
    pub const PORT: u32 = 1 << 5;
    pub const QKEY: u32 = 1 << 6;
    pub const AV: u32 = 1 << 7;
    pub const PATH_MTU: u32 = 1 << 8;
    pub const TIMEOUT: u32 = 1 << 9;
    pub const RETRY_CNT: u32 = 1 << 10;
    pub const RNR_RETRY: u32 = 1 << 11;
    pub const RQ_PSN: u32 = 1 << 12;
    pub const MAX_QP_RD_ATOMIC: u32 = 1 << 13;
    pub const ALT_PATH: u32 = 1 << 14;
    pub const MIN_RNR_TIMER: u32 = 1 << 15;
    pub const SQ_PSN: u32 = 1 << 16;
    pub const MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
    pub const PATH_MIG_STATE: u32 = 1 << 18;
    pub const CAP: u32 = 1 << 19;
    pub const DEST_QPN: u32 = 1 << 20;
    /// `_IBV_QP_SMAC` .. `_IBV_QP_ALT_VID` (bits 21..=24): reserved, never
    /// accepted from user space.
    pub const RESERVED_21_24: u32 = 0xf << 21;
    pub const RATE_LIMIT: u32 = 1 << 25;
    /// `IB_QP_ATTR_STANDARD_BITS` = GENMASK(20, 0): what the kernel's
    /// `ib_uverbs_modify_qp` accepts; anything else is `EOPNOTSUPP`.
    pub const STANDARD_BITS: u32 = (1 << 21) - 1;

    const NAMES: [(u32, &str); 22] = [
        (STATE, "STATE"),
        (CUR_STATE, "CUR_STATE"),
        (EN_SQD_ASYNC_NOTIFY, "EN_SQD_ASYNC_NOTIFY"),
        (ACCESS_FLAGS, "ACCESS_FLAGS"),
        (PKEY_INDEX, "PKEY_INDEX"),
        (PORT, "PORT"),
        (QKEY, "QKEY"),
        (AV, "AV"),
        (PATH_MTU, "PATH_MTU"),
        (TIMEOUT, "TIMEOUT"),
        (RETRY_CNT, "RETRY_CNT"),
        (RNR_RETRY, "RNR_RETRY"),
        (RQ_PSN, "RQ_PSN"),
        (MAX_QP_RD_ATOMIC, "MAX_QP_RD_ATOMIC"),
        (ALT_PATH, "ALT_PATH"),
        (MIN_RNR_TIMER, "MIN_RNR_TIMER"),
        (SQ_PSN, "SQ_PSN"),
        (MAX_DEST_RD_ATOMIC, "MAX_DEST_RD_ATOMIC"),
        (PATH_MIG_STATE, "PATH_MIG_STATE"),
        (CAP, "CAP"),
        (DEST_QPN, "DEST_QPN"),
        (RATE_LIMIT, "RATE_LIMIT"),
    ];

    /// `"AV|PATH_MTU|0x200000"`-style rendering of a mask ("0" when empty).
    pub fn names(m: u32) -> String {
        let mut parts: Vec<String> = Vec::new();
        let mut rest = m;
        for (bit, name) in NAMES {
            if m & bit != 0 {
                parts.push(format!("IBV_QP_{name}"));
                rest &= !bit;
            }
        }
        if rest != 0 {
            parts.push(format!("{rest:#x}"));
        }
        if parts.is_empty() {
            "0".to_string()
        } else {
            parts.join("|")
        }
    }
}

/// `enum ibv_access_flags`, shared with memory regions.
pub use super::access;

/// `enum ibv_qp_type` values.
pub mod qp_type {
    pub const RC: u32 = 2;
    pub const UC: u32 = 3;
    pub const UD: u32 = 4;
    pub const RAW_PACKET: u32 = 8;
    pub const XRC_SEND: u32 = 9;
    pub const XRC_RECV: u32 = 10;
    pub const DRIVER: u32 = 0xff;
}

/// `enum ibv_mig_state` values.
pub mod mig_state {
    pub const MIGRATED: u32 = 0;
    pub const REARM: u32 = 1;
    pub const ARMED: u32 = 2;
}

/// PSNs are 24-bit (IBTA §9.7.1); the core masks larger values.
pub const PSN_MASK: u32 = 0x00ff_ffff;
/// QP numbers are 24-bit (IBTA §9.2, BTH DestQP).
pub const QPN_MASK: u32 = 0x00ff_ffff;
/// Largest `timeout` / `min_rnr_timer` encoding (5-bit fields).
pub const MAX_TIMER_ENC: u8 = 31;
/// Largest `retry_cnt` / `rnr_retry` (3-bit fields; 7 = infinite RNR retry).
pub const MAX_RETRY: u8 = 7;

/// `struct ibv_qp_cap`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// The primary path, `struct ibv_ah_attr` (with its `ibv_global_route`
/// flattened in).  On uiw it names a TCP/IPv4 peer: `is_global` = 1 and
/// `dgid` = `::ffff:a.b.c.d`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AhAttr {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

impl AhAttr {
    /// A global AV for IPv4 peer `addr` on port 1, sgid index 0.
    pub fn ipv4(addr: [u8; 4]) -> AhAttr {
        AhAttr {
            dgid: ipv4_mapped_gid(addr),
            is_global: 1,
            port_num: 1,
            hop_limit: 64,
            ..AhAttr::default()
        }
    }

    /// The IPv4 address if `dgid` is IPv4-mapped (`::ffff:a.b.c.d`).
    pub fn dest_ipv4(&self) -> Option<[u8; 4]> {
        gid_to_ipv4(&self.dgid)
    }
}

/// `::ffff:a.b.c.d` as a 16-byte GID.
pub fn ipv4_mapped_gid(addr: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&addr);
    g
}

/// Inverse of [`ipv4_mapped_gid`]: `None` unless the GID is IPv4-mapped.
pub fn gid_to_ipv4(gid: &[u8; 16]) -> Option<[u8; 4]> {
    if gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff {
        Some([gid[12], gid[13], gid[14], gid[15]])
    } else {
        None
    }
}

/// The `ibv_qp_attr` fields uiw keeps for an RC QP (no Q_Key, no alternate
/// path, no rate limit: those are rejected by [`validate_modify`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpAttrs {
    pub qp_state: QpState,
    pub cur_qp_state: QpState,
    /// `enum ibv_mtu` (1..=5).
    pub path_mtu: u32,
    /// `enum ibv_mig_state`.
    pub path_mig_state: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub cap: QpCap,
    pub ah: AhAttr,
    pub pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    /// Initiator depth (ORD).
    pub max_rd_atomic: u8,
    /// Responder depth (IRD).
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    /// The QP's port (`IBV_QP_PORT`), distinct from `ah.port_num`.
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
}

/// Attributes of a freshly created QP: RESET, the caps returned by
/// [`validate_create`], everything else zero except `path_mtu`, which starts
/// at `IBV_MTU_1024` (what siw reports for a 1500-byte Ethernet link) so that
/// `ibv_query_qp` never shows the invalid value 0.
pub fn init_attrs_from_create(cap: &QpCap) -> QpAttrs {
    QpAttrs {
        qp_state: QpState::Reset,
        cur_qp_state: QpState::Reset,
        path_mtu: super::limits::IBV_MTU_1024,
        path_mig_state: mig_state::MIGRATED,
        cap: *cap,
        ..QpAttrs::default()
    }
}

/// Required and optional attributes of one transition (RC column).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    pub required: u32,
    pub optional: u32,
}

/// The RC entry of the IBTA transition table (Vol. 1 §11.2.4.2), as encoded
/// by `qp_state_table` in `drivers/infiniband/core/verbs.c`.  `None` means
/// the transition is not valid at all.  `IBV_QP_STATE` is implicitly allowed
/// everywhere and is not part of either mask.
///
/// Notable consequences, all faithful to the kernel:
/// * RESET→ERR is *not* valid (IBTA: "to Error from any state except
///   Reset"); RESET→RESET and ERR→ERR are.
/// * →RESET and →ERR accept no attribute but `STATE`.
/// * `CUR_STATE` is only optional for RTR→RTS, RTS→RTS and SQD→RTS.
/// * `CAP`, `QKEY` and `RATE_LIMIT` appear in no RC entry.
pub fn rc_rule(from: QpState, to: QpState) -> Option<Rule> {
    use mask::*;
    use QpState::*;
    let r = |required: u32, optional: u32| Some(Rule { required, optional });
    match (from, to) {
        (Reset, Reset) => r(0, 0),
        (Reset, Init) => r(PKEY_INDEX | PORT | ACCESS_FLAGS, 0),

        (Init, Reset) | (Init, Err) => r(0, 0),
        (Init, Init) => r(0, PKEY_INDEX | PORT | ACCESS_FLAGS),
        (Init, Rtr) => r(
            AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER,
            ALT_PATH | ACCESS_FLAGS | PKEY_INDEX,
        ),

        (Rtr, Reset) | (Rtr, Err) => r(0, 0),
        (Rtr, Rts) => r(
            TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC,
            CUR_STATE | ALT_PATH | ACCESS_FLAGS | MIN_RNR_TIMER | PATH_MIG_STATE,
        ),

        (Rts, Reset) | (Rts, Err) => r(0, 0),
        (Rts, Rts) => r(
            0,
            CUR_STATE | ACCESS_FLAGS | ALT_PATH | PATH_MIG_STATE | MIN_RNR_TIMER,
        ),
        (Rts, Sqd) => r(0, EN_SQD_ASYNC_NOTIFY),

        (Sqd, Reset) | (Sqd, Err) => r(0, 0),
        (Sqd, Rts) => r(
            0,
            CUR_STATE | ALT_PATH | ACCESS_FLAGS | MIN_RNR_TIMER | PATH_MIG_STATE,
        ),
        (Sqd, Sqd) => r(
            0,
            PORT | AV
                | TIMEOUT
                | RETRY_CNT
                | RNR_RETRY
                | MAX_QP_RD_ATOMIC
                | MAX_DEST_RD_ATOMIC
                | ALT_PATH
                | ACCESS_FLAGS
                | PKEY_INDEX
                | MIN_RNR_TIMER
                | PATH_MIG_STATE,
        ),

        (Sqe, Reset) | (Sqe, Err) => r(0, 0),
        // Valid, but the kernel table lists no RC optional attributes.
        (Sqe, Rts) => r(0, 0),

        (Err, Reset) | (Err, Err) => r(0, 0),

        _ => None,
    }
}

/// Whether uiw implements a table-valid transition.  The send-queue-drain
/// state (SQD) and the SQ-error recovery path are not implemented: an RC QP
/// on uiw never enters SQD or SQE (send errors move it straight to ERR, as
/// on siw), so →SQD, SQD→RTS/SQD and SQE→RTS are refused with `EOPNOTSUPP`.
/// SQD/SQE → RESET/ERR stay allowed for completeness.
pub fn uiw_supports(from: QpState, to: QpState) -> bool {
    !matches!(
        (from, to),
        (_, QpState::Sqd) | (QpState::Sqd, QpState::Rts) | (QpState::Sqe, QpState::Rts)
    )
}

/// What the engine has to do for an accepted `ibv_modify_qp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transition {
    pub from: QpState,
    pub to: QpState,
    /// Attribute bits [`apply`] will store (the request mask without
    /// `STATE`/`CUR_STATE`).
    pub attrs: u32,
    /// `from != to`.
    pub state_change: bool,
    /// INIT→RTR: the peer (AV `dgid` = IPv4 address, `dest_qp_num`) is now
    /// known; the engine establishes or accepts the TCP/MPA connection.
    pub connect: bool,
    /// Entering RTS (from RTR): the send queue may start processing.
    pub start_sq: bool,
    /// Entering ERR from another state: flush all outstanding and future WRs
    /// with `IBV_WC_WR_FLUSH_ERR`.
    pub flush: bool,
    /// Leaving a connected state (RTR/RTS/SQD/SQE) for ERR or RESET: close
    /// the TCP/MPA stream (abortively; siw sends a TERMINATE first).
    pub disconnect: bool,
    /// Entering RESET from another state: discard queue contents and engine
    /// state; the QP can then be reused from RESET→INIT.
    pub reset: bool,
}

impl Transition {
    fn new(from: QpState, to: QpState, mask_bits: u32) -> Transition {
        let connected =
            |s: QpState| matches!(s, QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe);
        Transition {
            from,
            to,
            attrs: mask_bits & !(mask::STATE | mask::CUR_STATE),
            state_change: from != to,
            connect: from == QpState::Init && to == QpState::Rtr,
            start_sq: from == QpState::Rtr && to == QpState::Rts,
            flush: to == QpState::Err && from != QpState::Err,
            disconnect: connected(from) && matches!(to, QpState::Err | QpState::Reset),
            reset: to == QpState::Reset && from != QpState::Reset,
        }
    }
}

/// Why an `ibv_modify_qp` was refused.  [`ModifyError::errno`] gives the
/// errno to return; [`ModifyError::describe`] a sentence for debug output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModifyError {
    /// `qp_state` / `cur_qp_state` beyond `IBV_QPS_ERR` (`EINVAL`, uverbs).
    BadStateValue { field: &'static str, value: u32 },
    /// Mask bits outside `IB_QP_ATTR_STANDARD_BITS`, including
    /// `IBV_QP_RATE_LIMIT` (`EOPNOTSUPP`, uverbs/siw).
    UnsupportedMaskBits { bits: u32 },
    /// `port_num` is not a valid port (`EINVAL`, uverbs).
    BadPort { port: u8 },
    /// `ah_attr.port_num` invalid, or ≠ the QP's port at INIT→RTR
    /// (`EINVAL`, uverbs).
    BadAhPort { port: u8, qp_port: u8 },
    /// `IBV_QP_ALT_PATH`: no APM on iWARP (`EINVAL`, `_ib_modify_qp`).
    AltPathUnsupported,
    /// `IBV_QP_CUR_STATE` does not match the QP's state (`EINVAL`).
    CurStateMismatch { claimed: QpState, actual: QpState },
    /// The transition is not in the IBTA table (`EINVAL`).
    BadTransition { from: QpState, to: QpState },
    /// Required attributes are missing from the mask (`EINVAL`).
    MissingRequired {
        from: QpState,
        to: QpState,
        missing: u32,
    },
    /// Attributes not allowed in this transition (`EINVAL`).
    NotAllowed {
        from: QpState,
        to: QpState,
        extra: u32,
    },
    /// Valid per IBTA but not implemented by uiw (`EOPNOTSUPP`).
    UnsupportedTransition { from: QpState, to: QpState },
    /// `pkey_index` ≥ `pkey_tbl_len` (`EINVAL`).
    BadPkeyIndex { index: u16, tbl_len: u32 },
    /// `path_mtu` not in `IBV_MTU_256..=port max` (`EINVAL`).
    BadPathMtu { mtu: u32, max: u32 },
    /// Unknown bits in `qp_access_flags` (`EINVAL`).
    BadAccessFlags { flags: u32, unknown: u32 },
    /// A numeric attribute is above its maximum (`EINVAL`).
    OutOfRange {
        attr: &'static str,
        value: u32,
        max: u32,
    },
    /// AV without GRH; uiw needs the destination IP in `dgid` (`EINVAL`).
    AvNotGlobal,
    /// `sgid_index` ≥ `gid_tbl_len` (`EINVAL`).
    BadSgidIndex { index: u8, tbl_len: u32 },
    /// `dgid` is not `::ffff:a.b.c.d` (`EINVAL`).
    AvNotIpv4Mapped { dgid: [u8; 16] },
    /// `dgid` maps to an IPv4 address TCP cannot connect to (`EINVAL`).
    AvBadIpv4 { addr: [u8; 4], reason: &'static str },
}

impl ModifyError {
    /// The errno `ibv_modify_qp` returns for this error.
    pub fn errno(&self) -> i32 {
        match self {
            ModifyError::UnsupportedMaskBits { .. } | ModifyError::UnsupportedTransition { .. } => {
                errno::EOPNOTSUPP
            }
            _ => errno::EINVAL,
        }
    }

    /// A one-line human explanation, e.g. for `UIW_DEBUG` output.
    pub fn describe(&self) -> String {
        match self {
            ModifyError::BadStateValue { field, value } => {
                format!("{field} = {value} is not an ibv_qp_state (0..=6)")
            }
            ModifyError::UnsupportedMaskBits { bits } => {
                let why = if bits & mask::RATE_LIMIT != 0 {
                    " (packet pacing is not supported)"
                } else {
                    ""
                };
                format!(
                    "attribute mask bits {} are not supported by uiw{why}",
                    mask::names(*bits)
                )
            }
            ModifyError::BadPort { port } => {
                format!("port_num = {port}: uiw has a single port, number 1")
            }
            ModifyError::BadAhPort { port, qp_port } => format!(
                "ah_attr.port_num = {port}: must be 1 and equal to the QP's port ({qp_port})"
            ),
            ModifyError::AltPathUnsupported => {
                "IBV_QP_ALT_PATH: automatic path migration does not exist on iWARP".to_string()
            }
            ModifyError::CurStateMismatch { claimed, actual } => format!(
                "cur_qp_state = {claimed} but the QP is in {actual} (IBV_QP_CUR_STATE must match)"
            ),
            ModifyError::BadTransition { from, to } => {
                let hint = if from == to {
                    " (attributes cannot be modified in this state without a state change)"
                } else if *from == QpState::Reset && *to == QpState::Err {
                    " (a QP in RESET cannot be moved to ERR; IBTA allows it from any other state)"
                } else {
                    ""
                };
                format!("{from} -> {to} is not a valid RC QP transition{hint}")
            }
            ModifyError::MissingRequired { from, to, missing } => format!(
                "{from} -> {to} requires {} but the mask lacks {}",
                mask::names(rc_rule(*from, *to).map_or(0, |r| r.required)),
                mask::names(*missing)
            ),
            ModifyError::NotAllowed { from, to, extra } => {
                let mut s = format!(
                    "{from} -> {to} does not accept {} (allowed optional: {})",
                    mask::names(*extra),
                    mask::names(rc_rule(*from, *to).map_or(0, |r| r.optional))
                );
                if extra & mask::CAP != 0 {
                    s.push_str("; IBV_QP_CAP: QP resize is not supported");
                }
                if extra & mask::QKEY != 0 {
                    s.push_str("; IBV_QP_QKEY applies to UD QPs only");
                }
                s
            }
            ModifyError::UnsupportedTransition { from, to } => format!(
                "{from} -> {to} is valid per IBTA but not implemented by uiw (no SQD/SQE support)"
            ),
            ModifyError::BadPkeyIndex { index, tbl_len } => format!(
                "pkey_index = {index}: the P_Key table has {tbl_len} entr{} (iWARP has no partitions)",
                if *tbl_len == 1 { "y" } else { "ies" }
            ),
            ModifyError::BadPathMtu { mtu, max } => format!(
                "path_mtu = {mtu}: must be an ibv_mtu value in 1 (256) ..= {max} ({})",
                128u32 << max
            ),
            ModifyError::BadAccessFlags { flags, unknown } => format!(
                "qp_access_flags = {flags:#x} has unknown bits {unknown:#x}"
            ),
            ModifyError::OutOfRange { attr, value, max } => {
                format!("{attr} = {value} exceeds the maximum {max}")
            }
            ModifyError::AvNotGlobal => "ah_attr.is_global = 0: uiw connects over TCP/IPv4 and \
                 needs the peer address in ah_attr.grh.dgid (::ffff:a.b.c.d) with is_global = 1"
                .to_string(),
            ModifyError::BadSgidIndex { index, tbl_len } => format!(
                "ah_attr.grh.sgid_index = {index}: the GID table has {tbl_len} entries"
            ),
            ModifyError::AvNotIpv4Mapped { dgid } => format!(
                "ah_attr.grh.dgid = {}: uiw connects over TCP/IPv4 and needs an IPv4-mapped GID \
                 ::ffff:a.b.c.d",
                fmt_gid(dgid)
            ),
            ModifyError::AvBadIpv4 { addr, reason } => format!(
                "ah_attr.grh.dgid = ::ffff:{}.{}.{}.{}: {reason}",
                addr[0], addr[1], addr[2], addr[3]
            ),
        }
    }
}

fn fmt_gid(g: &[u8; 16]) -> String {
    g.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

impl fmt::Display for ModifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

impl std::error::Error for ModifyError {}

/// Validates `ibv_modify_qp(qp, req, mask)` against the QP's `current`
/// attributes.  On success returns what the engine must do; the caller then
/// performs it and stores the attributes with [`apply`].
///
/// Order of checks, mirroring the kernel path (uverbs → core → driver):
/// 1. `mask == 0` → no-op success (siw).
/// 2. bits outside 0..=20 → `EOPNOTSUPP` (uverbs; `RATE_LIMIT` too, siw).
/// 3. `port_num`, `ah_attr.port_num` validity → `EINVAL` (uverbs).
/// 4. `ALT_PATH` → `EINVAL` (core: APM is IB-only).
/// 5. `CUR_STATE` must match the real state → `EINVAL` (uiw, see module doc).
/// 6. transition table: valid / required / allowed → `EINVAL`
///    (`ib_modify_qp_is_ok`).
/// 7. uiw-unimplemented transitions → `EOPNOTSUPP`.
/// 8. per-attribute value checks → `EINVAL` (`rxe_qp_chk_attr` + iWARP AV).
///
/// Without `IBV_QP_STATE` the request is treated as the `cur → cur`
/// transition (the kernel's convention), so e.g. RTS→RTS may change
/// `ACCESS_FLAGS`/`MIN_RNR_TIMER`, but RTR→RTR is invalid.
pub fn validate_modify(
    current: &QpAttrs,
    req: &QpAttrs,
    mask: u32,
    limits: &DeviceLimits,
) -> Result<Transition, ModifyError> {
    let from = current.qp_state;
    if mask == 0 {
        return Ok(Transition::new(from, from, 0));
    }

    // 2. Unknown / unsupported mask bits.
    let unsupported = mask & !mask::STANDARD_BITS;
    if unsupported != 0 {
        return Err(ModifyError::UnsupportedMaskBits { bits: unsupported });
    }

    let to = if mask & mask::STATE != 0 {
        req.qp_state
    } else {
        from
    };
    let port_ok = |p: u8| p >= 1 && u32::from(p) <= u32::from(limits.phys_port_cnt);

    // 3. Port numbers.
    if mask & mask::PORT != 0 && !port_ok(req.port_num) {
        return Err(ModifyError::BadPort { port: req.port_num });
    }
    if mask & mask::AV != 0 {
        let qp_port = if mask & mask::PORT != 0 {
            req.port_num
        } else {
            current.port_num
        };
        let must_match = mask & mask::STATE != 0 && to == QpState::Rtr;
        if !port_ok(req.ah.port_num) || (must_match && req.ah.port_num != qp_port) {
            return Err(ModifyError::BadAhPort {
                port: req.ah.port_num,
                qp_port,
            });
        }
    }

    // 4. Alternate path.
    if mask & mask::ALT_PATH != 0 {
        return Err(ModifyError::AltPathUnsupported);
    }

    // 5. Current-state assertion.
    if mask & mask::CUR_STATE != 0 && req.cur_qp_state != from {
        return Err(ModifyError::CurStateMismatch {
            claimed: req.cur_qp_state,
            actual: from,
        });
    }

    // 6. Transition table.
    let rule = rc_rule(from, to).ok_or(ModifyError::BadTransition { from, to })?;
    let missing = rule.required & !mask;
    if missing != 0 {
        return Err(ModifyError::MissingRequired { from, to, missing });
    }
    let extra = mask & !(rule.required | rule.optional | mask::STATE);
    if extra != 0 {
        return Err(ModifyError::NotAllowed { from, to, extra });
    }

    // 7. Implemented by uiw?
    if !uiw_supports(from, to) {
        return Err(ModifyError::UnsupportedTransition { from, to });
    }

    // 8. Values.
    check_values(req, mask, limits)?;

    Ok(Transition::new(from, to, mask))
}

fn check_values(req: &QpAttrs, mask: u32, limits: &DeviceLimits) -> Result<(), ModifyError> {
    let has = |bit: u32| mask & bit != 0;
    let range = |attr: &'static str, value: u32, max: u32| {
        if value > max {
            Err(ModifyError::OutOfRange { attr, value, max })
        } else {
            Ok(())
        }
    };

    if has(mask::PKEY_INDEX) && u32::from(req.pkey_index) >= limits.pkey_tbl_len {
        return Err(ModifyError::BadPkeyIndex {
            index: req.pkey_index,
            tbl_len: limits.pkey_tbl_len,
        });
    }
    if has(mask::ACCESS_FLAGS) {
        let unknown = req.qp_access_flags & !access::QP_ACCEPTED;
        if unknown != 0 {
            return Err(ModifyError::BadAccessFlags {
                flags: req.qp_access_flags,
                unknown,
            });
        }
    }
    if has(mask::PATH_MTU) && !(1..=limits.port_max_mtu).contains(&req.path_mtu) {
        return Err(ModifyError::BadPathMtu {
            mtu: req.path_mtu,
            max: limits.port_max_mtu,
        });
    }
    if has(mask::AV) {
        check_av(&req.ah, limits)?;
    }
    if has(mask::TIMEOUT) {
        range("timeout", req.timeout.into(), MAX_TIMER_ENC.into())?;
    }
    if has(mask::RETRY_CNT) {
        range("retry_cnt", req.retry_cnt.into(), MAX_RETRY.into())?;
    }
    if has(mask::RNR_RETRY) {
        range("rnr_retry", req.rnr_retry.into(), MAX_RETRY.into())?;
    }
    if has(mask::MIN_RNR_TIMER) {
        range(
            "min_rnr_timer",
            req.min_rnr_timer.into(),
            MAX_TIMER_ENC.into(),
        )?;
    }
    if has(mask::MAX_QP_RD_ATOMIC) {
        range(
            "max_rd_atomic (ORD)",
            req.max_rd_atomic.into(),
            limits.max_qp_init_rd_atom,
        )?;
    }
    if has(mask::MAX_DEST_RD_ATOMIC) {
        range(
            "max_dest_rd_atomic (IRD)",
            req.max_dest_rd_atomic.into(),
            limits.max_qp_rd_atom,
        )?;
    }
    if has(mask::PATH_MIG_STATE) {
        range("path_mig_state", req.path_mig_state, mig_state::ARMED)?;
    }
    if has(mask::DEST_QPN) {
        range("dest_qp_num", req.dest_qp_num, QPN_MASK)?;
    }
    // RQ_PSN / SQ_PSN: no check; apply() masks them to 24 bits like the core.
    Ok(())
}

/// iWARP addressing: the AV must carry the peer's IPv4 address as an
/// IPv4-mapped GID, because uiw reaches the peer with a TCP/IPv4 connection.
fn check_av(ah: &AhAttr, limits: &DeviceLimits) -> Result<(), ModifyError> {
    if ah.is_global == 0 {
        return Err(ModifyError::AvNotGlobal);
    }
    if u32::from(ah.sgid_index) >= limits.gid_tbl_len {
        return Err(ModifyError::BadSgidIndex {
            index: ah.sgid_index,
            tbl_len: limits.gid_tbl_len,
        });
    }
    let addr = ah
        .dest_ipv4()
        .ok_or(ModifyError::AvNotIpv4Mapped { dgid: ah.dgid })?;
    let reason = match addr {
        [0, 0, 0, 0] => Some("the unspecified address 0.0.0.0 cannot be connected to"),
        [255, 255, 255, 255] => Some("the broadcast address cannot be connected to"),
        [a, ..] if (224..=239).contains(&a) => Some("a multicast address cannot be connected to"),
        _ => None,
    };
    match reason {
        Some(reason) => Err(ModifyError::AvBadIpv4 { addr, reason }),
        None => Ok(()),
    }
}

/// Stores exactly the attributes selected by `mask` from `req` into
/// `current`.  Call only after [`validate_modify`] accepted the same
/// `(req, mask)`.
///
/// * `STATE` sets `qp_state` (and clears `sq_draining`); `cur_qp_state` is
///   always made equal to `qp_state`, which is what `ibv_query_qp` reports.
/// * `RQ_PSN`/`SQ_PSN` are masked to 24 bits, as `_ib_modify_qp` does.
/// * `CUR_STATE` is an assertion, not an attribute: nothing is stored.
/// * `CAP`, `QKEY`, `ALT_PATH`, `RATE_LIMIT` are never accepted by
///   [`validate_modify`] for RC and are ignored here.
pub fn apply(current: &mut QpAttrs, req: &QpAttrs, mask: u32) {
    let has = |bit: u32| mask & bit != 0;
    if has(mask::STATE) {
        current.qp_state = req.qp_state;
        current.sq_draining = 0;
    }
    current.cur_qp_state = current.qp_state;
    if has(mask::EN_SQD_ASYNC_NOTIFY) {
        current.en_sqd_async_notify = req.en_sqd_async_notify;
    }
    if has(mask::ACCESS_FLAGS) {
        current.qp_access_flags = req.qp_access_flags;
    }
    if has(mask::PKEY_INDEX) {
        current.pkey_index = req.pkey_index;
    }
    if has(mask::PORT) {
        current.port_num = req.port_num;
    }
    if has(mask::AV) {
        current.ah = req.ah;
    }
    if has(mask::PATH_MTU) {
        current.path_mtu = req.path_mtu;
    }
    if has(mask::TIMEOUT) {
        current.timeout = req.timeout;
    }
    if has(mask::RETRY_CNT) {
        current.retry_cnt = req.retry_cnt;
    }
    if has(mask::RNR_RETRY) {
        current.rnr_retry = req.rnr_retry;
    }
    if has(mask::RQ_PSN) {
        current.rq_psn = req.rq_psn & PSN_MASK;
    }
    if has(mask::MAX_QP_RD_ATOMIC) {
        current.max_rd_atomic = req.max_rd_atomic;
    }
    if has(mask::MIN_RNR_TIMER) {
        current.min_rnr_timer = req.min_rnr_timer;
    }
    if has(mask::SQ_PSN) {
        current.sq_psn = req.sq_psn & PSN_MASK;
    }
    if has(mask::MAX_DEST_RD_ATOMIC) {
        current.max_dest_rd_atomic = req.max_dest_rd_atomic;
    }
    if has(mask::PATH_MIG_STATE) {
        current.path_mig_state = req.path_mig_state;
    }
    if has(mask::DEST_QPN) {
        current.dest_qp_num = req.dest_qp_num;
    }
}

// ---------------------------------------------------------------------------
// QP creation
// ---------------------------------------------------------------------------

/// Why an `ibv_create_qp` was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CreateError {
    /// Only RC is implemented (`EOPNOTSUPP`, siw and rxe).
    UnsupportedQpType { qp_type: u32 },
    /// `create_flags` ≠ 0 (`EOPNOTSUPP`, siw).
    UnsupportedCreateFlags { flags: u32 },
    /// WR count past `max_qp_wr` (`EINVAL`).
    TooManyWr {
        queue: &'static str,
        requested: u32,
        max: u32,
    },
    /// SGE count past `max_sge` (`EINVAL`).
    TooManySge {
        queue: &'static str,
        requested: u32,
        max: u32,
    },
    /// `max_inline_data` past the device limit (`EINVAL`).
    InlineTooLarge { requested: u32, max: u32 },
    /// Object count at the device maximum (`ENOMEM`, siw's
    /// `atomic_inc_return(&sdev->num_qp) > SIW_MAX_QP`).
    ResourceExhausted { what: &'static str, max: u32 },
}

impl CreateError {
    /// The errno the create verb returns.
    pub fn errno(&self) -> i32 {
        match self {
            CreateError::UnsupportedQpType { .. } | CreateError::UnsupportedCreateFlags { .. } => {
                errno::EOPNOTSUPP
            }
            CreateError::ResourceExhausted { .. } => errno::ENOMEM,
            _ => errno::EINVAL,
        }
    }

    /// A one-line human explanation.
    pub fn describe(&self) -> String {
        match self {
            CreateError::UnsupportedQpType { qp_type } => {
                format!("qp_type = {qp_type}: uiw supports only RC (IBV_QPT_RC = 2) queue pairs")
            }
            CreateError::UnsupportedCreateFlags { flags } => {
                format!("create_flags = {flags:#x}: no QP creation flags are supported")
            }
            CreateError::TooManyWr {
                queue,
                requested,
                max,
            } => {
                format!("{queue} = {requested} exceeds max_qp_wr = {max}")
            }
            CreateError::TooManySge {
                queue,
                requested,
                max,
            } => {
                format!("{queue} = {requested} exceeds max_sge = {max}")
            }
            CreateError::InlineTooLarge { requested, max } => {
                format!("max_inline_data = {requested} exceeds the device limit {max}")
            }
            CreateError::ResourceExhausted { what, max } => {
                format!("cannot create another {what}: the device limit is {max}")
            }
        }
    }
}

impl fmt::Display for CreateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

impl std::error::Error for CreateError {}

/// Validates the capabilities of `ibv_create_qp` and returns the actual
/// capabilities to report back in `ibv_qp_init_attr.cap` (≥ requested, as
/// the verbs contract allows).
///
/// * `qp_type` ≠ `IBV_QPT_RC` → `EOPNOTSUPP` (siw; rxe for unknown types).
/// * `max_send_wr` = 0 is accepted: a receive-only QP, as InfiniBand providers (mlx5, rxe)
///   allow and qperf's servers create (siw refuses it with "Zero sized SQ is not
///   supported"). Such a QP still answers RDMA Reads, atomics and Terminates — those travel
///   on the responder's own queue (RFC 5040 §5.3, the inbound RDMA Read Request queue),
///   not the SQ — but every `ibv_post_send` on it fails with `ENOMEM` (queue full).
/// * WRs past `max_qp_wr`, SGEs past `max_sge`, inline past
///   `max_inline_data` → `EINVAL` (siw and rxe both).
/// * With an SRQ (`has_srq`) the receive caps are ignored (IB Verbs §6.3.7,
///   siw/rxe) and reported as 0: the QP has no receive queue of its own.
/// * Without an SRQ `max_recv_wr` = 0 is accepted (as siw and rxe do): the
///   QP simply cannot receive.
/// * WR counts are rounded up to a power of two (ring indices, as siw);
///   SGE and inline sizes are reported as requested.
pub fn validate_create(
    cap: &QpCap,
    qp_type: u32,
    has_srq: bool,
    limits: &DeviceLimits,
) -> Result<QpCap, CreateError> {
    if qp_type != qp_type::RC {
        return Err(CreateError::UnsupportedQpType { qp_type });
    }
    if cap.max_send_wr > limits.max_qp_wr {
        return Err(CreateError::TooManyWr {
            queue: "max_send_wr",
            requested: cap.max_send_wr,
            max: limits.max_qp_wr,
        });
    }
    if cap.max_send_sge > limits.max_sge {
        return Err(CreateError::TooManySge {
            queue: "max_send_sge",
            requested: cap.max_send_sge,
            max: limits.max_sge,
        });
    }
    if !has_srq {
        if cap.max_recv_wr > limits.max_qp_wr {
            return Err(CreateError::TooManyWr {
                queue: "max_recv_wr",
                requested: cap.max_recv_wr,
                max: limits.max_qp_wr,
            });
        }
        if cap.max_recv_sge > limits.max_sge {
            return Err(CreateError::TooManySge {
                queue: "max_recv_sge",
                requested: cap.max_recv_sge,
                max: limits.max_sge,
            });
        }
    }
    if cap.max_inline_data > limits.max_inline_data {
        return Err(CreateError::InlineTooLarge {
            requested: cap.max_inline_data,
            max: limits.max_inline_data,
        });
    }
    let round = |n: u32| {
        if n == 0 {
            0
        } else {
            n.next_power_of_two().min(limits.max_qp_wr)
        }
    };
    Ok(QpCap {
        max_send_wr: round(cap.max_send_wr),
        max_recv_wr: if has_srq { 0 } else { round(cap.max_recv_wr) },
        max_send_sge: cap.max_send_sge,
        max_recv_sge: if has_srq { 0 } else { cap.max_recv_sge },
        max_inline_data: cap.max_inline_data,
    })
}

/// `ibv_qp_init_attr_ex.create_flags` must be 0 (siw: `-EOPNOTSUPP`).
pub fn validate_create_flags(flags: u32) -> Result<(), CreateError> {
    if flags != 0 {
        Err(CreateError::UnsupportedCreateFlags { flags })
    } else {
        Ok(())
    }
}

/// Device-wide object-count check done before creating one more `what`
/// (`"QP"`, `"CQ"`, `"PD"`, `"MR"`, `"SRQ"`), given `live` existing objects:
/// `ENOMEM` once `live` reaches `max`, as siw does for every object type.
pub fn check_resource_count(what: &'static str, live: u32, max: u32) -> Result<(), CreateError> {
    if live >= max {
        Err(CreateError::ResourceExhausted { what, max })
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use QpState::*;

    const L: DeviceLimits = DeviceLimits::UIW;

    /// Current attributes of a QP that legitimately sits in `s`.
    fn qp_in(s: QpState) -> QpAttrs {
        let mut a = init_attrs_from_create(&QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        });
        a.qp_state = s;
        a.cur_qp_state = s;
        if s != Reset {
            a.port_num = 1;
        }
        a
    }

    /// A request with every field set to a valid, non-default value.
    fn good_req(to: QpState, cur: QpState) -> QpAttrs {
        QpAttrs {
            qp_state: to,
            cur_qp_state: cur,
            path_mtu: 4,
            path_mig_state: mig_state::MIGRATED,
            rq_psn: 0x1234,
            sq_psn: 0x5678,
            dest_qp_num: 0x42,
            qp_access_flags: access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ,
            cap: QpCap::default(),
            ah: AhAttr::ipv4([192, 168, 1, 2]),
            pkey_index: 0,
            en_sqd_async_notify: 1,
            sq_draining: 0,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            min_rnr_timer: 12,
            port_num: 1,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
        }
    }

    fn minimal(from: QpState, to: QpState) -> u32 {
        mask::STATE | rc_rule(from, to).unwrap().required
    }

    /// Every (from, to) pair the RC table allows.
    fn table_valid() -> Vec<(QpState, QpState)> {
        let mut v = Vec::new();
        for f in QpState::ALL {
            for t in QpState::ALL {
                if rc_rule(f, t).is_some() {
                    v.push((f, t));
                }
            }
        }
        v
    }

    fn supported_valid() -> Vec<(QpState, QpState)> {
        table_valid()
            .into_iter()
            .filter(|&(f, t)| uiw_supports(f, t))
            .collect()
    }

    #[test]
    fn mask_values_match_verbs_h() {
        assert_eq!(mask::STATE, 1);
        assert_eq!(mask::CUR_STATE, 2);
        assert_eq!(mask::EN_SQD_ASYNC_NOTIFY, 4);
        assert_eq!(mask::ACCESS_FLAGS, 8);
        assert_eq!(mask::PKEY_INDEX, 16);
        assert_eq!(mask::PORT, 32);
        assert_eq!(mask::QKEY, 64);
        assert_eq!(mask::AV, 128);
        assert_eq!(mask::PATH_MTU, 256);
        assert_eq!(mask::TIMEOUT, 512);
        assert_eq!(mask::RETRY_CNT, 1024);
        assert_eq!(mask::RNR_RETRY, 2048);
        assert_eq!(mask::RQ_PSN, 4096);
        assert_eq!(mask::MAX_QP_RD_ATOMIC, 8192);
        assert_eq!(mask::ALT_PATH, 16384);
        assert_eq!(mask::MIN_RNR_TIMER, 32768);
        assert_eq!(mask::SQ_PSN, 65536);
        assert_eq!(mask::MAX_DEST_RD_ATOMIC, 131072);
        assert_eq!(mask::PATH_MIG_STATE, 262144);
        assert_eq!(mask::CAP, 524288);
        assert_eq!(mask::DEST_QPN, 1048576);
        assert_eq!(mask::RATE_LIMIT, 33554432);
        assert_eq!(mask::STANDARD_BITS, 0x1f_ffff);
        assert_eq!(access::RELAXED_ORDERING, 1 << 20);
        assert_eq!(
            mask::names(mask::AV | mask::PATH_MTU | (1 << 30)),
            "IBV_QP_AV|IBV_QP_PATH_MTU|0x40000000"
        );
    }

    #[test]
    fn state_values_and_parse() {
        for (i, s) in QpState::ALL.iter().enumerate() {
            assert_eq!(s.as_u32(), i as u32);
            assert_eq!(QpState::from_u32(i as u32), Some(*s));
        }
        assert_eq!(QpState::from_u32(7), None);
        let e = QpState::parse(9, "qp_state").unwrap_err();
        assert_eq!(e.errno(), errno::EINVAL);
        assert!(e.describe().contains("qp_state = 9"));
    }

    #[test]
    fn table_has_the_kernel_shape() {
        // 7 states; count of valid RC transitions in qp_state_table.
        assert_eq!(table_valid().len(), 2 + 4 + 3 + 4 + 4 + 3 + 2);
        assert!(rc_rule(Reset, Err).is_none(), "RESET->ERR is not valid");
        for s in QpState::ALL {
            assert!(rc_rule(s, Reset).is_some(), "{s} -> RESET");
            if s != Reset {
                assert!(rc_rule(s, Err).is_some(), "{s} -> ERR");
            }
            assert!(rc_rule(s, Sqe).is_none(), "nothing moves to SQE by request");
        }
        for (f, t) in table_valid() {
            let r = rc_rule(f, t).unwrap();
            assert_eq!(r.required & r.optional, 0);
            assert_eq!(
                (r.required | r.optional) & (mask::CAP | mask::QKEY | mask::RATE_LIMIT),
                0
            );
        }
    }

    #[test]
    fn every_supported_transition_with_minimal_mask_passes() {
        for (f, t) in supported_valid() {
            let cur = qp_in(f);
            let req = good_req(t, f);
            let m = minimal(f, t);
            let tr = validate_modify(&cur, &req, m, &L)
                .unwrap_or_else(|e| panic!("{f} -> {t} mask {}: {}", mask::names(m), e));
            assert_eq!((tr.from, tr.to), (f, t));
            assert_eq!(tr.state_change, f != t);
        }
    }

    #[test]
    fn every_supported_transition_with_all_optional_bits_passes() {
        for (f, t) in supported_valid() {
            let r = rc_rule(f, t).unwrap();
            // ALT_PATH is in the IBTA table but rejected on iWARP.
            let m = mask::STATE | r.required | (r.optional & !mask::ALT_PATH);
            let tr = validate_modify(&qp_in(f), &good_req(t, f), m, &L)
                .unwrap_or_else(|e| panic!("{f} -> {t}: {e}"));
            assert_eq!(tr.attrs, m & !(mask::STATE | mask::CUR_STATE));
        }
    }

    #[test]
    fn same_state_modifies_without_state_bit() {
        let tr =
            validate_modify(&qp_in(Rts), &good_req(Rts, Rts), mask::MIN_RNR_TIMER, &L).unwrap();
        assert_eq!((tr.from, tr.to, tr.state_change), (Rts, Rts, false));
        let tr =
            validate_modify(&qp_in(Init), &good_req(Init, Init), mask::ACCESS_FLAGS, &L).unwrap();
        assert_eq!((tr.from, tr.to), (Init, Init));
        // RTR -> RTR does not exist.
        let e =
            validate_modify(&qp_in(Rtr), &good_req(Rtr, Rtr), mask::ACCESS_FLAGS, &L).unwrap_err();
        assert_eq!(e, ModifyError::BadTransition { from: Rtr, to: Rtr });
        assert_eq!(e.errno(), errno::EINVAL);
        // RESET -> RESET accepts nothing but STATE.
        let e = validate_modify(
            &qp_in(Reset),
            &good_req(Reset, Reset),
            mask::ACCESS_FLAGS,
            &L,
        )
        .unwrap_err();
        assert!(matches!(
            e,
            ModifyError::NotAllowed {
                extra: mask::ACCESS_FLAGS,
                ..
            }
        ));
    }

    #[test]
    fn empty_mask_is_a_noop() {
        for s in QpState::ALL {
            let tr = validate_modify(&qp_in(s), &QpAttrs::default(), 0, &L).unwrap();
            assert_eq!((tr.from, tr.to, tr.attrs), (s, s, 0));
            assert!(!tr.state_change && !tr.flush && !tr.reset && !tr.connect && !tr.disconnect);
        }
    }

    #[test]
    fn each_missing_required_bit_fails_einval() {
        let mut n = 0;
        for (f, t) in table_valid() {
            let req_bits = rc_rule(f, t).unwrap().required;
            for bit in (0..32).map(|i| 1u32 << i).filter(|b| req_bits & b != 0) {
                let m = minimal(f, t) & !bit;
                let e = validate_modify(&qp_in(f), &good_req(t, f), m, &L).unwrap_err();
                assert_eq!(
                    e,
                    ModifyError::MissingRequired {
                        from: f,
                        to: t,
                        missing: bit
                    },
                    "{f}->{t}"
                );
                assert_eq!(e.errno(), errno::EINVAL);
                assert!(e.describe().contains(&mask::names(bit)));
                n += 1;
            }
        }
        assert_eq!(n, 3 + 6 + 5);
    }

    #[test]
    fn each_disallowed_bit_fails_einval() {
        let mut n = 0;
        for (f, t) in table_valid() {
            let r = rc_rule(f, t).unwrap();
            for bit in (1..21).map(|i| 1u32 << i) {
                if (r.required | r.optional) & bit != 0 {
                    continue;
                }
                let e = validate_modify(&qp_in(f), &good_req(t, f), minimal(f, t) | bit, &L)
                    .unwrap_err();
                assert_eq!(
                    e.errno(),
                    errno::EINVAL,
                    "{f}->{t} + {}: {e:?}",
                    mask::names(bit)
                );
                match bit {
                    mask::ALT_PATH => assert_eq!(e, ModifyError::AltPathUnsupported),
                    _ => assert_eq!(
                        e,
                        ModifyError::NotAllowed {
                            from: f,
                            to: t,
                            extra: bit
                        }
                    ),
                }
                n += 1;
            }
        }
        assert!(n > 300, "{n}");
    }

    #[test]
    fn alt_path_is_rejected_even_where_ibta_allows_it() {
        let m = minimal(Init, Rtr) | mask::ALT_PATH;
        let e = validate_modify(&qp_in(Init), &good_req(Rtr, Init), m, &L).unwrap_err();
        assert_eq!(e, ModifyError::AltPathUnsupported);
        assert_eq!(e.errno(), errno::EINVAL);
        assert!(e.describe().contains("iWARP"));
    }

    #[test]
    fn invalid_transitions_fail_einval() {
        let mut n = 0;
        for f in QpState::ALL {
            for t in QpState::ALL {
                if rc_rule(f, t).is_some() {
                    continue;
                }
                let e = validate_modify(&qp_in(f), &good_req(t, f), mask::STATE, &L).unwrap_err();
                assert_eq!(e, ModifyError::BadTransition { from: f, to: t });
                assert_eq!(e.errno(), errno::EINVAL);
                n += 1;
            }
        }
        assert_eq!(n, 49 - 22);
        let e = validate_modify(&qp_in(Reset), &good_req(Err, Reset), mask::STATE, &L).unwrap_err();
        assert!(e.describe().contains("RESET cannot be moved to ERR"));
    }

    #[test]
    fn skipping_states_fails() {
        // RESET -> RTR, INIT -> RTS with all attributes of both steps.
        let all =
            mask::STANDARD_BITS & !(mask::ALT_PATH | mask::CAP | mask::QKEY | mask::CUR_STATE);
        for (f, t) in [(Reset, Rtr), (Reset, Rts), (Init, Rts)] {
            let e = validate_modify(&qp_in(f), &good_req(t, f), all, &L).unwrap_err();
            assert_eq!(e, ModifyError::BadTransition { from: f, to: t });
        }
    }

    #[test]
    fn unimplemented_transitions_fail_eopnotsupp() {
        let cases = [(Rts, Sqd), (Sqd, Rts), (Sqd, Sqd), (Sqe, Rts)];
        for (f, t) in cases {
            let e = validate_modify(&qp_in(f), &good_req(t, f), minimal(f, t), &L).unwrap_err();
            assert_eq!(e, ModifyError::UnsupportedTransition { from: f, to: t });
            assert_eq!(e.errno(), errno::EOPNOTSUPP);
        }
        assert_eq!(table_valid().len() - supported_valid().len(), cases.len());
        // A malformed request for an unimplemented transition is still EINVAL.
        let e = validate_modify(
            &qp_in(Rts),
            &good_req(Sqd, Rts),
            mask::STATE | mask::TIMEOUT,
            &L,
        )
        .unwrap_err();
        assert_eq!(e.errno(), errno::EINVAL);
    }

    #[test]
    fn unsupported_mask_bits_fail_eopnotsupp() {
        for bit in [
            mask::RATE_LIMIT,
            1 << 21,
            1 << 22,
            1 << 23,
            1 << 24,
            1 << 26,
            1 << 31,
        ] {
            let e = validate_modify(&qp_in(Rts), &good_req(Rts, Rts), mask::STATE | bit, &L)
                .unwrap_err();
            assert_eq!(e, ModifyError::UnsupportedMaskBits { bits: bit });
            assert_eq!(e.errno(), errno::EOPNOTSUPP);
        }
        let e = ModifyError::UnsupportedMaskBits {
            bits: mask::RATE_LIMIT,
        };
        assert!(e.describe().contains("RATE_LIMIT"));
    }

    #[test]
    fn cap_and_qkey_fail_einval_with_reason() {
        let e = validate_modify(&qp_in(Rts), &good_req(Rts, Rts), mask::CAP, &L).unwrap_err();
        assert_eq!(e.errno(), errno::EINVAL);
        assert!(e.describe().contains("resize"), "{}", e.describe());
        let e = validate_modify(
            &qp_in(Init),
            &good_req(Init, Init),
            mask::STATE | mask::QKEY,
            &L,
        )
        .unwrap_err();
        assert!(e.describe().contains("UD"), "{}", e.describe());
    }

    #[test]
    fn cur_state_semantics() {
        // Allowed and matching: RTR->RTS, RTS->RTS.
        let m = minimal(Rtr, Rts) | mask::CUR_STATE;
        assert!(validate_modify(&qp_in(Rtr), &good_req(Rts, Rtr), m, &L).is_ok());
        let m = mask::STATE | mask::CUR_STATE | mask::MIN_RNR_TIMER;
        assert!(validate_modify(&qp_in(Rts), &good_req(Rts, Rts), m, &L).is_ok());
        // Mismatch.
        let m = minimal(Rtr, Rts) | mask::CUR_STATE;
        let e = validate_modify(&qp_in(Rtr), &good_req(Rts, Init), m, &L).unwrap_err();
        assert_eq!(
            e,
            ModifyError::CurStateMismatch {
                claimed: Init,
                actual: Rtr
            }
        );
        assert_eq!(e.errno(), errno::EINVAL);
        // Matching but not allowed in this transition (kernel: only RTR/RTS/SQD/SQE->RTS).
        for (f, t) in [
            (Reset, Init),
            (Init, Init),
            (Init, Rtr),
            (Rts, Err),
            (Err, Reset),
        ] {
            let m = minimal(f, t) | mask::CUR_STATE;
            let e = validate_modify(&qp_in(f), &good_req(t, f), m, &L).unwrap_err();
            assert_eq!(
                e,
                ModifyError::NotAllowed {
                    from: f,
                    to: t,
                    extra: mask::CUR_STATE
                }
            );
        }
        // Without the bit, cur_qp_state is ignored.
        let m = minimal(Rtr, Rts);
        assert!(validate_modify(&qp_in(Rtr), &good_req(Rts, Err), m, &L).is_ok());
    }

    /// (transition, mask bit, mutation, expected error)
    #[allow(clippy::type_complexity)]
    fn out_of_range_cases() -> Vec<(
        QpState,
        QpState,
        u32,
        Box<dyn Fn(&mut QpAttrs)>,
        ModifyError,
    )> {
        use ModifyError::*;
        let oor = |attr: &'static str, value: u32, max: u32| OutOfRange { attr, value, max };
        vec![
            (
                Reset,
                Init,
                0,
                Box::new(|r: &mut QpAttrs| r.port_num = 0),
                BadPort { port: 0 },
            ),
            (
                Reset,
                Init,
                0,
                Box::new(|r: &mut QpAttrs| r.port_num = 2),
                BadPort { port: 2 },
            ),
            (
                Init,
                Init,
                mask::PORT,
                Box::new(|r: &mut QpAttrs| r.port_num = 3),
                BadPort { port: 3 },
            ),
            (
                Reset,
                Init,
                0,
                Box::new(|r: &mut QpAttrs| r.pkey_index = 1),
                BadPkeyIndex {
                    index: 1,
                    tbl_len: 1,
                },
            ),
            (
                Reset,
                Init,
                0,
                Box::new(|r: &mut QpAttrs| r.qp_access_flags = access::REMOTE_READ | (1 << 8)),
                BadAccessFlags {
                    flags: access::REMOTE_READ | (1 << 8),
                    unknown: 1 << 8,
                },
            ),
            (
                Rts,
                Rts,
                mask::ACCESS_FLAGS,
                Box::new(|r: &mut QpAttrs| r.qp_access_flags = 1 << 30),
                BadAccessFlags {
                    flags: 1 << 30,
                    unknown: 1 << 30,
                },
            ),
            (
                Init,
                Rtr,
                0,
                Box::new(|r: &mut QpAttrs| r.path_mtu = 0),
                BadPathMtu { mtu: 0, max: 5 },
            ),
            (
                Init,
                Rtr,
                0,
                Box::new(|r: &mut QpAttrs| r.path_mtu = 6),
                BadPathMtu { mtu: 6, max: 5 },
            ),
            (
                Init,
                Rtr,
                0,
                Box::new(|r: &mut QpAttrs| r.max_dest_rd_atomic = 129),
                oor("max_dest_rd_atomic (IRD)", 129, 128),
            ),
            (
                Init,
                Rtr,
                0,
                Box::new(|r: &mut QpAttrs| r.min_rnr_timer = 32),
                oor("min_rnr_timer", 32, 31),
            ),
            (
                Init,
                Rtr,
                0,
                Box::new(|r: &mut QpAttrs| r.dest_qp_num = 1 << 24),
                oor("dest_qp_num", 1 << 24, QPN_MASK),
            ),
            (
                Init,
                Rtr,
                0,
                Box::new(|r: &mut QpAttrs| r.ah.is_global = 0),
                AvNotGlobal,
            ),
            (
                Init,
                Rtr,
                0,
                Box::new(|r: &mut QpAttrs| r.ah.sgid_index = 16),
                BadSgidIndex {
                    index: 16,
                    tbl_len: 16,
                },
            ),
            (
                Init,
                Rtr,
                0,
                Box::new(|r: &mut QpAttrs| {
                    r.ah.dgid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]
                }),
                AvNotIpv4Mapped {
                    dgid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
                },
            ),
            (
                Init,
                Rtr,
                0,
                // IPv4-compatible (deprecated) form ::a.b.c.d is not accepted.
                Box::new(|r: &mut QpAttrs| {
                    r.ah.dgid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 1]
                }),
                AvNotIpv4Mapped {
                    dgid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 1],
                },
            ),
            (
                Init,
                Rtr,
                0,
                Box::new(|r: &mut QpAttrs| r.ah.dgid = ipv4_mapped_gid([0, 0, 0, 0])),
                AvBadIpv4 {
                    addr: [0, 0, 0, 0],
                    reason: "the unspecified address 0.0.0.0 cannot be connected to",
                },
            ),
            (
                Init,
                Rtr,
                0,
                Box::new(|r: &mut QpAttrs| r.ah.dgid = ipv4_mapped_gid([239, 1, 2, 3])),
                AvBadIpv4 {
                    addr: [239, 1, 2, 3],
                    reason: "a multicast address cannot be connected to",
                },
            ),
            (
                Init,
                Rtr,
                0,
                Box::new(|r: &mut QpAttrs| r.ah.dgid = ipv4_mapped_gid([255, 255, 255, 255])),
                AvBadIpv4 {
                    addr: [255, 255, 255, 255],
                    reason: "the broadcast address cannot be connected to",
                },
            ),
            (
                Init,
                Rtr,
                0,
                Box::new(|r: &mut QpAttrs| r.ah.port_num = 0),
                BadAhPort {
                    port: 0,
                    qp_port: 1,
                },
            ),
            (
                Init,
                Rtr,
                0,
                Box::new(|r: &mut QpAttrs| r.ah.port_num = 2),
                BadAhPort {
                    port: 2,
                    qp_port: 1,
                },
            ),
            (
                Rtr,
                Rts,
                0,
                Box::new(|r: &mut QpAttrs| r.timeout = 32),
                oor("timeout", 32, 31),
            ),
            (
                Rtr,
                Rts,
                0,
                Box::new(|r: &mut QpAttrs| r.retry_cnt = 8),
                oor("retry_cnt", 8, 7),
            ),
            (
                Rtr,
                Rts,
                0,
                Box::new(|r: &mut QpAttrs| r.rnr_retry = 8),
                oor("rnr_retry", 8, 7),
            ),
            (
                Rtr,
                Rts,
                0,
                Box::new(|r: &mut QpAttrs| r.max_rd_atomic = 129),
                oor("max_rd_atomic (ORD)", 129, 128),
            ),
            (
                Rtr,
                Rts,
                mask::PATH_MIG_STATE,
                Box::new(|r: &mut QpAttrs| r.path_mig_state = 3),
                oor("path_mig_state", 3, 2),
            ),
            (
                Rts,
                Rts,
                mask::MIN_RNR_TIMER,
                Box::new(|r: &mut QpAttrs| r.min_rnr_timer = 255),
                oor("min_rnr_timer", 255, 31),
            ),
        ]
    }

    #[test]
    fn out_of_range_values_fail_einval() {
        for (i, (f, t, extra, mutate, want)) in out_of_range_cases().into_iter().enumerate() {
            let mut req = good_req(t, f);
            // Sanity: the unmutated request passes.
            validate_modify(&qp_in(f), &req, minimal(f, t) | extra, &L)
                .unwrap_or_else(|e| panic!("case {i} baseline: {e}"));
            mutate(&mut req);
            let e = validate_modify(&qp_in(f), &req, minimal(f, t) | extra, &L).unwrap_err();
            assert_eq!(e, want, "case {i}");
            assert_eq!(e.errno(), errno::EINVAL, "case {i}");
            assert!(!e.describe().is_empty());
        }
    }

    #[test]
    fn boundary_values_pass() {
        let mut req = good_req(Rts, Rtr);
        req.timeout = 31;
        req.retry_cnt = 7;
        req.rnr_retry = 7;
        req.max_rd_atomic = 128;
        req.min_rnr_timer = 31;
        req.path_mig_state = mig_state::ARMED;
        let m = minimal(Rtr, Rts) | mask::MIN_RNR_TIMER | mask::PATH_MIG_STATE;
        assert!(validate_modify(&qp_in(Rtr), &req, m, &L).is_ok());

        let mut req = good_req(Rtr, Init);
        req.path_mtu = 1;
        req.max_dest_rd_atomic = 128;
        req.dest_qp_num = QPN_MASK;
        req.ah.sgid_index = 15;
        req.ah.dgid = ipv4_mapped_gid([127, 0, 0, 1]); // loopback is fine
        req.rq_psn = u32::MAX; // masked, not rejected
        assert!(validate_modify(&qp_in(Init), &req, minimal(Init, Rtr), &L).is_ok());
        req.path_mtu = 5;
        req.max_dest_rd_atomic = 0;
        assert!(validate_modify(&qp_in(Init), &req, minimal(Init, Rtr), &L).is_ok());

        let mut req = good_req(Init, Reset);
        req.qp_access_flags = access::QP_ACCEPTED; // every known + optional bit
        assert!(validate_modify(&qp_in(Reset), &req, minimal(Reset, Init), &L).is_ok());
        req.qp_access_flags = 0;
        assert!(validate_modify(&qp_in(Reset), &req, minimal(Reset, Init), &L).is_ok());
    }

    #[test]
    fn limits_are_taken_from_the_argument() {
        let mut small = DeviceLimits::UIW;
        small.max_qp_init_rd_atom = 4;
        small.max_qp_rd_atom = 8;
        small.port_max_mtu = 3;
        let mut req = good_req(Rts, Rtr);
        req.max_rd_atomic = 5;
        let e = validate_modify(&qp_in(Rtr), &req, minimal(Rtr, Rts), &small).unwrap_err();
        assert_eq!(
            e,
            ModifyError::OutOfRange {
                attr: "max_rd_atomic (ORD)",
                value: 5,
                max: 4
            }
        );
        let mut req = good_req(Rtr, Init);
        req.max_dest_rd_atomic = 8;
        req.path_mtu = 4;
        let e = validate_modify(&qp_in(Init), &req, minimal(Init, Rtr), &small).unwrap_err();
        assert_eq!(e, ModifyError::BadPathMtu { mtu: 4, max: 3 });
    }

    #[test]
    fn describe_explains_iwarp_addressing() {
        let mut req = good_req(Rtr, Init);
        req.ah.is_global = 0;
        let e = validate_modify(&qp_in(Init), &req, minimal(Init, Rtr), &L).unwrap_err();
        let s = e.describe();
        assert!(s.contains("TCP/IPv4") && s.contains("is_global"), "{s}");
        assert_eq!(format!("{e}"), s);
        let e = ModifyError::AvNotIpv4Mapped {
            dgid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        };
        assert!(e.describe().contains("fe80:0000"), "{}", e.describe());
        assert!(e.describe().contains("::ffff:a.b.c.d"));
    }

    #[test]
    fn transition_flags() {
        let t = |f: QpState, to: QpState| {
            validate_modify(&qp_in(f), &good_req(to, f), minimal(f, to), &L).unwrap()
        };
        let x = t(Reset, Init);
        assert!(
            x.state_change && !x.connect && !x.flush && !x.reset && !x.disconnect && !x.start_sq
        );
        assert_eq!(x.attrs, mask::PKEY_INDEX | mask::PORT | mask::ACCESS_FLAGS);
        let x = t(Init, Rtr);
        assert!(x.connect && !x.start_sq && !x.flush);
        let x = t(Rtr, Rts);
        assert!(x.start_sq && !x.connect);
        let x = t(Rts, Err);
        assert!(x.flush && x.disconnect && !x.reset);
        let x = t(Rtr, Reset);
        assert!(x.reset && x.disconnect && !x.flush);
        let x = t(Init, Err);
        assert!(x.flush && !x.disconnect);
        let x = t(Init, Reset);
        assert!(x.reset && !x.disconnect);
        let x = t(Err, Err);
        assert!(!x.flush && !x.state_change);
        let x = t(Err, Reset);
        assert!(x.reset && !x.flush && !x.disconnect);
        let x = t(Reset, Reset);
        assert!(!x.reset && !x.state_change);
        let x = t(Sqe, Err);
        assert!(x.flush && x.disconnect);
    }

    /// Field groups written by each mask bit.
    fn changed_fields(a: &QpAttrs, b: &QpAttrs) -> Vec<&'static str> {
        let mut v = Vec::new();
        macro_rules! cmp {
            ($($f:ident),*) => { $( if a.$f != b.$f { v.push(stringify!($f)); } )* };
        }
        cmp!(
            qp_state,
            cur_qp_state,
            path_mtu,
            path_mig_state,
            rq_psn,
            sq_psn,
            dest_qp_num,
            qp_access_flags,
            cap,
            ah,
            pkey_index,
            en_sqd_async_notify,
            sq_draining,
            max_rd_atomic,
            max_dest_rd_atomic,
            min_rnr_timer,
            port_num,
            timeout,
            retry_cnt,
            rnr_retry
        );
        v
    }

    #[test]
    fn apply_copies_exactly_the_masked_fields() {
        let base = QpAttrs {
            sq_draining: 1,
            ..qp_in(Init)
        };
        let mut req = QpAttrs {
            qp_state: Rtr,
            cur_qp_state: Sqe,
            path_mtu: 2,
            path_mig_state: 1,
            rq_psn: 77,
            sq_psn: 88,
            dest_qp_num: 99,
            qp_access_flags: 6,
            cap: QpCap {
                max_send_wr: 1,
                max_recv_wr: 2,
                max_send_sge: 3,
                max_recv_sge: 4,
                max_inline_data: 5,
            },
            ah: AhAttr::ipv4([10, 0, 0, 9]),
            pkey_index: 3,
            en_sqd_async_notify: 1,
            sq_draining: 1,
            max_rd_atomic: 9,
            max_dest_rd_atomic: 10,
            min_rnr_timer: 11,
            port_num: 7,
            timeout: 12,
            retry_cnt: 5,
            rnr_retry: 6,
        };
        req.ah.sl = 3;
        let expect: [(u32, &[&str]); 21] = [
            (mask::STATE, &["qp_state", "cur_qp_state", "sq_draining"]),
            (mask::CUR_STATE, &[]),
            (mask::EN_SQD_ASYNC_NOTIFY, &["en_sqd_async_notify"]),
            (mask::ACCESS_FLAGS, &["qp_access_flags"]),
            (mask::PKEY_INDEX, &["pkey_index"]),
            (mask::PORT, &["port_num"]),
            (mask::QKEY, &[]),
            (mask::AV, &["ah"]),
            (mask::PATH_MTU, &["path_mtu"]),
            (mask::TIMEOUT, &["timeout"]),
            (mask::RETRY_CNT, &["retry_cnt"]),
            (mask::RNR_RETRY, &["rnr_retry"]),
            (mask::RQ_PSN, &["rq_psn"]),
            (mask::MAX_QP_RD_ATOMIC, &["max_rd_atomic"]),
            (mask::ALT_PATH, &[]),
            (mask::MIN_RNR_TIMER, &["min_rnr_timer"]),
            (mask::SQ_PSN, &["sq_psn"]),
            (mask::MAX_DEST_RD_ATOMIC, &["max_dest_rd_atomic"]),
            (mask::PATH_MIG_STATE, &["path_mig_state"]),
            (mask::CAP, &[]),
            (mask::DEST_QPN, &["dest_qp_num"]),
        ];
        for (bit, fields) in expect {
            let mut cur = base;
            apply(&mut cur, &req, bit);
            assert_eq!(
                changed_fields(&base, &cur),
                fields.to_vec(),
                "{}",
                mask::names(bit)
            );
        }
        // Everything at once = union.
        let mut cur = base;
        apply(&mut cur, &req, mask::STANDARD_BITS | mask::RATE_LIMIT);
        assert_eq!(cur.cap, base.cap, "CAP is never stored");
        assert_eq!(cur.qp_state, Rtr);
        assert_eq!(cur.cur_qp_state, Rtr);
        assert_eq!(cur.ah, req.ah);
        // Mask 0 leaves everything alone.
        let mut cur = base;
        apply(&mut cur, &req, 0);
        assert_eq!(cur, base);
    }

    #[test]
    fn apply_masks_psns_to_24_bits() {
        let mut cur = qp_in(Init);
        let req = QpAttrs {
            rq_psn: 0xabcd_ef12,
            sq_psn: 0xff12_3456,
            ..QpAttrs::default()
        };
        apply(&mut cur, &req, mask::RQ_PSN | mask::SQ_PSN);
        assert_eq!(cur.rq_psn, 0x00cd_ef12);
        assert_eq!(cur.sq_psn, 0x0012_3456);
    }

    #[test]
    fn full_lifecycle_with_apply() {
        let mut qp = init_attrs_from_create(&QpCap {
            max_send_wr: 8,
            max_recv_wr: 8,
            ..QpCap::default()
        });
        assert_eq!(qp.qp_state, Reset);
        assert_eq!(qp.path_mtu, 3);
        let steps: [(QpState, u32); 7] = [
            (Init, minimal(Reset, Init)),
            (Rtr, minimal(Init, Rtr)),
            (Rts, minimal(Rtr, Rts)),
            (Rts, mask::ACCESS_FLAGS | mask::MIN_RNR_TIMER),
            (Err, mask::STATE),
            (Reset, mask::STATE),
            (Init, minimal(Reset, Init)),
        ];
        for (to, m) in steps {
            let req = good_req(to, qp.qp_state);
            let tr = validate_modify(&qp, &req, m, &L).unwrap_or_else(|e| panic!("-> {to}: {e}"));
            apply(&mut qp, &req, m);
            assert_eq!(qp.qp_state, tr.to);
            assert_eq!(qp.cur_qp_state, tr.to);
        }
        assert_eq!(qp.ah, AhAttr::ipv4([192, 168, 1, 2]));
        assert_eq!(qp.ah.dest_ipv4(), Some([192, 168, 1, 2]));
        assert_eq!(qp.dest_qp_num, 0x42);
        assert_eq!(qp.timeout, 14);
        // ERR cannot go back to RTS.
        let mut err = qp;
        err.qp_state = Err;
        let e = validate_modify(&err, &good_req(Rts, Err), minimal(Rtr, Rts), &L).unwrap_err();
        assert_eq!(e, ModifyError::BadTransition { from: Err, to: Rts });
    }

    #[test]
    fn ah_port_must_match_qp_port_at_rtr() {
        // The QP port is 1 from RESET->INIT; the AV must name the same port.
        let mut cur = qp_in(Init);
        cur.port_num = 1;
        let req = good_req(Rtr, Init);
        assert!(validate_modify(&cur, &req, minimal(Init, Rtr), &L).is_ok());
        let mut odd = cur;
        odd.port_num = 0; // a QP that never got a port (cannot happen via validate)
        let e = validate_modify(&odd, &req, minimal(Init, Rtr), &L).unwrap_err();
        assert_eq!(
            e,
            ModifyError::BadAhPort {
                port: 1,
                qp_port: 0
            }
        );
    }

    #[test]
    fn gid_helpers_round_trip() {
        let g = ipv4_mapped_gid([10, 1, 2, 3]);
        assert_eq!(&g[..12], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
        assert_eq!(gid_to_ipv4(&g), Some([10, 1, 2, 3]));
        let mut bad = g;
        bad[0] = 1;
        assert_eq!(gid_to_ipv4(&bad), None);
    }

    #[test]
    fn every_modify_error_has_errno_and_text() {
        use ModifyError::*;
        let all = [
            BadStateValue {
                field: "qp_state",
                value: 7,
            },
            UnsupportedMaskBits { bits: 1 << 25 },
            BadPort { port: 0 },
            BadAhPort {
                port: 0,
                qp_port: 1,
            },
            AltPathUnsupported,
            CurStateMismatch {
                claimed: Rts,
                actual: Rtr,
            },
            BadTransition {
                from: Init,
                to: Rts,
            },
            MissingRequired {
                from: Init,
                to: Rtr,
                missing: mask::AV,
            },
            NotAllowed {
                from: Rts,
                to: Rts,
                extra: mask::CAP,
            },
            UnsupportedTransition { from: Rts, to: Sqd },
            BadPkeyIndex {
                index: 1,
                tbl_len: 1,
            },
            BadPathMtu { mtu: 9, max: 5 },
            BadAccessFlags {
                flags: 1 << 9,
                unknown: 1 << 9,
            },
            OutOfRange {
                attr: "timeout",
                value: 40,
                max: 31,
            },
            AvNotGlobal,
            BadSgidIndex {
                index: 20,
                tbl_len: 16,
            },
            AvNotIpv4Mapped { dgid: [0; 16] },
            AvBadIpv4 {
                addr: [0; 4],
                reason: "x",
            },
        ];
        for e in all {
            let want = match e {
                UnsupportedMaskBits { .. } | UnsupportedTransition { .. } => errno::EOPNOTSUPP,
                _ => errno::EINVAL,
            };
            assert_eq!(e.errno(), want, "{e:?}");
            assert!(e.describe().len() > 10, "{e:?}");
        }
        assert!(BadPathMtu { mtu: 9, max: 5 }.describe().contains("4096"));
    }

    // ---------------- create ----------------

    fn cap(sw: u32, rw: u32, ss: u32, rs: u32, inl: u32) -> QpCap {
        QpCap {
            max_send_wr: sw,
            max_recv_wr: rw,
            max_send_sge: ss,
            max_recv_sge: rs,
            max_inline_data: inl,
        }
    }

    #[test]
    fn create_rc_rounds_wr_counts() {
        let got = validate_create(&cap(100, 1, 2, 3, 64), qp_type::RC, false, &L).unwrap();
        assert_eq!(got, cap(128, 1, 2, 3, 64));
        let got = validate_create(
            &cap(
                L.max_qp_wr,
                L.max_qp_wr,
                L.max_sge,
                L.max_sge,
                L.max_inline_data,
            ),
            qp_type::RC,
            false,
            &L,
        )
        .unwrap();
        assert_eq!(
            got,
            cap(
                L.max_qp_wr,
                L.max_qp_wr,
                L.max_sge,
                L.max_sge,
                L.max_inline_data
            )
        );
        let got =
            validate_create(&cap(L.max_qp_wr - 1, 3, 0, 0, 0), qp_type::RC, false, &L).unwrap();
        assert_eq!(got.max_send_wr, L.max_qp_wr);
        assert_eq!(got.max_recv_wr, 4);
    }

    #[test]
    fn create_receive_only_qp() {
        // qperf's servers: max_send_wr = 0 (InfiniBand providers accept it).
        let got = validate_create(&cap(0, 64, 0, 1, 0), qp_type::RC, false, &L).unwrap();
        assert_eq!(got, cap(0, 64, 0, 1, 0));
    }

    #[test]
    fn create_non_rc_is_eopnotsupp() {
        for t in [
            0,
            1,
            qp_type::UC,
            qp_type::UD,
            qp_type::RAW_PACKET,
            qp_type::XRC_SEND,
            qp_type::XRC_RECV,
            qp_type::DRIVER,
        ] {
            let e = validate_create(&cap(1, 1, 1, 1, 0), t, false, &L).unwrap_err();
            assert_eq!(e, CreateError::UnsupportedQpType { qp_type: t });
            assert_eq!(e.errno(), errno::EOPNOTSUPP);
            assert!(e.describe().contains("RC"));
        }
    }

    #[test]
    fn create_limits_are_einval() {
        let over = [
            (
                cap(L.max_qp_wr + 1, 1, 1, 1, 0),
                CreateError::TooManyWr {
                    queue: "max_send_wr",
                    requested: L.max_qp_wr + 1,
                    max: L.max_qp_wr,
                },
            ),
            (
                cap(1, L.max_qp_wr + 1, 1, 1, 0),
                CreateError::TooManyWr {
                    queue: "max_recv_wr",
                    requested: L.max_qp_wr + 1,
                    max: L.max_qp_wr,
                },
            ),
            (
                cap(1, 1, L.max_sge + 1, 1, 0),
                CreateError::TooManySge {
                    queue: "max_send_sge",
                    requested: L.max_sge + 1,
                    max: L.max_sge,
                },
            ),
            (
                cap(1, 1, 1, L.max_sge + 1, 0),
                CreateError::TooManySge {
                    queue: "max_recv_sge",
                    requested: L.max_sge + 1,
                    max: L.max_sge,
                },
            ),
            (
                cap(1, 1, 1, 1, L.max_inline_data + 1),
                CreateError::InlineTooLarge {
                    requested: L.max_inline_data + 1,
                    max: L.max_inline_data,
                },
            ),
            (
                cap(u32::MAX, 1, 1, 1, 0),
                CreateError::TooManyWr {
                    queue: "max_send_wr",
                    requested: u32::MAX,
                    max: L.max_qp_wr,
                },
            ),
        ];
        for (c, want) in over {
            let e = validate_create(&c, qp_type::RC, false, &L).unwrap_err();
            assert_eq!(e, want);
            assert_eq!(e.errno(), errno::EINVAL);
        }
    }

    #[test]
    fn create_with_srq_ignores_receive_caps() {
        let got =
            validate_create(&cap(4, u32::MAX, 1, u32::MAX, 0), qp_type::RC, true, &L).unwrap();
        assert_eq!(got, cap(4, 0, 1, 0, 0));
        // Send-side limits still apply.
        let e =
            validate_create(&cap(4, 0, L.max_sge + 1, 0, 0), qp_type::RC, true, &L).unwrap_err();
        assert_eq!(e.errno(), errno::EINVAL);
    }

    #[test]
    fn create_zero_recv_without_srq_is_allowed() {
        let got = validate_create(&cap(1, 0, 0, 0, 0), qp_type::RC, false, &L).unwrap();
        assert_eq!(got, cap(1, 0, 0, 0, 0));
    }

    #[test]
    fn create_flags_and_resource_counts() {
        assert!(validate_create_flags(0).is_ok());
        let e = validate_create_flags(1 << 1).unwrap_err();
        assert_eq!(e.errno(), errno::EOPNOTSUPP);
        assert!(check_resource_count("QP", L.max_qp - 1, L.max_qp).is_ok());
        let e = check_resource_count("QP", L.max_qp, L.max_qp).unwrap_err();
        assert_eq!(
            e,
            CreateError::ResourceExhausted {
                what: "QP",
                max: L.max_qp
            }
        );
        assert_eq!(e.errno(), errno::ENOMEM);
        assert!(format!("{e}").contains("4095"));
    }

    #[test]
    fn created_qp_then_modified_keeps_caps() {
        let c = validate_create(&cap(10, 10, 2, 2, 32), qp_type::RC, false, &L).unwrap();
        let mut qp = init_attrs_from_create(&c);
        let req = good_req(Init, Reset);
        validate_modify(&qp, &req, minimal(Reset, Init), &L).unwrap();
        apply(&mut qp, &req, minimal(Reset, Init));
        assert_eq!(qp.cap, cap(16, 16, 2, 2, 32));
        assert_eq!(qp.port_num, 1);
    }
}
