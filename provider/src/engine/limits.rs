//! Device and port capabilities that uiw reports through `ibv_query_device`,
//! `ibv_query_device_ex` and `ibv_query_port`, and that the engine enforces
//! when objects are created or QPs are modified.
//!
//! The values describe a plausible RNIC rather than "infinite": applications
//! (perftest, MPI libraries, NCCL-style transports) size their queues from
//! these numbers, so they must be large enough for real workloads and small
//! enough that the engine can honour every one of them without overflowing
//! its own index arithmetic.  The Linux soft-iWARP driver
//! (`drivers/infiniband/sw/siw/siw.h`, `SIW_MAX_*`, and `siw_query_device` /
//! `siw_query_port` in `siw_verbs.c`) is the main guide; where uiw differs the
//! doc comment says why.
//!
//! Everything here is plain data: `pub const` scalars plus one
//! [`DeviceLimits`] value, [`DeviceLimits::UIW`], gathering them so callers
//! (and tests) can pass alternative limits around.
//!
//! Numeric enum values (`IBV_MTU_*`, `IBV_ATOMIC_*`, `IBV_NODE_*`, ...) are
//! those of rdma-core `libibverbs/verbs.h`.

#![forbid(unsafe_code)]
#![allow(dead_code)]

// ---------------------------------------------------------------------------
// rdma-core enum values used below (libibverbs/verbs.h)
// ---------------------------------------------------------------------------

/// `IBV_MTU_256` (`enum ibv_mtu`).
pub const IBV_MTU_256: u32 = 1;
/// `IBV_MTU_512`.
pub const IBV_MTU_512: u32 = 2;
/// `IBV_MTU_1024`.
pub const IBV_MTU_1024: u32 = 3;
/// `IBV_MTU_2048`.
pub const IBV_MTU_2048: u32 = 4;
/// `IBV_MTU_4096`, the largest value `enum ibv_mtu` can express.
pub const IBV_MTU_4096: u32 = 5;

/// `IBV_ATOMIC_NONE` (`enum ibv_atomic_cap`): no remote atomics.
pub const IBV_ATOMIC_NONE: u32 = 0;
/// `IBV_ATOMIC_HCA`: atomics are atomic with respect to other atomics on the
/// same device (what RFC 7306 iWARP atomics would give).
pub const IBV_ATOMIC_HCA: u32 = 1;
/// `IBV_ATOMIC_GLOB`: atomic with respect to CPU accesses too.
pub const IBV_ATOMIC_GLOB: u32 = 2;

/// `IBV_NODE_RNIC` (`enum ibv_node_type`): an iWARP RDMA NIC.
pub const IBV_NODE_RNIC: u32 = 4;
/// `IBV_TRANSPORT_IWARP` (`enum ibv_transport_type`).
pub const IBV_TRANSPORT_IWARP: u32 = 1;
/// `IBV_LINK_LAYER_ETHERNET` (`ibv_port_attr.link_layer`).
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

// ---------------------------------------------------------------------------
// Device attributes (struct ibv_device_attr)
// ---------------------------------------------------------------------------

/// Maximum number of QPs per device: what one process can really create.
///
/// A QP number is `slot << 12 | index` (the slot names the process's listening port, see
/// `transport.rs`), index 0 unused: 4095 QPs per process, and `ibv_create_qp` fails with
/// ENOMEM at the 4096th. Every RC QP also owns a TCP connection (a file descriptor), so
/// `RLIMIT_NOFILE` may bind first (the default soft limit, 1024).
pub const MAX_QP: u32 = 4095;

/// Maximum work requests per send or receive queue.
///
/// ≥ 4096 so that perftest's default `--tx-depth`/`--rx-depth` and MPI eager
/// queues fit.  siw allows 32 Ki; uiw picks 16 Ki, which keeps a full queue of
/// 16 Ki WQEs × (header + 32 SGEs) well under 16 MiB.  Must stay a power of
/// two: queue sizes are rounded up to a power of two (free-running
/// producer/consumer indices, as in siw), and the rounded value must not
/// exceed this limit.
pub const MAX_QP_WR: u32 = 16_384;

