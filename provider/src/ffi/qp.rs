//! Queue pairs: create (classic and `_ex` with the `ibv_wr_*` API), modify, query, destroy,
//! and posting.

use core::ffi::{c_int, c_void};
use core::ptr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;
use uiw_kabi::private::{VerbsQp, VERBS_QP_EX};
use uiw_kabi::verbs::*;

use super::cq::cq_obj;
use super::objects::{pd_handle, srq_obj};
use super::{engine, explain_post, guard, refuse, set_errno, QP_EX_SLOTS};
use super::errno::Errno;
use crate::engine::qp::{Qp, QpSpec};
use crate::engine::qp_state::{self, AhAttr, QpAttrs, QpCap, QpState};
use crate::engine::wr::{opcode, Payload, PostError, RecvWqe, SendWqe, Sge, SgeList, InlineBytes};

#[repr(C)]
pub(crate) struct UiwQp {
    vqp: VerbsQp,
    pub(crate) obj: Arc<Qp>,
    /// WRs built by `ibv_wr_*` between `ibv_wr_start` and `ibv_wr_complete`.
    building: Mutex<Vec<SendWqe>>,
}

/// # Safety
/// `qp` must be a QP created by this module and not yet destroyed (an `ibv_qp_ex*` of ours is
/// the same address).
unsafe fn uiw_qp<'a>(qp: *mut ibv_qp) -> &'a UiwQp {
    &*(qp as *mut UiwQp)
}

/// The engine QP behind one of our QPs.
///
/// # Safety
/// As [`uiw_qp`].
pub(crate) unsafe fn qp_obj<'a>(qp: *mut ibv_qp) -> &'a Arc<Qp> {
    &uiw_qp(qp).obj
}

/// Waits, as the kernel's destroy commands do, until the application has acknowledged as many
/// events as were reported for an object (`events_completed` is advanced by libibverbs'
/// `ibv_ack_*` under the object's mutex, which then signals its cond).
///
/// # Safety
/// The three pointers must be the initialised mutex, cond and counter of one verbs object.
pub(crate) unsafe fn wait_for_acks(mutex: *mut pthread_mutex_t, cond: *mut pthread_cond_t, completed: *const u32, reported: u32) {
    let (m, c) = (mutex as *mut libc::pthread_mutex_t, cond as *mut libc::pthread_cond_t);
    libc::pthread_mutex_lock(m);
    while ptr::read_volatile(completed) != reported {
        libc::pthread_cond_wait(c, m);
    }
    libc::pthread_mutex_unlock(m);
}

/// A link of a caller's `ibv_send_wr` / `ibv_recv_wr` chain.
pub(crate) trait WrChain {
    fn next_wr(&self) -> *mut Self;
}

impl WrChain for ibv_send_wr {
    fn next_wr(&self) -> *mut Self {
        self.next
    }
}

impl WrChain for ibv_recv_wr {
    fn next_wr(&self) -> *mut Self {
        self.next
    }
}

/// Posts every WR of a NULL-terminated chain with `post`, stopping at the first refusal: that
/// WR goes to `*bad` and its errno is returned, as the verbs contract says.
pub(crate) fn post_chain<W: WrChain>(mut wr: *mut W, bad: *mut *mut W, mut post: impl FnMut(&W) -> Result<(), PostError>) -> c_int {
    while !wr.is_null() {
        // SAFETY: wr walks the caller's NULL-terminated chain.
        let w = unsafe { &*wr };
        if let Err(e) = post(w) {
            // SAFETY: bad is the caller's out-parameter.
            unsafe { *bad = wr };
            return e.errno();
        }
        wr = w.next_wr();
    }
    0
}

/// Copies one `ibv_recv_wr` out of the caller's memory.
pub(crate) fn recv_wqe(w: &ibv_recv_wr) -> Result<RecvWqe, PostError> {
    Ok(RecvWqe { wr_id: w.wr_id, sges: sges(w.sg_list, w.num_sge)? })
}

