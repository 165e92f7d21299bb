//! Protection domains, memory regions and shared receive queues.

use core::ffi::{c_int, c_void};
use core::ptr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use uiw_kabi::private::{VerbsMr, VerbsSrq, IBV_MR_TYPE_MR};
use uiw_kabi::verbs::*;

use super::qp::{post_chain, recv_wqe, wait_for_acks};
use super::{engine, guard, refuse, set_errno};
use super::errno::Errno;
use crate::engine::srq::SrqObj;

// ---- PD ----

#[repr(C)]
pub(crate) struct UiwPd {
    pd: ibv_pd,
}

/// The engine handle of one of our PDs.
///
/// # Safety
/// `pd` must be a PD returned by [`alloc_pd`].
pub(crate) unsafe fn pd_handle(pd: *mut ibv_pd) -> u32 {
    (*pd).handle
}

pub(super) unsafe extern "C" fn alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    guard(ptr::null_mut(), || {
        // SAFETY: ctx is one of our contexts.
        match unsafe { engine(ctx) }.alloc_pd() {
            Ok(handle) => {
                let pd = Box::new(UiwPd { pd: ibv_pd { context: ctx, handle } });
                Box::into_raw(pd) as *mut ibv_pd
            }
            Err(e) => {
                set_errno(e.errno());
                ptr::null_mut()
            }
        }
    })
}

pub(super) unsafe extern "C" fn dealloc_pd(pd: *mut ibv_pd) -> c_int {
    guard(libc::EFAULT, || {
        // SAFETY: pd is one of ours.
        let (ctx, handle) = unsafe { ((*pd).context, (*pd).handle) };
        // SAFETY: ctx is one of our contexts.
        match unsafe { engine(ctx) }.dealloc_pd(handle) {
            Ok(()) => {
                // SAFETY: the PD came from alloc_pd's Box and nothing uses it any more.
                drop(unsafe { Box::from_raw(pd as *mut UiwPd) });
                0
            }
            Err(e) => e.errno(),
        }
    })
}

// ---- MR ----

pub(super) unsafe extern "C" fn reg_mr(pd: *mut ibv_pd, addr: *mut c_void, length: usize, hca_va: u64, access: c_int) -> *mut ibv_mr {
    guard(ptr::null_mut(), || {
        // SAFETY: pd is one of ours.
        let (ctx, pdh) = unsafe { ((*pd).context, pd_handle(pd)) };
        // SAFETY: ctx is one of our contexts.
        let e = unsafe { engine(ctx) };
        match e.mrs.register(pdh, addr as u64, length as u64, hca_va, access as u32) {
            Ok(mr) => {
                // SAFETY: VerbsMr is plain C data; zero is a valid start.
                let mut vmr: VerbsMr = unsafe { core::mem::zeroed() };
                vmr.ibv_mr = ibv_mr { context: ctx, pd, addr, length, handle: mr.stag, lkey: mr.stag, rkey: mr.stag };
                vmr.mr_type = IBV_MR_TYPE_MR;
                vmr.access = access;
                Box::into_raw(Box::new(vmr)) as *mut ibv_mr
            }
            Err(err) => {
                use crate::engine::mr::RegError as R;
                let max = e.limits.max_mr;
                let why = match err {
                    R::RemoteWriteWithoutLocalWrite => "remote write or atomic access needs IBV_ACCESS_LOCAL_WRITE too".to_string(),
                    R::UnknownAccessFlag => format!("access {access:#x} has a flag libibverbs does not define"),
                    R::OnDemandUnsupported => "IBV_ACCESS_ON_DEMAND: uiw has no on-demand paging".to_string(),
                    R::BadRange => format!("length {length} at {addr:?}: empty, or wraps around the address space"),
                    R::TooMany => format!("the device limit max_mr = {max} is reached"),
                };
                set_errno(refuse("ibv_reg_mr", err.errno(), format_args!("{why}")));
                ptr::null_mut()
            }
        }
    })
}

pub(super) unsafe extern "C" fn dereg_mr(vmr: *mut VerbsMr) -> c_int {
    guard(libc::EFAULT, || {
        // SAFETY: vmr is one of ours.
        let (ctx, stag) = unsafe { ((*vmr).ibv_mr.context, (*vmr).ibv_mr.lkey) };
        // SAFETY: ctx is one of our contexts.
        if unsafe { engine(ctx) }.mrs.deregister(stag).is_none() {
            return refuse("ibv_dereg_mr", libc::EINVAL, format_args!("STag {stag:#x} is not registered"));
        }
        // SAFETY: vmr came from reg_mr's Box.
        drop(unsafe { Box::from_raw(vmr) });
        0
    })
}

// ---- SRQ ----

#[repr(C)]
pub(crate) struct UiwSrq {
    vsrq: VerbsSrq,
    pub(crate) obj: Arc<SrqObj>,
}

/// The engine object behind one of our SRQs.
///
/// # Safety
/// `srq` must be an SRQ returned by [`create_srq`] and not yet destroyed.
pub(crate) unsafe fn srq_obj<'a>(srq: *mut ibv_srq) -> &'a Arc<SrqObj> {
    &(*(srq as *mut UiwSrq)).obj
}

