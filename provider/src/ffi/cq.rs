//! Completion queues: `ibv_create_cq`, `ibv_create_cq_ex` (with the `ibv_start_poll` family),
//! polling, arming and resizing.

use core::ffi::c_int;
use core::ptr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;
use uiw_kabi::private::VerbsCq;
use uiw_kabi::verbs::*;

use super::qp::wait_for_acks;
use super::{engine, guard, refuse, set_errno};
use super::errno::Errno;
use crate::engine::cq::{self, CqObj};
use crate::engine::cq::Completion;

#[repr(C)]
pub(crate) struct UiwCq {
    vcq: VerbsCq,
    pub(crate) obj: Arc<CqObj>,
    /// The completion `ibv_start_poll`/`ibv_next_poll` made current for the `read_*` calls.
    current: Mutex<Completion>,
}

/// The engine object behind one of our CQs.
///
/// # Safety
/// `cq` must be a CQ created by this module and not yet destroyed.
pub(crate) unsafe fn cq_obj<'a>(cq: *mut ibv_cq) -> &'a Arc<CqObj> {
    &(*(cq as *mut UiwCq)).obj
}

unsafe fn uiw_cq<'a>(cq: *mut ibv_cq_ex) -> &'a UiwCq {
    &*(cq as *mut UiwCq)
}

/// `ibv_cq_init_attr_ex.wc_flags` uiw can report: the standard set (byte_len, imm, qp_num,
/// src_qp, slid, sl, dlid_path_bits). Timestamps, VLANs, flow tags and tag matching are not.
const SUPPORTED_WC_FLAGS: u64 = {
    use ibv_create_cq_wc_flags::*;
    (IBV_WC_EX_WITH_BYTE_LEN
        | IBV_WC_EX_WITH_IMM
        | IBV_WC_EX_WITH_QP_NUM
        | IBV_WC_EX_WITH_SRC_QP
        | IBV_WC_EX_WITH_SLID
        | IBV_WC_EX_WITH_SL
        | IBV_WC_EX_WITH_DLID_PATH_BITS) as u64
};

fn new_cq(ctx: *mut ibv_context, cqe: c_int, channel: *mut ibv_comp_channel, comp_vector: c_int, ex: Option<u64>) -> *mut UiwCq {
    // SAFETY: ctx is one of our contexts.
    let e = unsafe { engine(ctx) };
    // SAFETY: ctx is valid; num_comp_vectors was set at alloc_context.
    let vectors = unsafe { (*ctx).num_comp_vectors };
    if comp_vector < 0 || comp_vector >= vectors {
        set_errno(refuse("ibv_create_cq", libc::EINVAL, format_args!("comp_vector = {comp_vector} is outside 0..{vectors}")));
        return ptr::null_mut();
    }
    let sink = if channel.is_null() {
        None
    } else {
        // SAFETY: channel is the caller's ibv_comp_channel.
        match e.channel(unsafe { (*channel).fd }) {
            Some(s) => Some(s),
            None => {
                set_errno(refuse("ibv_create_cq", libc::EINVAL, format_args!("the completion channel is not one of this context's")));
                return ptr::null_mut();
            }
        }
    };
    let obj = match e.create_cq(cqe, sink) {
        Ok(o) => o,
        Err(err) => {
            set_errno(err.errno());
            return ptr::null_mut();
        }
    };
    // SAFETY: VerbsCq is plain C data; libibverbs' verbs_init_cq fills the generic fields after
    // we return.
    let mut vcq: VerbsCq = unsafe { core::mem::zeroed() };
    vcq.cq_ex.cqe = obj.lock_q().capacity() as c_int;
    if let Some(flags) = ex {
        let c = &mut vcq.cq_ex;
        c.start_poll = Some(start_poll);
        c.next_poll = Some(next_poll);
        c.end_poll = Some(end_poll);
        c.read_opcode = Some(read_opcode);
        c.read_vendor_err = Some(read_vendor_err);
        c.read_wc_flags = Some(read_wc_flags);
        if flags & ibv_create_cq_wc_flags::IBV_WC_EX_WITH_BYTE_LEN as u64 != 0 {
            c.read_byte_len = Some(read_byte_len);
        }
        if flags & ibv_create_cq_wc_flags::IBV_WC_EX_WITH_IMM as u64 != 0 {
            c.read_imm_data = Some(read_imm_data);
        }
        if flags & ibv_create_cq_wc_flags::IBV_WC_EX_WITH_QP_NUM as u64 != 0 {
            c.read_qp_num = Some(read_qp_num);
        }
        if flags & ibv_create_cq_wc_flags::IBV_WC_EX_WITH_SRC_QP as u64 != 0 {
            c.read_src_qp = Some(read_src_qp);
        }
        if flags & ibv_create_cq_wc_flags::IBV_WC_EX_WITH_SLID as u64 != 0 {
            c.read_slid = Some(read_slid);
        }
        if flags & ibv_create_cq_wc_flags::IBV_WC_EX_WITH_SL as u64 != 0 {
            c.read_sl = Some(read_sl);
        }
        if flags & ibv_create_cq_wc_flags::IBV_WC_EX_WITH_DLID_PATH_BITS as u64 != 0 {
            c.read_dlid_path_bits = Some(read_dlid_path_bits);
        }
    }
    let b = Box::into_raw(Box::new(UiwCq { vcq, obj, current: Mutex::new(Completion::default()) }));
    // SAFETY: b is a fresh allocation.
    unsafe { (&(*b).obj).handle.store(b as u64, Ordering::Release) };
    b
}

