//! `ibv_query_device(_ex)` and `ibv_query_port`: what a real RNIC reports.

use core::ffi::c_int;

use uiw_kabi::verbs::*;

use super::{engine, guard, refuse};

pub(super) unsafe extern "C" fn query_device_ex(
    ctx: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    guard(libc::EFAULT, || {
        // SAFETY: input is NULL or points at the caller's input struct.
        if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
            return refuse("ibv_query_device_ex", libc::EINVAL, format_args!("input comp_mask must be 0"));
        }
        if attr_size < core::mem::size_of::<ibv_device_attr>() {
            return refuse("ibv_query_device_ex", libc::EINVAL, format_args!("attr_size {attr_size} is smaller than struct ibv_device_attr"));
        }
        // SAFETY: ctx is one of our contexts.
        let e = unsafe { engine(ctx) };
        let l = &e.limits;
        let mut a: ibv_device_attr_ex = Default::default();
        let o = &mut a.orig_attr;
        for (dst, src) in o.fw_ver.iter_mut().zip(l.fw_ver.bytes()) {
            *dst = src as _;
        }
        o.node_guid = e.device.node_guid.to_be();
        o.sys_image_guid = e.device.node_guid.to_be();
        o.max_mr_size = l.max_mr_size;
        o.page_size_cap = l.page_size_cap;
        o.vendor_id = l.vendor_id;
        o.vendor_part_id = l.vendor_part_id;
        o.hw_ver = l.hw_ver;
        o.max_qp = l.max_qp as i32;
        o.max_qp_wr = l.max_qp_wr as i32;
        o.device_cap_flags = l.device_cap_flags;
        o.max_sge = l.max_sge as i32;
        o.max_sge_rd = l.max_sge_rd as i32;
        o.max_cq = l.max_cq as i32;
        o.max_cqe = l.max_cqe as i32;
        o.max_mr = l.max_mr as i32;
        o.max_pd = l.max_pd as i32;
        o.max_qp_rd_atom = l.max_qp_rd_atom as i32;
        o.max_res_rd_atom = l.max_res_rd_atom as i32;
        o.max_qp_init_rd_atom = l.max_qp_init_rd_atom as i32;
        o.atomic_cap = l.atomic_cap;
        o.max_mw = l.max_mw as i32;
        o.max_ah = l.max_ah as i32;
        o.max_srq = l.max_srq as i32;
        o.max_srq_wr = l.max_srq_wr as i32;
        o.max_srq_sge = l.max_srq_sge as i32;
        o.max_pkeys = l.max_pkeys as u16;
        o.local_ca_ack_delay = l.local_ca_ack_delay;
        o.phys_port_cnt = l.phys_port_cnt;
        a.device_cap_flags_ex = u64::from(l.device_cap_flags);
        // libibverbs' own ibv_cmd_query_device_any fills this from the sysfs port count;
        // a provider answering itself must too (rdma-core's tests/test_device.py reads it).
        a.phys_port_cnt_ex = u32::from(l.phys_port_cnt);
        let n = attr_size.min(core::mem::size_of::<ibv_device_attr_ex>());
        // SAFETY: the caller's buffer holds attr_size bytes; we copy at most that many.
        unsafe { core::ptr::copy_nonoverlapping(&a as *const _ as *const u8, attr as *mut u8, n) };
        0
    })
}

pub(super) unsafe extern "C" fn query_port(ctx: *mut ibv_context, port: u8, attr: *mut ibv_port_attr) -> c_int {
    guard(libc::EFAULT, || {
        // SAFETY: ctx is one of our contexts.
        let e = unsafe { engine(ctx) };
        let l = &e.limits;
        if port == 0 || port > l.phys_port_cnt {
            return refuse("ibv_query_port", libc::EINVAL, format_args!("port {port} is outside 1..={}", l.phys_port_cnt));
        }
        // SAFETY: libibverbs passes a zeroed, full-sized ibv_port_attr (__lib_query_port).
        let a = unsafe { &mut *attr };
        a.state = ibv_port_state::IBV_PORT_ACTIVE;
        a.max_mtu = l.port_max_mtu;
        a.active_mtu = e.device.active_mtu();
        a.gid_tbl_len = e.device.gid_tbl_len.max(1) as i32;
        // What siw reports: a connection-managed, device-managed port.
        a.port_cap_flags = ibv_port_cap_flags::IBV_PORT_CM_SUP | ibv_port_cap_flags::IBV_PORT_DEVICE_MGMT_SUP;
        a.max_msg_sz = l.max_msg_sz;
        a.pkey_tbl_len = l.pkey_tbl_len as u16;
        a.max_vl_num = 1;
        // What siw reports: ib_get_eth_speed() over the netdev's ethtool speed (1X SDR for
        // lo, which has none), as `uiw up` published it beside ports/1/rate.
        a.active_width = e.device.active_width;
        a.active_speed = e.device.active_speed;
        a.phys_state = 5; // LinkUp
        a.link_layer = l.link_layer;
        0
    })
}
