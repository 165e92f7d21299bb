//! Hand-written mirror of libibverbs' *private* provider ABI (`libibverbs/driver.h`, exported as
//! `IBVERBS_PRIVATE_34` by rdma-core v36–v56 and as `IBVERBS_PRIVATE_57`, `_59`, `_64`, `_65` by
//! the releases after it). No distribution installs `driver.h`, so these layouts are ours to
//! keep right: each struct below was checked field by field against rdma-core v36.0, v44.0,
//! v56.1, v58.0, v59.0, v62.0, v64.0 and v65.0 (`verbs_sysfs_dev`, `verbs_device_ops`,
//! `verbs_device`, `verbs_match_ent`, `verbs_mr`, `verbs_cq`, `verbs_srq` and `verbs_qp` are
//! identical in all of them), and `tests/layout.rs` pins every size and offset. What differs
//! between those releases is written down in `kabi/README.md`.
//!
//! Three layouts *do* move with the release of the libibverbs the process loaded:
//! - `verbs_qp` embeds `ibv_qp_ex`, which gained `wr_atomic_write` in v44 and `wr_flush` in v45,
//!   so the `comp_mask` that follows it sits 0, 8 or 16 bytes further on. See [`VerbsQp`].
//! - `verbs_context_ops` is in alphabetical order and gains slots in the middle (v59, v62, v64,
//!   v65). [`VerbsContextOps`] is the v36–v58 table; [`context_ops_slots`] lays it out for the
//!   running release. See [`CONTEXT_OPS`].
//! - `verbs_context` (verbs.h) "grows up": new members go *before* the old ones (v59, v62,
//!   v64), so the `ibv_context` at its end moves away from its start. See
//!   [`verbs_context_head`].

use core::ffi::{c_char, c_int, c_void};

use crate::verbs::*;

/// `IBV_SYSFS_NAME_MAX` (verbs.h).
pub const IBV_SYSFS_NAME_MAX: usize = 64;
/// `IBV_SYSFS_PATH_MAX` (verbs.h).
pub const IBV_SYSFS_PATH_MAX: usize = 256;

/// A `struct list_node` from ccan/list.h: two pointers.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ListNode {
    pub next: *mut ListNode,
    pub prev: *mut ListNode,
}

/// `verbs_match_ent.kind`.
pub const VERBS_MATCH_SENTINEL: u8 = 0;
pub const VERBS_MATCH_PCI: u8 = 1;
pub const VERBS_MATCH_MODALIAS: u8 = 2;
pub const VERBS_MATCH_DRIVER_ID: u8 = 3;

/// `union { const char *modalias; uint64_t driver_id; }` inside `verbs_match_ent`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union VerbsMatchU {
    pub modalias: *const c_char,
    pub driver_id: u64,
}

/// `struct verbs_match_ent`: one row of a provider's match table.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct VerbsMatchEnt {
    pub driver_data: *mut c_void,
    pub u: VerbsMatchU,
    pub vendor: u16,
    pub device: u16,
    pub kind: u8,
}
// SAFETY: match tables are immutable statics of pointers to other statics.
unsafe impl Sync for VerbsMatchEnt {}

/// `struct verbs_sysfs_dev`: an RDMA device libibverbs found in sysfs (or over netlink).
#[repr(C)]
pub struct VerbsSysfsDev {
    pub entry: ListNode,
    pub provider_data: *mut c_void,
    pub match_: *const VerbsMatchEnt,
    pub flags: u32,
    pub sysfs_name: [c_char; IBV_SYSFS_NAME_MAX],
    pub sysfs_cdev: libc::dev_t,
    pub ibdev_name: [c_char; IBV_SYSFS_NAME_MAX],
    pub ibdev_path: [c_char; IBV_SYSFS_PATH_MAX],
    pub modalias: [c_char; 512],
    pub node_guid: u64,
    pub driver_id: u32,
    pub node_type: u32,
    pub ibdev_idx: c_int,
    pub num_ports: u32,
    pub abi_ver: u32,
    pub time_created: libc::timespec,
}