/// Maximum scatter/gather entries per send or receive WR.
///
/// siw exposes only `SIW_MAX_SGE` = 6 because its WQE layout is a fixed ABI
/// shared with the kernel; uiw's queues live entirely in user space, so it can
/// afford 32, which covers iovec-heavy users (e.g. storage targets, UCX).
pub const MAX_SGE: u32 = 32;

/// Maximum SGEs in the local (sink) SGL of an RDMA READ.
///
/// An iWARP RDMA Read Request carries a single Data Sink STag/TO (RFC 5040
/// §4.4), which is why siw reports `SIW_MAX_SGE_RD` = 1.  uiw places read
/// responses itself: the requester keeps the WR's SGL in its ORQ entry and
/// scatters the tagged payload across it on arrival, so a multi-SGE READ is
/// legal and `max_sge_rd` equals `max_sge`.  If the engine ever maps the sink
/// onto a single registered buffer instead, this must drop to 1.
pub const MAX_SGE_RD: u32 = MAX_SGE;

/// Maximum number of CQs per device.  One or two per QP is the common usage,
/// so this matches [`MAX_QP`] (siw uses the same bound for both).
pub const MAX_CQ: u32 = 32_768;

/// Maximum CQ depth.
///
/// 2^22 − 1, the value ConnectX-class devices report: a request for `n`
/// entries is rounded up to `(n + 1).next_power_of_two()` slots internally and
/// that must never exceed 2^22 (a 4 Mi-entry ring of 64-byte CQEs is 256 MiB,
/// the largest single allocation uiw is willing to make for a CQ).  Large
/// enough to back [`MAX_QP_WR`]-deep queues of 256 QPs on one CQ.
pub const MAX_CQE: u32 = (1 << 22) - 1;

/// Maximum number of memory regions.
///
/// The STag index is 24 bits (RFC 5040 §2.1: STag = 24-bit index + 8-bit
/// key), so at most 2^24 − 1 are addressable; 2^20 leaves room for the engine
/// to reserve index ranges for internal use and is far beyond what any
/// realistic process registers (siw: 10 per QP ≈ 1 Mi as well).
pub const MAX_MR: u32 = 1 << 20;

/// Maximum size of one memory region.
///
/// iWARP Tagged Offsets are 64-bit (RFC 5040 §4.1), and a software provider
/// has no page-table size limit, so like siw (`max_mr_size = ~0ull`) uiw
/// reports `u64::MAX`; the real limit is the process address space, which
/// `ibv_reg_mr` discovers when pinning/validating the range.
pub const MAX_MR_SIZE: u64 = u64::MAX;

/// Maximum protection domains.  PDs are cheap (an id), one per QP is the
/// worst realistic case, so this equals [`MAX_QP`] (siw: `SIW_MAX_PD = SIW_MAX_QP`).
pub const MAX_PD: u32 = MAX_QP;

/// Maximum inbound RDMA READ (and, later, atomic) requests a QP can have
/// outstanding as a responder: the IRD, bound for `max_dest_rd_atomic`.
///
/// ≥ 16 so that perftest's default `--outs` (16) is accepted.  MPA v2
/// (RFC 6581 §5) carries IRD/ORD in 14-bit fields, so anything up to 16383
/// could be negotiated; 128 matches siw (`SIW_MAX_IRD_QP`) and bounds the
/// per-QP inbound read queue to a small fixed array.
pub const MAX_QP_RD_ATOM: u32 = 128;

/// Maximum outbound RDMA READs (and, later, atomics) a QP may have in flight
/// as a requester: the ORD, bound for `max_rd_atomic`.  Same reasoning as
/// [`MAX_QP_RD_ATOM`] (siw: `SIW_MAX_ORD_QP` = 128).
pub const MAX_QP_INIT_RD_ATOM: u32 = 128;

/// Total inbound read resources on the device.  Each QP has its own
/// fixed-size IRQ, so this is simply `MAX_QP × MAX_QP_RD_ATOM`, exactly as
/// siw computes it (`max_qp * max_ird`).  4 Mi, fits the C `int`.
pub const MAX_RES_RD_ATOM: u32 = MAX_QP * MAX_QP_RD_ATOM;