fn sges(list: *mut ibv_sge, n: c_int) -> Result<SgeList, PostError> {
    if n < 0 || (n > 0 && list.is_null()) {
        return Err(PostError::TooManySges);
    }
    // SAFETY: the verbs contract: sg_list points at num_sge entries.
    let s = if n == 0 { &[][..] } else { unsafe { core::slice::from_raw_parts(list, n as usize) } };
    let sge = |g: &ibv_sge| Sge { addr: g.addr, length: g.length, lkey: g.lkey };
    // The lists that fit inline (nearly all) are built whole: collecting pushed element by
    // element, checking the capacity each time (some 60 instructions a WR, twice per message
    // of a ping-pong: its receive and its send).
    Ok(match s {
        [a] => SgeList::from_buf_and_len([sge(a), Sge::default()], 1),
        [a, b] => SgeList::from_buf([sge(a), sge(b)]),
        _ => s.iter().map(sge).collect(),
    })
}

/// Copies inline payload out of the caller's buffers at post time (`IBV_SEND_INLINE`).
fn gather_inline(s: &[Sge], max: u32) -> Result<InlineBytes, PostError> {
    let total: u64 = s.iter().map(|g| u64::from(g.length)).sum();
    if total > u64::from(max) {
        return Err(PostError::InlineTooLong);
    }
    let mut out = InlineBytes::with_capacity(total as usize);
    for g in s {
        if g.length > 0 {
            // SAFETY: with IBV_SEND_INLINE the application promises addr..addr+length is
            // readable now; no lkey is involved.
            out.extend_from_slice(unsafe { core::slice::from_raw_parts(g.addr as *const u8, g.length as usize) });
        }
    }
    Ok(out)
}

fn send_wqe(w: &ibv_send_wr, max_inline: u32) -> Result<SendWqe, PostError> {
    let s = sges(w.sg_list, w.num_sge)?;
    let payload = if w.send_flags & ibv_send_flags::IBV_SEND_INLINE != 0 {
        Payload::Inline(gather_inline(&s, max_inline)?)
    } else {
        Payload::Sges(s)
    };
    // SAFETY: reading the unions as the opcode says the caller filled them.
    let (remote_addr, rkey, compare_add, swap) = unsafe {
        match w.opcode {
            ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP | ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD => {
                let a = w.wr.atomic;
                (a.remote_addr, a.rkey, a.compare_add, a.swap)
            }
            _ => (w.wr.rdma.remote_addr, w.wr.rdma.rkey, 0, 0),
        }
    };
    Ok(SendWqe {
        wr_id: w.wr_id,
        opcode: w.opcode,
        flags: w.send_flags,
        payload,
        remote_addr,
        rkey,
        // SAFETY: imm_data and invalidate_rkey share a 32-bit union.
        imm_or_inv: unsafe { w.__bindgen_anon_1.imm_data },
        compare_add,
        swap,
    })
}

fn to_attrs(a: &ibv_qp_attr) -> QpAttrs {
    let g = &a.ah_attr.grh;
    QpAttrs {
        qp_state: QpState::from_u32(a.qp_state).unwrap_or(QpState::Reset),
        cur_qp_state: QpState::from_u32(a.cur_qp_state).unwrap_or(QpState::Reset),
        path_mtu: a.path_mtu,
        path_mig_state: a.path_mig_state,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: a.qp_access_flags,
        cap: QpCap {
            max_send_wr: a.cap.max_send_wr,
            max_recv_wr: a.cap.max_recv_wr,
            max_send_sge: a.cap.max_send_sge,
            max_recv_sge: a.cap.max_recv_sge,
            max_inline_data: a.cap.max_inline_data,
        },
        ah: AhAttr {
            // SAFETY: ibv_gid is a union of plain bytes.
            dgid: unsafe { g.dgid.raw },
            flow_label: g.flow_label,
            sgid_index: g.sgid_index,
            hop_limit: g.hop_limit,
            traffic_class: g.traffic_class,
            dlid: a.ah_attr.dlid,
            sl: a.ah_attr.sl,
            src_path_bits: a.ah_attr.src_path_bits,
            static_rate: a.ah_attr.static_rate,
            is_global: a.ah_attr.is_global,
            port_num: a.ah_attr.port_num,
        },
        pkey_index: a.pkey_index,
        en_sqd_async_notify: a.en_sqd_async_notify,
        sq_draining: a.sq_draining,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
    }
}