/// `struct verbs_device_ops`: what a provider registers with `verbs_register_driver_34`.
#[repr(C)]
pub struct VerbsDeviceOps {
    pub name: *const c_char,
    pub match_min_abi_version: u32,
    pub match_max_abi_version: u32,
    pub match_table: *const VerbsMatchEnt,
    pub static_providers: *const *const VerbsDeviceOps,
    pub match_device: Option<unsafe extern "C" fn(*mut VerbsSysfsDev) -> bool>,
    pub alloc_context:
        Option<unsafe extern "C" fn(*mut ibv_device, c_int, *mut c_void) -> *mut verbs_context>,
    pub import_context: Option<unsafe extern "C" fn(*mut ibv_device, c_int) -> *mut verbs_context>,
    pub alloc_device: Option<unsafe extern "C" fn(*mut VerbsSysfsDev) -> *mut VerbsDevice>,
    pub uninit_device: Option<unsafe extern "C" fn(*mut VerbsDevice)>,
}
// SAFETY: the ops table is an immutable static.
unsafe impl Sync for VerbsDeviceOps {}

/// `struct verbs_device`: the provider allocates it (embedding `ibv_device` first);
/// libibverbs fills in `ops`, `refcount` and `sysfs`.
#[repr(C)]
pub struct VerbsDevice {
    pub device: ibv_device,
    pub ops: *const VerbsDeviceOps,
    pub refcount: c_int,
    pub entry: ListNode,
    pub sysfs: *mut VerbsSysfsDev,
    pub core_support: u64,
}

/// A `verbs_context_ops` slot uiw never fills: libibverbs then installs its own
/// `EOPNOTSUPP` stub there.
pub type OpaqueOp = Option<unsafe extern "C" fn()>;