/// Maximum shared receive queues; one per QP at most, so equal to [`MAX_QP`]
/// (siw: `SIW_MAX_SRQ = SIW_MAX_QP`).
pub const MAX_SRQ: u32 = MAX_QP;

/// Maximum depth of one SRQ.
///
/// An SRQ feeds many QPs, so it is allowed to be deeper than a QP's RQ
/// (siw: 10 × `SIW_MAX_QP_WR`).  uiw uses 4 × [`MAX_QP_WR`] = 64 Ki, kept a
/// power of two for the same ring-index reason as [`MAX_QP_WR`].
pub const MAX_SRQ_WR: u32 = 4 * MAX_QP_WR;

/// Maximum SGEs per SRQ receive WR; same WQE format as a QP's RQ, so the same
/// bound as [`MAX_SGE`].
pub const MAX_SRQ_SGE: u32 = MAX_SGE;

/// Maximum inline payload of a send WR (`IBV_SEND_INLINE`).
///
/// ≥ 64 so that common latency tests (perftest uses up to 236 bytes for RC
/// when the device allows it) and small-message RPC libraries can inline; uiw
/// copies inline data into the WQE at post time, so 256 bytes costs one
/// 256-byte region per WQE slot.  siw's 80 bytes (`SIW_MAX_INLINE`) comes from
/// reusing five 16-byte SGE slots of its kernel-shared WQE, a constraint uiw
/// does not have.
pub const MAX_INLINE_DATA: u32 = 256;

/// Supported page sizes bitmap: 4 KiB, the host base page, as siw reports
/// (`PAGE_SIZE`).  A software provider accepts any buffer alignment; this only
/// tells kernel-style consumers which granule MR bookkeeping uses.
pub const PAGE_SIZE_CAP: u64 = 4096;

/// Memory windows are not supported (siw: `SIW_MAX_MW` = 0).  `ibv_alloc_mw`
/// fails with `EOPNOTSUPP`.
pub const MAX_MW: u32 = 0;

/// Atomic capability: [`IBV_ATOMIC_HCA`]. RFC 7306 atomics work between uiw
/// peers (negotiated in MPA); they are performed by the target's engine with
/// CPU atomics, so they are atomic among RDMA atomics of any QP of the host.
/// Towards a peer without RFC 7306 (siw reports `IBV_ATOMIC_NONE`) an atomic
/// WR completes locally with `IBV_WC_LOC_QP_OP_ERR`.
pub const ATOMIC_CAP: u32 = IBV_ATOMIC_HCA;

/// `IBV_DEVICE_MEM_MGT_EXTENSIONS` (`enum ibv_device_cap_flags`, 1 << 21).
pub const IBV_DEVICE_MEM_MGT_EXTENSIONS: u32 = 1 << 21;

/// `device_cap_flags`: what siw reports (`siw_query_device`:
/// `IB_DEVICE_MEM_MGT_EXTENSIONS`, the only flag of its own), and each promise
/// kept. For a user-space provider the memory management extensions are Send
/// with Invalidate (sent, and served: RFC 5040 §5.2, the peer's STag stops
/// working remotely) and `IBV_WR_LOCAL_INV` (executed in send-queue order,
/// completes as `IBV_WC_LOCAL_INV`). Fast registration (`IB_WR_REG_MR`) is a
/// kernel verb with no libibverbs counterpart. SPDK's NVMe-oF target tests this
/// bit before it answers with Send with Invalidate. Every other optional
/// capability (`_RESIZE_MAX_WR`, `_SRQ_RESIZE`, `_MEM_WINDOW`, APM, port
/// change, ...) is not implemented and not claimed.
pub const DEVICE_CAP_FLAGS: u32 = IBV_DEVICE_MEM_MGT_EXTENSIONS;