fn fill_cap(c: &mut ibv_qp_cap, cap: &QpCap) {
    c.max_send_wr = cap.max_send_wr;
    c.max_recv_wr = cap.max_recv_wr;
    c.max_send_sge = cap.max_send_sge;
    c.max_recv_sge = cap.max_recv_sge;
    c.max_inline_data = cap.max_inline_data;
}

/// `ibv_qp_ex` send ops uiw builds WRs for.
const SUPPORTED_SEND_OPS: u64 = (ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_WRITE
    | ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND
    | ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND_WITH_IMM
    | ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_READ
    | ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
    | ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND_WITH_INV) as u64;

#[allow(clippy::too_many_arguments)]
fn new_qp(
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    qp_type: u32,
    cap: &mut ibv_qp_cap,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    srq: *mut ibv_srq,
    sq_sig_all: c_int,
    qp_context: *mut c_void,
    send_ops: Option<u64>,
) -> *mut ibv_qp {
    // SAFETY: ctx is one of our contexts.
    let e = unsafe { engine(ctx) };
    if pd.is_null() || send_cq.is_null() || recv_cq.is_null() {
        set_errno(refuse("ibv_create_qp", libc::EINVAL, format_args!("pd, send_cq and recv_cq must all be given")));
        return ptr::null_mut();
    }
    // SAFETY: pd, CQs and SRQ were created by this provider (libibverbs only passes its own).
    let spec = unsafe {
        QpSpec {
            pd: pd_handle(pd),
            qp_type,
            cap: QpCap {
                max_send_wr: cap.max_send_wr,
                max_recv_wr: cap.max_recv_wr,
                max_send_sge: cap.max_send_sge,
                max_recv_sge: cap.max_recv_sge,
                max_inline_data: cap.max_inline_data,
            },
            sq_sig_all: sq_sig_all != 0,
            send_cq: cq_obj(send_cq).clone(),
            recv_cq: cq_obj(recv_cq).clone(),
            srq: (!srq.is_null()).then(|| srq_obj(srq).clone()),
        }
    };
    let obj = match e.create_qp(spec) {
        Ok(q) => q,
        Err(err) => {
            set_errno(err.errno());
            return ptr::null_mut();
        }
    };
    fill_cap(cap, &obj.cap);
    // SAFETY: VerbsQp is plain C data; zero is a valid start.
    let mut vqp: VerbsQp = unsafe { core::mem::zeroed() };
    let q = &mut vqp.qp_ex.qp_base;
    q.context = ctx;
    q.qp_context = qp_context;
    q.pd = pd;
    q.send_cq = send_cq;
    q.recv_cq = recv_cq;
    q.srq = srq;
    q.handle = obj.qpn;
    q.qp_num = obj.qpn;
    q.state = ibv_qp_state::IBV_QPS_RESET;
    q.qp_type = qp_type;
    if send_ops.is_some() {
        let x = &mut vqp.qp_ex;
        x.wr_start = Some(wr_start);
        x.wr_complete = Some(wr_complete);
        x.wr_abort = Some(wr_abort);
        x.wr_send = Some(wr_send);
        x.wr_send_imm = Some(wr_send_imm);
        x.wr_send_inv = Some(wr_send_inv);
        x.wr_rdma_write = Some(wr_rdma_write);
        x.wr_rdma_write_imm = Some(wr_rdma_write_imm);
        x.wr_rdma_read = Some(wr_rdma_read);
        x.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
        x.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
        x.wr_set_sge = Some(wr_set_sge);
        x.wr_set_sge_list = Some(wr_set_sge_list);
        x.wr_set_inline_data = Some(wr_set_inline_data);
        x.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    }
    let b = Box::into_raw(Box::new(UiwQp { vqp, obj, building: Mutex::new(Vec::new()) }));
    // SAFETY: b is a fresh allocation; the mutex/cond are initialised once, in place, and
    // comp_mask is written where the running libibverbs reads it (see VerbsQp).
    unsafe {
        let q = &mut (*b).vqp.qp_ex.qp_base;
        libc::pthread_mutex_init(&mut q.mutex as *mut _ as *mut libc::pthread_mutex_t, ptr::null());
        libc::pthread_cond_init(&mut q.cond as *mut _ as *mut libc::pthread_cond_t, ptr::null());
        if send_ops.is_some() {
            let off = VerbsQp::comp_mask_offset(QP_EX_SLOTS.load(Ordering::Acquire));
            ptr::write((ptr::addr_of_mut!((*b).vqp) as *mut u8).add(off) as *mut u32, VERBS_QP_EX);
        }
        (&(*b).obj).handle.store(b as u64, Ordering::Release);
    }
    b as *mut ibv_qp
}

