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