/// IEEE vendor id (24-bit OUI) reported in `vendor_id`.
///
/// `0x02_75_77`: first octet `0x02` has the IEEE "locally administered" bit
/// set (and is in the SLAP AAI quadrant, not the CID quadrant), so the IEEE
/// registration authority never assigns it to any company — it cannot collide
/// with a real vendor.  The remaining octets are ASCII `'u' 'w'`.  (siw uses
/// the equally unregistered `0x626d74`, "bmt".)  Consumers that key quirks off
/// the vendor (perftest disables inline for unknown vendors, for example)
/// treat uiw as a generic device, which is what we want.
pub const VENDOR_ID: u32 = 0x02_75_77;

/// `vendor_part_id`: `0x7569` (ASCII "ui").  Some tools switch on the part id
/// alone (perftest's device-name table matches Mellanox part ids 4096..4131,
/// 0x6732..0x6778, 0xa2d2..), so uiw picks a value outside every known range.
pub const VENDOR_PART_ID: u32 = 0x7569;

/// `hw_ver`: 0 — there is no hardware revision; software changes are tracked
/// by [`FW_VER`].
pub const HW_VER: u32 = 0;

/// `fw_ver` string: the uiw engine version.  rdma-core copies it into a
/// 64-byte `char` array, so it must stay short.
pub const FW_VER: &str = "0.1.0";

/// `max_ah`: address handles are UD-only; uiw supports RC only, so 0.
pub const MAX_AH: u32 = 0;

/// `max_pkeys`: iWARP has no partitions; the single P_Key table entry is the
/// default full-membership key.  Equals [`PKEY_TBL_LEN`].
pub const MAX_PKEYS: u32 = PKEY_TBL_LEN;

/// `local_ca_ack_delay`: only meaningful for IB transport-timer computation;
/// TCP owns retransmission on iWARP, so 0 (what siw leaves it at).
pub const LOCAL_CA_ACK_DELAY: u8 = 0;

/// `phys_port_cnt`: one port, number 1, bound to the host's IP stack.
pub const PHYS_PORT_CNT: u8 = 1;

// ---------------------------------------------------------------------------
// Port attributes (struct ibv_port_attr)
// ---------------------------------------------------------------------------

/// Largest `path_mtu` a QP may request: `IBV_MTU_4096`.
///
/// On iWARP the path MTU is advisory — TCP segments by its MSS and MPA FPDUs
/// are sized from that — so uiw accepts any valid `enum ibv_mtu` value up to
/// the largest the enum expresses, which is what perftest and rping request by
/// default on jumbo-frame networks.
pub const PORT_MAX_MTU: u32 = IBV_MTU_4096;

/// Default `active_mtu` reported when the interface MTU is unknown:
/// `IBV_MTU_1024`, the largest IB MTU that fits a standard 1500-byte Ethernet
/// frame (siw reports `ib_mtu_int_to_enum(netdev->mtu)`, which gives the same
/// for 1500).  The provider may compute a better value from the route.
pub const PORT_DEFAULT_ACTIVE_MTU: u32 = IBV_MTU_1024;

/// GID table length.  uiw GIDs are IPv4-mapped IPv6 addresses
/// (`::ffff:a.b.c.d`) of the host's interfaces, so the table holds one entry
/// per local IPv4 address; 16 covers multi-homed hosts and containers
/// (siw reports 1 because it binds to a single netdev; uiw binds to the host
/// IP stack as a whole).
pub const GID_TBL_LEN: u32 = 16;

/// P_Key table length: 1.  iWARP has no partitions; index 0 holds 0xFFFF and
/// `pkey_index` must therefore always be 0.
pub const PKEY_TBL_LEN: u32 = 1;

/// Largest message (sum of SGE lengths) uiw transfers: 2^31 bytes.
///
/// `ibv_sge.length` and `ibv_wc.byte_len` are `uint32_t`, and an iWARP RDMA
/// Read Request's length field is 32-bit, so a message can never exceed
/// 2^32 − 1; capping at 2^31 keeps every length representable as a positive
/// C `int`, which several consumers (and the engine's signed offset checks)
/// rely on.  siw reports 0xFFFFFFFF.
pub const MAX_MSG_SZ: u32 = 1 << 31;