/// `struct verbs_context_ops` of rdma-core v36–v58, in libibverbs' (alphabetical) slot order.
/// `verbs_set_ops` copies the non-NULL slots into the context; it reads the table in the layout
/// of the running release, which [`context_ops_slots`] produces from this one.
#[repr(C)]
#[derive(Default)]
pub struct VerbsContextOps {
    pub advise_mr: OpaqueOp,
    pub alloc_dm: OpaqueOp,
    pub alloc_mw: OpaqueOp,
    pub alloc_null_mr: OpaqueOp,
    pub alloc_parent_domain: OpaqueOp,
    pub alloc_pd: Option<unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd>,
    pub alloc_td: OpaqueOp,
    pub async_event: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_async_event)>,
    pub attach_counters_point_flow: OpaqueOp,
    pub attach_mcast: OpaqueOp,
    pub bind_mw: OpaqueOp,
    pub close_xrcd: OpaqueOp,
    pub cq_event: Option<unsafe extern "C" fn(*mut ibv_cq)>,
    pub create_ah: OpaqueOp,
    pub create_counters: OpaqueOp,
    pub create_cq: Option<unsafe extern "C" fn(*mut ibv_context, c_int, *mut ibv_comp_channel, c_int) -> *mut ibv_cq>,
    pub create_cq_ex: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex>,
    pub create_flow: OpaqueOp,
    pub create_flow_action_esp: OpaqueOp,
    pub create_qp: Option<unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp>,
    pub create_qp_ex: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp>,
    pub create_rwq_ind_table: OpaqueOp,
    pub create_srq: Option<unsafe extern "C" fn(*mut ibv_pd, *mut ibv_srq_init_attr) -> *mut ibv_srq>,
    pub create_srq_ex: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_srq_init_attr_ex) -> *mut ibv_srq>,
    pub create_wq: OpaqueOp,
    pub dealloc_mw: OpaqueOp,
    pub dealloc_pd: Option<unsafe extern "C" fn(*mut ibv_pd) -> c_int>,
    pub dealloc_td: OpaqueOp,
    pub dereg_mr: Option<unsafe extern "C" fn(*mut VerbsMr) -> c_int>,
    pub destroy_ah: OpaqueOp,
    pub destroy_counters: OpaqueOp,
    pub destroy_cq: Option<unsafe extern "C" fn(*mut ibv_cq) -> c_int>,
    pub destroy_flow: OpaqueOp,
    pub destroy_flow_action: OpaqueOp,
    pub destroy_qp: Option<unsafe extern "C" fn(*mut ibv_qp) -> c_int>,
    pub destroy_rwq_ind_table: OpaqueOp,
    pub destroy_srq: Option<unsafe extern "C" fn(*mut ibv_srq) -> c_int>,
    pub destroy_wq: OpaqueOp,
    pub detach_mcast: OpaqueOp,
    pub free_context: Option<unsafe extern "C" fn(*mut ibv_context)>,
    pub free_dm: OpaqueOp,
    pub get_srq_num: Option<unsafe extern "C" fn(*mut ibv_srq, *mut u32) -> c_int>,
    pub import_dm: OpaqueOp,
    pub import_mr: OpaqueOp,
    pub import_pd: OpaqueOp,
    pub modify_cq: OpaqueOp,
    pub modify_flow_action_esp: OpaqueOp,
    pub modify_qp: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int>,
    pub modify_qp_rate_limit: OpaqueOp,
    pub modify_srq: Option<unsafe extern "C" fn(*mut ibv_srq, *mut ibv_srq_attr, c_int) -> c_int>,
    pub modify_wq: OpaqueOp,
    pub open_qp: OpaqueOp,
    pub open_xrcd: OpaqueOp,
    pub poll_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int>,
    pub post_recv: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
    pub post_send: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int>,
    pub post_srq_ops: OpaqueOp,
    pub post_srq_recv: Option<unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
    pub query_device_ex: Option<unsafe extern "C" fn(*mut ibv_context, *const ibv_query_device_ex_input, *mut ibv_device_attr_ex, usize) -> c_int>,
    pub query_ece: OpaqueOp,
    pub query_port: Option<unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int>,
    pub query_qp: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int, *mut ibv_qp_init_attr) -> c_int>,
    pub query_qp_data_in_order: OpaqueOp,
    pub query_rt_values: OpaqueOp,
    pub query_srq: Option<unsafe extern "C" fn(*mut ibv_srq, *mut ibv_srq_attr) -> c_int>,
    pub read_counters: OpaqueOp,
    pub reg_dm_mr: OpaqueOp,
    pub reg_dmabuf_mr: OpaqueOp,
    pub reg_mr: Option<unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, u64, c_int) -> *mut ibv_mr>,
    pub req_notify_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int>,
    pub rereg_mr: Option<unsafe extern "C" fn(*mut VerbsMr, c_int, *mut ibv_pd, *mut c_void, usize, c_int) -> c_int>,
    pub resize_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int>,
    pub set_ece: OpaqueOp,
    pub unimport_dm: OpaqueOp,
    pub unimport_mr: OpaqueOp,
    pub unimport_pd: OpaqueOp,
}

/// `enum ibv_mr_type`.
pub const IBV_MR_TYPE_MR: u32 = 0;

/// `struct verbs_mr`: an `ibv_mr` with the type and access flags libibverbs keeps beside it.
#[repr(C)]
pub struct VerbsMr {
    pub ibv_mr: ibv_mr,
    pub mr_type: u32,
    pub access: c_int,
}

/// `struct verbs_cq`: `union { struct ibv_cq cq; struct ibv_cq_ex cq_ex; }`. `ibv_cq_ex` starts
/// with the very fields of `ibv_cq`, so the union is simply an `ibv_cq_ex`.
#[repr(C)]
pub struct VerbsCq {
    pub cq_ex: ibv_cq_ex,
}

/// `struct verbs_srq`.
#[repr(C)]
pub struct VerbsSrq {
    pub srq: ibv_srq,
    pub srq_type: u32,
    pub xrcd: *mut c_void,
    pub cq: *mut ibv_cq,
    pub srq_num: u32,
}

/// `enum verbs_qp_mask`.
pub const VERBS_QP_XRCD: u32 = 1 << 0;
pub const VERBS_QP_EX: u32 = 1 << 1;

