//! Pins every size and offset of the hand-written private-ABI mirror.
//!
//! The expected numbers were produced by compiling rdma-core v44.0's own `libibverbs/driver.h`
//! (x86_64, gcc 12) with `sizeof`/`offsetof`; v36.0 and v56.0 declare the same structs
//! (`verbs_qp` aside, see `verbs_qp_comp_mask_follows_the_release`). The public types are
//! checked by the layout tests bindgen generates from the installed headers.

use core::mem::{offset_of, size_of};
use uiw_kabi::private::*;
use uiw_kabi::verbs::*;

#[test]
fn verbs_sysfs_dev() {
    assert_eq!(size_of::<VerbsSysfsDev>(), 992);
    assert_eq!(offset_of!(VerbsSysfsDev, sysfs_name), 36);
    assert_eq!(offset_of!(VerbsSysfsDev, sysfs_cdev), 104);
    assert_eq!(offset_of!(VerbsSysfsDev, ibdev_name), 112);
    assert_eq!(offset_of!(VerbsSysfsDev, ibdev_path), 176);
    assert_eq!(offset_of!(VerbsSysfsDev, modalias), 432);
    assert_eq!(offset_of!(VerbsSysfsDev, node_guid), 944);
    assert_eq!(offset_of!(VerbsSysfsDev, driver_id), 952);
    assert_eq!(offset_of!(VerbsSysfsDev, node_type), 956);
    assert_eq!(offset_of!(VerbsSysfsDev, abi_ver), 968);
    assert_eq!(offset_of!(VerbsSysfsDev, time_created), 976);
}

#[test]
fn verbs_device_ops_and_device() {
    assert_eq!(size_of::<VerbsDeviceOps>(), 72);
    assert_eq!(offset_of!(VerbsDeviceOps, match_table), 16);
    assert_eq!(offset_of!(VerbsDeviceOps, alloc_context), 40);
    assert_eq!(offset_of!(VerbsDeviceOps, uninit_device), 64);
    assert_eq!(size_of::<VerbsDevice>(), 712);
    assert_eq!(offset_of!(VerbsDevice, ops), 664);
    assert_eq!(offset_of!(VerbsDevice, refcount), 672);
    assert_eq!(offset_of!(VerbsDevice, entry), 680);
    assert_eq!(offset_of!(VerbsDevice, sysfs), 696);
    assert_eq!(offset_of!(VerbsDevice, core_support), 704);
    assert_eq!(size_of::<VerbsMatchEnt>(), 24);
    assert_eq!(offset_of!(VerbsMatchEnt, vendor), 16);
    assert_eq!(offset_of!(VerbsMatchEnt, kind), 20);
}

#[test]
fn verbs_context_ops_slots() {
    assert_eq!(size_of::<VerbsContextOps>(), 608);
    assert_eq!(offset_of!(VerbsContextOps, alloc_pd), 40);
    assert_eq!(offset_of!(VerbsContextOps, create_qp_ex), 160);
    assert_eq!(offset_of!(VerbsContextOps, poll_cq), 424);
    assert_eq!(offset_of!(VerbsContextOps, post_send), 440);
    assert_eq!(offset_of!(VerbsContextOps, query_port), 480);
    assert_eq!(offset_of!(VerbsContextOps, reg_mr), 544);
    assert_eq!(offset_of!(VerbsContextOps, unimport_pd), 600);
}

#[test]
fn verbs_mr_cq_srq() {
    assert_eq!(size_of::<VerbsMr>(), 56);
    assert_eq!(offset_of!(VerbsMr, mr_type), 48);
    assert_eq!(offset_of!(VerbsMr, access), 52);
    assert_eq!(size_of::<VerbsCq>(), 288);
    assert_eq!(size_of::<VerbsSrq>(), 160);
    assert_eq!(offset_of!(VerbsSrq, srq_type), 128);
    assert_eq!(offset_of!(VerbsSrq, xrcd), 136);
    assert_eq!(offset_of!(VerbsSrq, cq), 144);
    assert_eq!(offset_of!(VerbsSrq, srq_num), 152);
}

#[test]
fn verbs_qp_comp_mask_follows_the_release() {
    // v44.0: sizeof(ibv_qp_ex) == 352, offsetof(verbs_qp, comp_mask) == 352, xrcd at 360.
    assert_eq!(offset_of!(ibv_qp_ex, wr_abort), 336);
    assert_eq!(QP_EX_V36_SIZE, 344);
    assert_eq!(VerbsQp::comp_mask_offset(21), 352);
    // v36–v43 (20 slots) and v45–v56 (22 slots).
    assert_eq!(VerbsQp::comp_mask_offset(20), 344);
    assert_eq!(VerbsQp::comp_mask_offset(22), 360);
    // The storage holds comp_mask and xrcd of the largest layout.
    assert!(size_of::<VerbsQp>() >= VerbsQp::comp_mask_offset(QP_EX_MAX_SLOTS) + 16);
}