/// All limits together, so callers can pass them by reference and tests can
/// substitute smaller ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    /// See [`MAX_QP`].
    pub max_qp: u32,
    /// See [`MAX_QP_WR`].
    pub max_qp_wr: u32,
    /// See [`MAX_SGE`] (reported as both max_send_sge and max_recv_sge).
    pub max_sge: u32,
    /// See [`MAX_SGE_RD`].
    pub max_sge_rd: u32,
    /// See [`MAX_CQ`].
    pub max_cq: u32,
    /// See [`MAX_CQE`].
    pub max_cqe: u32,
    /// See [`MAX_MR`].
    pub max_mr: u32,
    /// See [`MAX_MR_SIZE`].
    pub max_mr_size: u64,
    /// See [`MAX_PD`].
    pub max_pd: u32,
    /// See [`MAX_QP_RD_ATOM`] (responder depth, bounds `max_dest_rd_atomic`).
    pub max_qp_rd_atom: u32,
    /// See [`MAX_QP_INIT_RD_ATOM`] (initiator depth, bounds `max_rd_atomic`).
    pub max_qp_init_rd_atom: u32,
    /// See [`MAX_RES_RD_ATOM`].
    pub max_res_rd_atom: u32,
    /// See [`MAX_SRQ`].
    pub max_srq: u32,
    /// See [`MAX_SRQ_WR`].
    pub max_srq_wr: u32,
    /// See [`MAX_SRQ_SGE`].
    pub max_srq_sge: u32,
    /// See [`MAX_INLINE_DATA`].
    pub max_inline_data: u32,
    /// See [`PAGE_SIZE_CAP`].
    pub page_size_cap: u64,
    /// See [`MAX_MW`].
    pub max_mw: u32,
    /// See [`MAX_AH`].
    pub max_ah: u32,
    /// See [`MAX_PKEYS`].
    pub max_pkeys: u32,
    /// See [`ATOMIC_CAP`]; an `IBV_ATOMIC_*` value.
    pub atomic_cap: u32,
    /// See [`DEVICE_CAP_FLAGS`].
    pub device_cap_flags: u32,
    /// See [`VENDOR_ID`].
    pub vendor_id: u32,
    /// See [`VENDOR_PART_ID`].
    pub vendor_part_id: u32,
    /// See [`HW_VER`].
    pub hw_ver: u32,
    /// See [`FW_VER`].
    pub fw_ver: &'static str,
    /// See [`LOCAL_CA_ACK_DELAY`].
    pub local_ca_ack_delay: u8,
    /// See [`PHYS_PORT_CNT`].
    pub phys_port_cnt: u8,
    /// `IBV_NODE_RNIC`: rdma-core derives `IBV_TRANSPORT_IWARP` from it.
    pub node_type: u32,
    /// See [`PORT_MAX_MTU`].
    pub port_max_mtu: u32,
    /// See [`PORT_DEFAULT_ACTIVE_MTU`].
    pub port_active_mtu: u32,
    /// See [`GID_TBL_LEN`].
    pub gid_tbl_len: u32,
    /// See [`PKEY_TBL_LEN`].
    pub pkey_tbl_len: u32,
    /// See [`MAX_MSG_SZ`].
    pub max_msg_sz: u32,
    /// `IBV_LINK_LAYER_ETHERNET`: iWARP runs over TCP/IP on Ethernet.
    pub link_layer: u8,
}