pub(super) unsafe extern "C" fn create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    guard(ptr::null_mut(), || {
        // SAFETY: pd is ours; attr is the caller's.
        let (ctx, a) = unsafe { ((*pd).context, &mut *attr) };
        new_qp(ctx, pd, a.qp_type, &mut a.cap, a.send_cq, a.recv_cq, a.srq, a.sq_sig_all, a.qp_context, None)
    })
}

pub(super) unsafe extern "C" fn create_qp_ex(ctx: *mut ibv_context, attr: *mut ibv_qp_init_attr_ex) -> *mut ibv_qp {
    guard(ptr::null_mut(), || {
        // SAFETY: attr is the caller's.
        let a = unsafe { &mut *attr };
        use ibv_qp_init_attr_mask::*;
        let known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_CREATE_FLAGS;
        const V: &str = "ibv_create_qp_ex";
        if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
            set_errno(refuse(V, libc::EINVAL, format_args!("comp_mask lacks IBV_QP_INIT_ATTR_PD (a QP needs a PD)")));
            return ptr::null_mut();
        }
        if a.comp_mask & !known != 0 {
            let extra = a.comp_mask & !known;
            set_errno(refuse(V, libc::EOPNOTSUPP, format_args!("comp_mask bits {extra:#x} not supported (PD, SEND_OPS_FLAGS and CREATE_FLAGS are)")));
            return ptr::null_mut();
        }
        if a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 {
            if let Err(e) = qp_state::validate_create_flags(a.create_flags) {
                set_errno(refuse(V, e.errno(), format_args!("{}", e.describe())));
                return ptr::null_mut();
            }
        }
        let send_ops = (a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0).then_some(a.send_ops_flags);
        if let Some(ops) = send_ops {
            if ops & !SUPPORTED_SEND_OPS != 0 {
                let extra = ops & !SUPPORTED_SEND_OPS;
                set_errno(refuse(V, libc::EOPNOTSUPP, format_args!("send_ops_flags {extra:#x} not supported (no memory windows, TSO or local invalidate builders)")));
                return ptr::null_mut();
            }
        }
        new_qp(ctx, a.pd, a.qp_type, &mut a.cap, a.send_cq, a.recv_cq, a.srq, a.sq_sig_all, a.qp_context, send_ops)
    })
}