pub(super) unsafe extern "C" fn create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    guard(ptr::null_mut(), || new_cq(ctx, cqe, channel, comp_vector, None) as *mut ibv_cq)
}

pub(super) unsafe extern "C" fn create_cq_ex(ctx: *mut ibv_context, attr: *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex {
    guard(ptr::null_mut(), || {
        // SAFETY: attr is the caller's attribute struct.
        let a = unsafe { &*attr };
        let known_mask = ibv_cq_init_attr_mask::IBV_CQ_INIT_ATTR_MASK_FLAGS | ibv_cq_init_attr_mask::IBV_CQ_INIT_ATTR_MASK_PD;
        if a.comp_mask & !known_mask != 0 || a.wc_flags & !SUPPORTED_WC_FLAGS != 0 {
            let (m, w) = (a.comp_mask & !known_mask, a.wc_flags & !SUPPORTED_WC_FLAGS);
            set_errno(refuse("ibv_create_cq_ex", libc::EOPNOTSUPP, format_args!("unsupported comp_mask bits {m:#x} / wc_flags {w:#x}")));
            return ptr::null_mut();
        }
        let cqe = c_int::try_from(a.cqe).unwrap_or(c_int::MAX);
        new_cq(ctx, cqe, a.channel, a.comp_vector as c_int, Some(a.wc_flags)) as *mut ibv_cq_ex
    })
}

pub(super) unsafe extern "C" fn destroy_cq(cq: *mut ibv_cq) -> c_int {
    guard(libc::EFAULT, || {
        // SAFETY: cq is one of ours.
        let (obj, ctx) = unsafe { (cq_obj(cq).clone(), (*cq).context) };
        // SAFETY: ctx is one of our contexts.
        if let Err(e) = unsafe { engine(ctx) }.destroy_cq(&obj) {
            return e.errno();
        }
        // SAFETY: cq is ours; like the kernel, wait until the application has acknowledged
        // every event reported for it (ibv_ack_cq_events / ibv_ack_async_event).
        unsafe {
            let c = &mut *cq;
            wait_for_acks(&mut c.mutex, &mut c.cond, &c.comp_events_completed, obj.comp_events_to_ack());
            wait_for_acks(&mut c.mutex, &mut c.cond, &c.async_events_completed, obj.async_events_to_ack());
            drop(Box::from_raw(cq as *mut UiwCq));
        }
        0
    })
}

fn write_wc(c: &Completion, wc: &mut ibv_wc) {
    *wc = ibv_wc {
        wr_id: c.wr_id,
        status: c.status,
        opcode: c.opcode,
        vendor_err: c.vendor_err,
        byte_len: c.byte_len,
        qp_num: c.qp_num,
        wc_flags: c.wc_flags,
        ..Default::default()
    };
    wc.__bindgen_anon_1.imm_data = c.imm_or_inv;
}

pub(super) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    guard(-1, || {
        if n < 0 {
            return -1;
        }
        // SAFETY: cq is one of ours.
        let obj = unsafe { cq_obj(cq) };
        if !obj.poll_begins() {
            return 0;
        }
        // The QPs whose Sends or Writes this poll reports (see `cq::delivered`): served once
        // the queue is let go. A poll that would name more QPs than fit returns early, which
        // ibv_poll_cq allows.
        let mut delivered = [0u32; 8];
        let mut n_delivered = 0;
        let mut q = obj.lock_q();
        let mut got = 0;
        while got < n {
            if n_delivered == delivered.len() {
                break;
            }
            let Some(c) = q.pop_batch(got as usize) else { break };
            if cq::delivered(&c) && !delivered[..n_delivered].contains(&c.qp_num) {
                delivered[n_delivered] = c.qp_num;
                n_delivered += 1;
            }
            // SAFETY: the caller's array has room for n entries.
            write_wc(&c, unsafe { &mut *wc.add(got as usize) });
            got += 1;
        }
        drop(q);
        if got > 0 {
            obj.reaped();
        }
        for &qpn in &delivered[..n_delivered] {
            obj.delivered(qpn);
        }
        got
    })
}