/// Storage for `struct verbs_qp` that fits every libibverbs from v36 to v56.
///
/// C declares `struct verbs_qp { union { ibv_qp qp; ibv_qp_ex qp_ex; }; uint32_t comp_mask;
/// struct verbs_xrcd *xrcd; }`. `ibv_qp_ex` grows at its end (20 function slots up to v43,
/// `wr_atomic_write` added in v44, `wr_flush` in v45), so `comp_mask` moves with the version of
/// libibverbs the process loaded. This struct reserves room for the largest layout after the
/// compiled `ibv_qp_ex`; the provider writes `comp_mask` at [`VerbsQp::comp_mask_offset`] for the
/// running version and fills only the slots that version has.
#[repr(C)]
pub struct VerbsQp {
    /// `ibv_qp_ex` as in the headers this crate was built with (a prefix is valid for every
    /// version: new slots are only ever appended).
    pub qp_ex: ibv_qp_ex,
    /// Room for slots newer versions append, then `comp_mask` (padded to 8) and `xrcd`.
    pub tail: [u64; QP_TAIL_WORDS],
}

/// Words reserved after the compiled `ibv_qp_ex`.
pub const QP_TAIL_WORDS: usize = 4;

/// Size of the v36–v43 `ibv_qp_ex`: everything up to its 20th function slot, `wr_abort`.
pub const QP_EX_V36_SIZE: usize = core::mem::offset_of!(ibv_qp_ex, wr_abort) + 8;

/// Fewest and most function slots `ibv_qp_ex` has in the supported range.
pub const QP_EX_MIN_SLOTS: usize = 20;
pub const QP_EX_MAX_SLOTS: usize = 22;

impl VerbsQp {
    /// Byte offset of `verbs_qp.comp_mask` when `ibv_qp_ex` has `slots` function pointers.
    pub const fn comp_mask_offset(slots: usize) -> usize {
        QP_EX_V36_SIZE + 8 * (slots - QP_EX_MIN_SLOTS)
    }
}

/// Every slot of `struct verbs_context_ops` in rdma-core v65.0's (alphabetical) order, with the
/// first release that has it. The table of a release is this list less the slots newer than it;
/// the v36 slots are exactly the fields of [`VerbsContextOps`], in the same order (checked by
/// `tests/layout.rs`). The slots added after v58 are for features uiw does not offer (DMA
/// handles, `ibv_reg_mr_ex`, DMA-buf export, port speed, provider-allocated buffers, completion
/// counters): left NULL, libibverbs answers them with its `EOPNOTSUPP` stubs.
pub const CONTEXT_OPS: &[(&str, u32)] = &[
    ("advise_mr", 36), ("alloc_buf", 64), ("alloc_dm", 36), ("alloc_dmah", 59), ("alloc_mw", 36),
    ("alloc_null_mr", 36), ("alloc_parent_domain", 36), ("alloc_pd", 36), ("alloc_td", 36),
    ("async_event", 36), ("attach_counters_point_flow", 36), ("attach_mcast", 36), ("bind_mw", 36),
    ("close_xrcd", 36), ("cq_event", 36), ("create_ah", 36), ("create_comp_cntr", 65),
    ("create_counters", 36), ("create_cq", 36), ("create_cq_ex", 36), ("create_flow", 36),
    ("create_flow_action_esp", 36), ("create_qp", 36), ("create_qp_ex", 36),
    ("create_rwq_ind_table", 36), ("create_srq", 36), ("create_srq_ex", 36), ("create_wq", 36),
    ("dealloc_dmah", 59), ("dealloc_mw", 36), ("dealloc_pd", 36), ("dealloc_td", 36),
    ("dereg_mr", 36), ("destroy_ah", 36), ("destroy_comp_cntr", 65), ("destroy_counters", 36),
    ("destroy_cq", 36), ("destroy_flow", 36), ("destroy_flow_action", 36), ("destroy_qp", 36),
    ("destroy_rwq_ind_table", 36), ("destroy_srq", 36), ("destroy_wq", 36), ("detach_mcast", 36),
    ("dm_export_dmabuf_fd", 62), ("free_buf", 64), ("free_context", 36), ("free_dm", 36),
    ("get_srq_num", 36), ("import_dm", 36), ("import_mr", 36), ("import_pd", 36),
    ("inc_comp_cntr", 65), ("inc_err_comp_cntr", 65), ("modify_cq", 36),
    ("modify_flow_action_esp", 36), ("modify_qp", 36), ("modify_qp_rate_limit", 36),
    ("modify_srq", 36), ("modify_wq", 36), ("open_qp", 36), ("open_xrcd", 36), ("poll_cq", 36),
    ("post_recv", 36), ("post_send", 36), ("post_srq_ops", 36), ("post_srq_recv", 36),
    ("qp_attach_comp_cntr", 65), ("query_comp_cntr_caps", 65), ("query_device_ex", 36),
    ("query_ece", 36), ("query_port", 36), ("query_port_speed", 62), ("query_qp", 36),
    ("query_qp_data_in_order", 36), ("query_rt_values", 36), ("query_srq", 36),
    ("read_comp_cntr", 65), ("read_counters", 36), ("read_err_comp_cntr", 65), ("reg_dm_mr", 36),
    ("reg_dmabuf_mr", 36), ("reg_mr", 36), ("reg_mr_ex", 59), ("req_notify_cq", 36),
    ("rereg_mr", 36), ("resize_cq", 36), ("set_comp_cntr", 65), ("set_ece", 36),
    ("set_err_comp_cntr", 65), ("unimport_dm", 36), ("unimport_mr", 36), ("unimport_pd", 36),
];