pub(super) unsafe extern "C" fn modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    guard(libc::EFAULT, || {
        // SAFETY: qp is ours; attr is the caller's.
        let (u, a, ctx) = unsafe { (uiw_qp(qp), &*attr, (*qp).context) };
        // SAFETY: ctx is one of our contexts.
        let limits = &unsafe { engine(ctx) }.limits;
        match u.obj.modify(&to_attrs(a), mask as u32, limits) {
            Ok(()) => {
                // SAFETY: qp is ours.
                unsafe { (*qp).state = u.obj.state().as_u32() };
                0
            }
            Err(e) => refuse("ibv_modify_qp", e.errno(), format_args!("QP 0x{:06x}: {}", u.obj.qpn, e.describe())),
        }
    })
}

pub(super) unsafe extern "C" fn query_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, _mask: c_int, init: *mut ibv_qp_init_attr) -> c_int {
    guard(libc::EFAULT, || {
        // SAFETY: qp is ours; attr and init are the caller's.
        let (u, q, a, i) = unsafe { (uiw_qp(qp), &*qp, &mut *attr, &mut *init) };
        let s = u.obj.attrs();
        let cap = u.obj.cap;
        *a = Default::default();
        // iWARP providers report a QP that has not left RESET as INIT: siw keeps RESET and INIT
        // as one IDLE state and its query_qp answers INIT for it (siw_qp_state_to_ib_qp_state,
        // as cxgb4's to_ib_qp_state); rdma-core's tests expect that of every IBV_NODE_RNIC
        // (698f2ae80 "tests: Fix comparing qp_state for iWARP providers"). The transitions
        // stay the IBTA's: such a QP still goes RESET -> INIT, never straight to RTR.
        let shown = if s.qp_state == QpState::Reset { QpState::Init } else { s.qp_state };
        a.qp_state = shown.as_u32();
        a.cur_qp_state = shown.as_u32();
        a.path_mtu = s.path_mtu;
        a.path_mig_state = s.path_mig_state;
        a.rq_psn = s.rq_psn;
        a.sq_psn = s.sq_psn;
        a.dest_qp_num = s.dest_qp_num;
        a.qp_access_flags = s.qp_access_flags;
        fill_cap(&mut a.cap, &cap);
        a.ah_attr.grh.dgid.raw = s.ah.dgid;
        a.ah_attr.grh.flow_label = s.ah.flow_label;
        a.ah_attr.grh.sgid_index = s.ah.sgid_index;
        a.ah_attr.grh.hop_limit = s.ah.hop_limit;
        a.ah_attr.grh.traffic_class = s.ah.traffic_class;
        a.ah_attr.dlid = s.ah.dlid;
        a.ah_attr.sl = s.ah.sl;
        a.ah_attr.src_path_bits = s.ah.src_path_bits;
        a.ah_attr.static_rate = s.ah.static_rate;
        a.ah_attr.is_global = s.ah.is_global;
        a.ah_attr.port_num = s.ah.port_num;
        a.pkey_index = s.pkey_index;
        a.en_sqd_async_notify = s.en_sqd_async_notify;
        a.sq_draining = s.sq_draining;
        a.max_rd_atomic = s.max_rd_atomic;
        a.max_dest_rd_atomic = s.max_dest_rd_atomic;
        a.min_rnr_timer = s.min_rnr_timer;
        a.port_num = s.port_num;
        a.timeout = s.timeout;
        a.retry_cnt = s.retry_cnt;
        a.rnr_retry = s.rnr_retry;
        *i = Default::default();
        i.qp_context = q.qp_context;
        i.send_cq = q.send_cq;
        i.recv_cq = q.recv_cq;
        i.srq = q.srq;
        i.qp_type = q.qp_type;
        i.sq_sig_all = c_int::from(u.obj.sq_sig_all);
        fill_cap(&mut i.cap, &cap);
        0
    })
}