pub(super) unsafe extern "C" fn create_srq(pd: *mut ibv_pd, init: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    guard(ptr::null_mut(), || {
        // SAFETY: pd is one of ours; init is the caller's attribute struct.
        let (ctx, pdh, init) = unsafe { ((*pd).context, pd_handle(pd), &mut *init) };
        // SAFETY: ctx is one of our contexts.
        let e = unsafe { engine(ctx) };
        let a = &mut init.attr;
        let obj = match e.create_srq(pdh, a.max_wr, a.max_sge, a.srq_limit) {
            Ok(o) => o,
            Err(err) => {
                set_errno(err.errno());
                return ptr::null_mut();
            }
        };
        {
            let s = obj.inner.lock();
            a.max_wr = s.max_wr;
            a.max_sge = s.max_sge;
        }
        // SAFETY: VerbsSrq is plain C data; zero is a valid start.
        let mut vsrq: VerbsSrq = unsafe { core::mem::zeroed() };
        vsrq.srq.context = ctx;
        vsrq.srq.srq_context = init.srq_context;
        vsrq.srq.pd = pd;
        let b = Box::into_raw(Box::new(UiwSrq { vsrq, obj }));
        // SAFETY: b is a fresh allocation; the mutex/cond are initialised once, in place.
        unsafe {
            libc::pthread_mutex_init(&mut (*b).vsrq.srq.mutex as *mut _ as *mut libc::pthread_mutex_t, ptr::null());
            libc::pthread_cond_init(&mut (*b).vsrq.srq.cond as *mut _ as *mut libc::pthread_cond_t, ptr::null());
            (&(*b).obj).handle.store(b as u64, Ordering::Release);
        }
        b as *mut ibv_srq
    })
}

pub(super) unsafe extern "C" fn modify_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> c_int {
    guard(libc::EFAULT, || {
        const MAX_WR: c_int = ibv_srq_attr_mask::IBV_SRQ_MAX_WR as c_int;
        const LIMIT: c_int = ibv_srq_attr_mask::IBV_SRQ_LIMIT as c_int;
        if mask & !(MAX_WR | LIMIT) != 0 {
            return refuse("ibv_modify_srq", libc::EINVAL, format_args!("attr_mask {mask:#x}: only IBV_SRQ_MAX_WR and IBV_SRQ_LIMIT"));
        }
        // SAFETY: srq is one of ours; attr is the caller's.
        let (obj, ctx, a) = unsafe { (srq_obj(srq), (*srq).context, &*attr) };
        // SAFETY: ctx is one of our contexts.
        let hw_max = unsafe { engine(ctx) }.limits.max_srq_wr;
        let max_wr = (mask & MAX_WR != 0).then_some(a.max_wr);
        let limit = (mask & LIMIT != 0).then_some(a.srq_limit);
        match obj.inner.lock().modify(max_wr, limit, hw_max) {
            Ok(()) => 0,
            Err(e) => refuse("ibv_modify_srq", e.errno(), format_args!("max_wr {max_wr:?} / srq_limit {limit:?}: outside max_srq_wr = {hw_max}, below the WRs queued, or a limit above max_wr")),
        }
    })
}

pub(super) unsafe extern "C" fn query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    guard(libc::EFAULT, || {
        // SAFETY: srq is one of ours; attr is the caller's.
        let (obj, a) = unsafe { (srq_obj(srq), &mut *attr) };
        let s = obj.inner.lock();
        a.max_wr = s.max_wr;
        a.max_sge = s.max_sge;
        a.srq_limit = s.limit;
        0
    })
}

pub(super) unsafe extern "C" fn destroy_srq(srq: *mut ibv_srq) -> c_int {
    guard(libc::EFAULT, || {
        // SAFETY: srq is one of ours.
        let (obj, ctx) = unsafe { (srq_obj(srq).clone(), (*srq).context) };
        // SAFETY: ctx is one of our contexts.
        if let Err(e) = unsafe { engine(ctx) }.destroy_srq(&obj) {
            return e.errno();
        }
        // SAFETY: srq is ours; the application acknowledges events through these fields.
        unsafe {
            let s = &mut *srq;
            wait_for_acks(&mut s.mutex, &mut s.cond, &s.events_completed, obj.async_events_to_ack());
            libc::pthread_mutex_destroy(&mut s.mutex as *mut _ as *mut libc::pthread_mutex_t);
            libc::pthread_cond_destroy(&mut s.cond as *mut _ as *mut libc::pthread_cond_t);
            drop(Box::from_raw(srq as *mut UiwSrq));
        }
        0
    })
}

pub(super) unsafe extern "C" fn post_srq_recv(srq: *mut ibv_srq, wr: *mut ibv_recv_wr, bad: *mut *mut ibv_recv_wr) -> c_int {
    guard(libc::EFAULT, || {
        // SAFETY: srq is one of ours.
        let obj = unsafe { srq_obj(srq) };
        let r = post_chain(wr, bad, |w| recv_wqe(w).and_then(|q| obj.inner.lock().post(q)));
        obj.posted();
        r
    })
}