impl DeviceLimits {
    /// The capabilities of the uiw device.
    pub const UIW: DeviceLimits = DeviceLimits {
        max_qp: MAX_QP,
        max_qp_wr: MAX_QP_WR,
        max_sge: MAX_SGE,
        max_sge_rd: MAX_SGE_RD,
        max_cq: MAX_CQ,
        max_cqe: MAX_CQE,
        max_mr: MAX_MR,
        max_mr_size: MAX_MR_SIZE,
        max_pd: MAX_PD,
        max_qp_rd_atom: MAX_QP_RD_ATOM,
        max_qp_init_rd_atom: MAX_QP_INIT_RD_ATOM,
        max_res_rd_atom: MAX_RES_RD_ATOM,
        max_srq: MAX_SRQ,
        max_srq_wr: MAX_SRQ_WR,
        max_srq_sge: MAX_SRQ_SGE,
        max_inline_data: MAX_INLINE_DATA,
        page_size_cap: PAGE_SIZE_CAP,
        max_mw: MAX_MW,
        max_ah: MAX_AH,
        max_pkeys: MAX_PKEYS,
        atomic_cap: ATOMIC_CAP,
        device_cap_flags: DEVICE_CAP_FLAGS,
        vendor_id: VENDOR_ID,
        vendor_part_id: VENDOR_PART_ID,
        hw_ver: HW_VER,
        fw_ver: FW_VER,
        local_ca_ack_delay: LOCAL_CA_ACK_DELAY,
        phys_port_cnt: PHYS_PORT_CNT,
        node_type: IBV_NODE_RNIC,
        port_max_mtu: PORT_MAX_MTU,
        port_active_mtu: PORT_DEFAULT_ACTIVE_MTU,
        gid_tbl_len: GID_TBL_LEN,
        pkey_tbl_len: PKEY_TBL_LEN,
        max_msg_sz: MAX_MSG_SZ,
        link_layer: IBV_LINK_LAYER_ETHERNET,
    };

    /// Checks the internal consistency rules the engine relies on (queue
    /// sizes are powers of two, every value fits the C `int` it is reported
    /// through, MPA IRD/ORD fit 14 bits, ...).  Returns the first violated
    /// rule as text.  Used by tests and available for debug assertions when
    /// limits are overridden.
    pub fn check(&self) -> Result<(), String> {
        fn rule(ok: bool, what: &str) -> Result<(), String> {
            if ok {
                Ok(())
            } else {
                Err(what.to_string())
            }
        }
        const INT_MAX: u32 = i32::MAX as u32;
        rule(
            self.max_qp >= 1 && self.max_qp <= INT_MAX,
            "max_qp in 1..=INT_MAX",
        )?;
        rule(
            self.max_qp_wr.is_power_of_two(),
            "max_qp_wr must be a power of two (queues are rounded up to one)",
        )?;
        rule(
            self.max_srq_wr.is_power_of_two(),
            "max_srq_wr must be a power of two (queues are rounded up to one)",
        )?;
        rule(
            self.max_sge >= 1 && self.max_sge <= INT_MAX,
            "max_sge in 1..=INT_MAX",
        )?;
        rule(
            self.max_sge_rd >= 1 && self.max_sge_rd <= self.max_sge,
            "max_sge_rd in 1..=max_sge",
        )?;
        rule(self.max_srq_sge <= self.max_sge, "max_srq_sge <= max_sge")?;
        rule(
            self.max_cqe < INT_MAX && (self.max_cqe as u64 + 1).is_power_of_two(),
            "max_cqe + 1 must be a power of two below INT_MAX",
        )?;
        rule(
            self.max_mr < (1 << 24),
            "max_mr must fit the 24-bit STag index",
        )?;
        rule(
            self.max_qp_rd_atom < (1 << 14) && self.max_qp_init_rd_atom < (1 << 14),
            "IRD/ORD must fit MPA v2's 14-bit fields",
        )?;
        rule(
            self.max_qp_rd_atom <= u8::MAX as u32 && self.max_qp_init_rd_atom <= u8::MAX as u32,
            "IRD/ORD must fit ibv_qp_attr's uint8_t max_(dest_)rd_atomic",
        )?;
        rule(
            self.max_res_rd_atom as u64 == self.max_qp as u64 * self.max_qp_rd_atom as u64,
            "max_res_rd_atom = max_qp * max_qp_rd_atom",
        )?;
        rule(self.max_res_rd_atom <= INT_MAX, "max_res_rd_atom fits int")?;
        rule(
            self.atomic_cap <= IBV_ATOMIC_GLOB,
            "atomic_cap is an ibv_atomic_cap value",
        )?;
        rule(self.vendor_id < (1 << 24), "vendor_id is a 24-bit OUI")?;
        rule(
            !self.fw_ver.is_empty() && self.fw_ver.len() < 64,
            "fw_ver fits char[64]",
        )?;
        rule(
            (IBV_MTU_256..=IBV_MTU_4096).contains(&self.port_max_mtu)
                && (IBV_MTU_256..=self.port_max_mtu).contains(&self.port_active_mtu),
            "port MTUs are ibv_mtu values, active <= max",
        )?;
        rule(
            self.gid_tbl_len >= 1 && self.gid_tbl_len <= INT_MAX,
            "gid_tbl_len >= 1",
        )?;
        rule(
            self.pkey_tbl_len >= 1 && self.pkey_tbl_len <= u16::MAX as u32,
            "pkey_tbl_len in 1..=65535",
        )?;
        rule(
            self.max_pkeys == self.pkey_tbl_len,
            "max_pkeys == pkey_tbl_len",
        )?;
        rule(self.phys_port_cnt == 1, "uiw has exactly one port")?;
        rule(self.max_msg_sz >= 1, "max_msg_sz >= 1")?;
        Ok(())
    }
}