pub(super) unsafe extern "C" fn destroy_qp(qp: *mut ibv_qp) -> c_int {
    guard(libc::EFAULT, || {
        // SAFETY: qp is ours.
        let (obj, ctx) = unsafe { (uiw_qp(qp).obj.clone(), (*qp).context) };
        // SAFETY: ctx is one of our contexts.
        unsafe { engine(ctx) }.destroy_qp(&obj);
        // SAFETY: qp is ours; wait for the application to acknowledge its async events.
        unsafe {
            let q = &mut *qp;
            wait_for_acks(&mut q.mutex, &mut q.cond, &q.events_completed, obj.async_events_to_ack());
            libc::pthread_mutex_destroy(&mut q.mutex as *mut _ as *mut libc::pthread_mutex_t);
            libc::pthread_cond_destroy(&mut q.cond as *mut _ as *mut libc::pthread_cond_t);
            drop(Box::from_raw(qp as *mut UiwQp));
        }
        0
    })
}

pub(super) unsafe extern "C" fn post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad: *mut *mut ibv_send_wr) -> c_int {
    guard(libc::EFAULT, || {
        // SAFETY: qp is ours.
        let obj = &unsafe { uiw_qp(qp) }.obj;
        // One doorbell for the chain, rung as its last WR is posted (under the same hold of
        // the QP): its WRs' FPDUs leave in as few sendmsg calls as the socket takes. A chain
        // that stops at a bad WR rings for those before it.
        let r = post_chain(wr, bad, |w| {
            let r = send_wqe(w, obj.cap.max_inline_data).and_then(|s| if w.next.is_null() { obj.post_send(s) } else { obj.post_send_deferred(s) });
            if let Err(e) = &r {
                let c = &obj.cap;
                explain_post("ibv_post_send", obj.qpn, e, c.max_send_wr, c.max_send_sge, w.num_sge, obj.state());
            }
            r
        });
        if wr.is_null() || r != 0 {
            obj.doorbell();
        }
        r
    })
}

pub(super) unsafe extern "C" fn post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad: *mut *mut ibv_recv_wr) -> c_int {
    guard(libc::EFAULT, || {
        // SAFETY: qp is ours.
        let obj = &unsafe { uiw_qp(qp) }.obj;
        post_chain(wr, bad, |w| {
            let r = recv_wqe(w).and_then(|r| obj.post_recv(r));
            if let Err(e) = &r {
                let c = &obj.cap;
                explain_post("ibv_post_recv", obj.qpn, e, c.max_recv_wr, c.max_recv_sge, w.num_sge, obj.state());
            }
            r
        })
    })
}

// ---- the ibv_wr_* builder (ibv_qp_ex) ----
//
// SAFETY (whole section): libibverbs' inline ibv_wr_* helpers call these with the ibv_qp_ex*
// of one of our QPs, which is the address of its UiwQp.

fn push(qx: *mut ibv_qp_ex, opcode: u32, remote_addr: u64, rkey: u32, imm_or_inv: u32, compare_add: u64, swap: u64) {
    let (wr_id, flags) = unsafe { ((*qx).wr_id, (*qx).wr_flags) };
    let u = unsafe { uiw_qp(qx as *mut ibv_qp) };
    u.building.lock().push(SendWqe {
        wr_id,
        opcode,
        flags,
        payload: Payload::Sges(SgeList::new()),
        remote_addr,
        rkey,
        imm_or_inv,
        compare_add,
        swap,
    });
}

fn set_payload(qx: *mut ibv_qp_ex, p: Payload) {
    let u = unsafe { uiw_qp(qx as *mut ibv_qp) };
    if let Some(last) = u.building.lock().last_mut() {
        last.payload = p;
    }
}