/// Slots of [`VerbsContextOps`] (the v36–v58 table).
pub const CONTEXT_OPS_V36_SLOTS: usize = core::mem::size_of::<VerbsContextOps>() / 8;

/// `ops` laid out as `struct verbs_context_ops` of rdma-core `release`: the v36 slots in order,
/// with a NULL slot wherever that release inserted one. Hand the result to `verbs_set_ops`.
pub fn context_ops_slots(ops: &VerbsContextOps, release: u32) -> Vec<OpaqueOp> {
    // SAFETY: VerbsContextOps is #[repr(C)] and made only of `Option<unsafe extern "C" fn(..)>`
    // fields, each one pointer wide with NULL as None, so it is an array of
    // CONTEXT_OPS_V36_SLOTS `OpaqueOp`s (a function pointer's argument types do not change its
    // representation).
    let v36: &[OpaqueOp; CONTEXT_OPS_V36_SLOTS] =
        unsafe { &*(ops as *const VerbsContextOps as *const [OpaqueOp; CONTEXT_OPS_V36_SLOTS]) };
    let mut old = v36.iter();
    CONTEXT_OPS
        .iter()
        .filter(|(_, since)| *since <= release)
        .map(|(_, since)| if *since <= 58 { *old.next().expect("v36 slot") } else { None })
        .collect()
}

/// Members `verbs_context` (verbs.h) has before `query_port`, the first member of the v36–v58
/// layout: three in v59–v61 (`reg_mr_ex`, `dealloc_dmah`, `alloc_dmah` — in reverse, as it
/// "grows up"), `dm_export_dmabuf_fd` from v62, `alloc_buf` and `free_buf` from v64. All are
/// function pointers.
pub const fn verbs_context_prepended(release: u32) -> usize {
    match release {
        0..=58 => 0,
        59..=61 => 3,
        62..=63 => 4,
        _ => 6,
    }
}

/// The most members any known release prepends to `verbs_context`.
pub const VERBS_CONTEXT_MAX_PREPENDED: usize = 6;

/// Bytes from the start of the v36–v58 `verbs_context` to its `context` member (the
/// `ibv_context`, which must be last): computed from the headers bindgen read, whatever their
/// release, since everything from `query_port` to `context` is the same in all of them.
pub const VERBS_CONTEXT_V36_HEAD: usize =
    core::mem::offset_of!(verbs_context, context) - core::mem::offset_of!(verbs_context, query_port);

/// Bytes from the start of `verbs_context` to its `context` member in rdma-core `release`.
/// A provider that embeds the context must leave this much room before its `ibv_context`.
pub const fn verbs_context_head(release: u32) -> usize {
    VERBS_CONTEXT_V36_HEAD + 8 * verbs_context_prepended(release)
}

/// The largest [`verbs_context_head`] of any known release.
pub const VERBS_CONTEXT_MAX_HEAD: usize = VERBS_CONTEXT_V36_HEAD + 8 * VERBS_CONTEXT_MAX_PREPENDED;