#[test]
fn verbs_context_ops_table_matches_the_v36_struct() {
    // Every slot of the v36–v58 table, in CONTEXT_OPS order, is the VerbsContextOps field of
    // that name at that place.
    macro_rules! offsets {
        ($($f:ident),* $(,)?) => { vec![$((stringify!($f), offset_of!(VerbsContextOps, $f))),*] };
    }
    let fields = offsets!(
        advise_mr, alloc_dm, alloc_mw, alloc_null_mr, alloc_parent_domain, alloc_pd, alloc_td,
        async_event, attach_counters_point_flow, attach_mcast, bind_mw, close_xrcd, cq_event,
        create_ah, create_counters, create_cq, create_cq_ex, create_flow, create_flow_action_esp,
        create_qp, create_qp_ex, create_rwq_ind_table, create_srq, create_srq_ex, create_wq,
        dealloc_mw, dealloc_pd, dealloc_td, dereg_mr, destroy_ah, destroy_counters, destroy_cq,
        destroy_flow, destroy_flow_action, destroy_qp, destroy_rwq_ind_table, destroy_srq,
        destroy_wq, detach_mcast, free_context, free_dm, get_srq_num, import_dm, import_mr,
        import_pd, modify_cq, modify_flow_action_esp, modify_qp, modify_qp_rate_limit, modify_srq,
        modify_wq, open_qp, open_xrcd, poll_cq, post_recv, post_send, post_srq_ops, post_srq_recv,
        query_device_ex, query_ece, query_port, query_qp, query_qp_data_in_order, query_rt_values,
        query_srq, read_counters, reg_dm_mr, reg_dmabuf_mr, reg_mr, req_notify_cq, rereg_mr,
        resize_cq, set_ece, unimport_dm, unimport_mr, unimport_pd,
    );
    let v36: Vec<&str> = CONTEXT_OPS.iter().filter(|(_, s)| *s <= 58).map(|(n, _)| *n).collect();
    assert_eq!(fields.len(), CONTEXT_OPS_V36_SLOTS);
    assert_eq!(v36.len(), CONTEXT_OPS_V36_SLOTS);
    for (i, (name, off)) in fields.iter().enumerate() {
        assert_eq!((v36[i], *off), (*name, 8 * i));
    }
    // Alphabetical, as libibverbs keeps it (the layout of a release depends on it).
    assert!(CONTEXT_OPS.windows(2).all(|w| w[0].0 < w[1].0));
}

#[test]
fn verbs_context_ops_per_release() {
    // Slot counts of struct verbs_context_ops in rdma-core's driver.h at each tag.
    let count = |r| CONTEXT_OPS.iter().filter(|(_, s)| *s <= r).count();
    assert_eq!((count(36), count(56), count(58)), (76, 76, 76));
    assert_eq!((count(59), count(61), count(62), count(63), count(64), count(65)), (79, 79, 81, 81, 83, 93));
    let ops = VerbsContextOps { alloc_pd: None, poll_cq: Some(dummy_poll), ..Default::default() };
    let idx = |r: u32, name: &str| {
        CONTEXT_OPS.iter().filter(|(_, s)| *s <= r).position(|(n, _)| *n == name).unwrap()
    };
    for r in [36, 56, 57, 59, 62, 64, 65] {
        let slots = context_ops_slots(&ops, r);
        assert_eq!(slots.len(), count(r), "v{r}");
        assert!(slots[idx(r, "poll_cq")].is_some(), "v{r}");
        assert_eq!(slots.iter().filter(|s| s.is_some()).count(), 1, "v{r}");
    }
    // v65: poll_cq is slot 62 (v36: 53): alloc_buf, alloc_dmah, create_comp_cntr, dealloc_dmah,
    // destroy_comp_cntr, dm_export_dmabuf_fd, free_buf, inc_comp_cntr, inc_err_comp_cntr are
    // before it.
    assert_eq!((idx(36, "poll_cq"), idx(65, "poll_cq")), (53, 62));
}

unsafe extern "C" fn dummy_poll(_: *mut ibv_cq, _: core::ffi::c_int, _: *mut ibv_wc) -> core::ffi::c_int {
    0
}

#[test]
fn verbs_context_grows_up() {
    // v36–v58 (gcc 12, x86_64): offsetof(struct verbs_context, context) == 320.
    assert_eq!(VERBS_CONTEXT_V36_HEAD, 320);
    assert_eq!((verbs_context_head(44), verbs_context_head(58)), (320, 320));
    assert_eq!((verbs_context_head(59), verbs_context_head(61)), (344, 344));
    assert_eq!((verbs_context_head(62), verbs_context_head(63)), (352, 352));
    assert_eq!((verbs_context_head(64), verbs_context_head(65)), (368, 368));
    assert_eq!(VERBS_CONTEXT_MAX_HEAD, 368);
}