impl Default for DeviceLimits {
    fn default() -> Self {
        DeviceLimits::UIW
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uiw_limits_are_consistent() {
        assert_eq!(DeviceLimits::UIW.check(), Ok(()));
        assert_eq!(DeviceLimits::default(), DeviceLimits::UIW);
    }

    #[test]
    fn brief_minimums_hold() {
        let l = DeviceLimits::UIW;
        assert!(l.max_qp_wr >= 4096);
        assert!(l.max_sge >= 6, "at least siw's SIW_MAX_SGE");
        assert!(l.max_qp_rd_atom >= 16 && l.max_qp_init_rd_atom >= 16);
        assert!(l.max_inline_data >= 64);
        assert_eq!(l.max_mw, 0);
        assert_eq!(l.atomic_cap, IBV_ATOMIC_HCA, "RFC 7306 atomics between uiw peers");
        assert_eq!(l.port_max_mtu, IBV_MTU_4096);
        assert_eq!(l.port_max_mtu, 5);
        assert_eq!(l.pkey_tbl_len, 1);
        assert_eq!(l.gid_tbl_len, 16);
        assert_eq!(l.fw_ver, "0.1.0");
        assert_eq!(l.max_msg_sz, 1u32 << 31);
        assert_eq!(l.node_type, IBV_NODE_RNIC);
        assert_eq!(l.link_layer, IBV_LINK_LAYER_ETHERNET);
    }

    #[test]
    fn values_fit_c_ints() {
        let l = DeviceLimits::UIW;
        for (name, v) in [
            ("max_qp", l.max_qp),
            ("max_qp_wr", l.max_qp_wr),
            ("max_sge", l.max_sge),
            ("max_cq", l.max_cq),
            ("max_cqe", l.max_cqe),
            ("max_mr", l.max_mr),
            ("max_pd", l.max_pd),
            ("max_res_rd_atom", l.max_res_rd_atom),
            ("max_srq", l.max_srq),
            ("max_srq_wr", l.max_srq_wr),
        ] {
            assert!(v <= i32::MAX as u32, "{name} = {v} does not fit int");
            assert!(v > 0, "{name} must be positive");
        }
    }

    #[test]
    fn vendor_id_is_locally_administered() {
        let first_octet = (VENDOR_ID >> 16) as u8;
        assert_eq!(first_octet & 0x02, 0x02, "U/L bit set: never IEEE-assigned");
        assert_eq!(first_octet & 0x01, 0x00, "not a group address");
        // Not in the CID (Company ID) quadrant, whose low nibble is 0b1010.
        assert_ne!(first_octet & 0x0f, 0x0a);
        assert_ne!(VENDOR_ID, 0x626d74, "distinct from siw's vendor id");
    }

    #[test]
    fn check_rejects_bad_overrides() {
        let mut l = DeviceLimits::UIW;
        l.max_qp_wr = 10_000;
        assert!(l.check().is_err());
        let mut l = DeviceLimits::UIW;
        l.max_qp_rd_atom = 1 << 14;
        assert!(l.check().is_err());
        let mut l = DeviceLimits::UIW;
        l.max_cqe = 1 << 22;
        assert!(l.check().is_err());
        let mut l = DeviceLimits::UIW;
        l.atomic_cap = IBV_ATOMIC_HCA; // the planned RFC 7306 switch stays valid
        assert_eq!(l.check(), Ok(()));
    }
}