unsafe extern "C" fn wr_start(qx: *mut ibv_qp_ex) {
    unsafe { uiw_qp(qx as *mut ibv_qp) }.building.lock().clear();
}
unsafe extern "C" fn wr_complete(qx: *mut ibv_qp_ex) -> c_int {
    guard(libc::EFAULT, || {
        let u = unsafe { uiw_qp(qx as *mut ibv_qp) };
        let list = std::mem::take(&mut *u.building.lock());
        // One doorbell for the batch, as for an ibv_post_send chain: rung as its last WR is
        // posted, or here for the WRs before one that failed.
        let n = list.len();
        for (i, w) in list.into_iter().enumerate() {
            let r = if i + 1 == n { u.obj.post_send(w) } else { u.obj.post_send_deferred(w) };
            if let Err(e) = r {
                u.obj.doorbell();
                return e.errno();
            }
        }
        if n == 0 {
            u.obj.doorbell();
        }
        0
    })
}
unsafe extern "C" fn wr_abort(qx: *mut ibv_qp_ex) {
    unsafe { uiw_qp(qx as *mut ibv_qp) }.building.lock().clear();
}
unsafe extern "C" fn wr_send(qx: *mut ibv_qp_ex) {
    push(qx, opcode::SEND, 0, 0, 0, 0, 0)
}
unsafe extern "C" fn wr_send_imm(qx: *mut ibv_qp_ex, imm: __be32) {
    push(qx, opcode::SEND_WITH_IMM, 0, 0, imm, 0, 0)
}
unsafe extern "C" fn wr_send_inv(qx: *mut ibv_qp_ex, inv: u32) {
    push(qx, opcode::SEND_WITH_INV, 0, 0, inv, 0, 0)
}
unsafe extern "C" fn wr_rdma_write(qx: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    push(qx, opcode::RDMA_WRITE, addr, rkey, 0, 0, 0)
}
unsafe extern "C" fn wr_rdma_write_imm(qx: *mut ibv_qp_ex, rkey: u32, addr: u64, imm: __be32) {
    push(qx, opcode::RDMA_WRITE_WITH_IMM, addr, rkey, imm, 0, 0)
}
unsafe extern "C" fn wr_rdma_read(qx: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    push(qx, opcode::RDMA_READ, addr, rkey, 0, 0, 0)
}
unsafe extern "C" fn wr_atomic_cmp_swp(qx: *mut ibv_qp_ex, rkey: u32, addr: u64, compare: u64, swap: u64) {
    push(qx, opcode::ATOMIC_CMP_AND_SWP, addr, rkey, 0, compare, swap)
}
unsafe extern "C" fn wr_atomic_fetch_add(qx: *mut ibv_qp_ex, rkey: u32, addr: u64, add: u64) {
    push(qx, opcode::ATOMIC_FETCH_AND_ADD, addr, rkey, 0, add, 0)
}
unsafe extern "C" fn wr_set_sge(qx: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    set_payload(qx, Payload::Sges(smallvec::smallvec![Sge { addr, length, lkey }]))
}
unsafe extern "C" fn wr_set_sge_list(qx: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    let s = if n == 0 { &[][..] } else { unsafe { core::slice::from_raw_parts(list, n) } };
    set_payload(qx, Payload::Sges(s.iter().map(|g| Sge { addr: g.addr, length: g.length, lkey: g.lkey }).collect()))
}
unsafe extern "C" fn wr_set_inline_data(qx: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    let b = if length == 0 { InlineBytes::new() } else { InlineBytes::from_slice(unsafe { core::slice::from_raw_parts(addr as *const u8, length) }) };
    set_payload(qx, Payload::Inline(b))
}
unsafe extern "C" fn wr_set_inline_data_list(qx: *mut ibv_qp_ex, n: usize, list: *const ibv_data_buf) {
    let bufs = if n == 0 { &[][..] } else { unsafe { core::slice::from_raw_parts(list, n) } };
    let mut b = InlineBytes::new();
    for d in bufs {
        if d.length > 0 {
            b.extend_from_slice(unsafe { core::slice::from_raw_parts(d.addr as *const u8, d.length) });
        }
    }
    set_payload(qx, Payload::Inline(b))
}