pub(super) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard(libc::EFAULT, || {
        // SAFETY: cq is one of ours.
        unsafe { cq_obj(cq) }.arm(solicited_only != 0);
        0
    })
}

pub(super) unsafe extern "C" fn resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    guard(libc::EFAULT, || {
        // SAFETY: cq is one of ours.
        let (obj, ctx) = unsafe { (cq_obj(cq), (*cq).context) };
        // SAFETY: ctx is one of our contexts.
        let max = unsafe { engine(ctx) }.limits.max_cqe;
        if cqe < 1 || cqe as u32 > max {
            return refuse("ibv_resize_cq", libc::EINVAL, format_args!("cqe = {cqe} is outside 1..={max} (max_cqe)"));
        }
        match obj.lock_q().resize(cqe as usize) {
            Ok(()) => {
                // SAFETY: cq is ours.
                unsafe { (*cq).cqe = cqe };
                0
            }
            Err(e) => refuse("ibv_resize_cq", e.errno(), format_args!("cqe = {cqe} is fewer than the completions it holds")),
        }
    })
}

// ---- the ibv_cq_ex polling interface ----

/// `taken`: completions this poll (`ibv_start_poll` .. `ibv_end_poll`) has already read.
unsafe fn advance(cq: *mut ibv_cq_ex, taken: usize) -> c_int {
    let u = uiw_cq(cq);
    let Some(c) = u.obj.lock_q().pop_batch(taken) else {
        return libc::ENOENT;
    };
    if cq::delivered(&c) {
        u.obj.delivered(c.qp_num);
    }
    (*cq).wr_id = c.wr_id;
    (*cq).status = c.status;
    *u.current.lock() = c;
    0
}

unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, _attr: *mut ibv_poll_cq_attr) -> c_int {
    // SAFETY (whole family): cq is one of ours; libibverbs' inline helpers pass it through.
    guard(libc::EFAULT, || unsafe {
        // Like ibv_poll_cq: an empty CQ drives its QPs' streams right here.
        let obj = &uiw_cq(cq).obj;
        if !obj.poll_begins() {
            return libc::ENOENT;
        }
        let r = advance(cq, 0);
        if r == 0 {
            obj.reaped();
        }
        r
    })
}
unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    guard(libc::EFAULT, || unsafe { advance(cq, 1) })
}
unsafe extern "C" fn end_poll(_cq: *mut ibv_cq_ex) {}
unsafe extern "C" fn read_opcode(cq: *mut ibv_cq_ex) -> ibv_wc_opcode::Type {
    unsafe { uiw_cq(cq) }.current.lock().opcode
}
unsafe extern "C" fn read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    unsafe { uiw_cq(cq) }.current.lock().vendor_err
}
unsafe extern "C" fn read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    unsafe { uiw_cq(cq) }.current.lock().byte_len
}
unsafe extern "C" fn read_imm_data(cq: *mut ibv_cq_ex) -> __be32 {
    unsafe { uiw_cq(cq) }.current.lock().imm_or_inv
}
unsafe extern "C" fn read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    unsafe { uiw_cq(cq) }.current.lock().qp_num
}
unsafe extern "C" fn read_src_qp(_cq: *mut ibv_cq_ex) -> u32 {
    0
}
unsafe extern "C" fn read_wc_flags(cq: *mut ibv_cq_ex) -> core::ffi::c_uint {
    unsafe { uiw_cq(cq) }.current.lock().wc_flags
}
unsafe extern "C" fn read_slid(_cq: *mut ibv_cq_ex) -> u32 {
    0
}
unsafe extern "C" fn read_sl(_cq: *mut ibv_cq_ex) -> u8 {
    0
}
unsafe extern "C" fn read_dlid_path_bits(_cq: *mut ibv_cq_ex) -> u8 {
    0
}
