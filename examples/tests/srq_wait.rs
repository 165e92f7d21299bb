//! A Send that arrives before any receive is posted to the receiver's SRQ is delivered once
//! one is posted, while the receiving application sleeps on a completion channel
//! (`examples/c/srq_wait.c`). Issue 13: fabtests' `fi_shared_ctx -e msg` server posts its
//! shared receives only after all its endpoints are connected; a Send waiting on an SRQ was
//! not woken by the post and ended, 5 s later, in a "no buffer" Terminate. And no receive
//! may stay with a QP that does not need it: one QP used to take the next receive ahead
//! whenever its stream had bytes to read, and another QP's Send then found the SRQ empty.

use uiw_examples::{assert_all_passed, build_c_example, device_lock, device_test_artifacts, out_dir, Published};

#[test]
fn a_send_waiting_for_an_srq_receive_takes_the_one_posted_later() {
    let test = "a_send_waiting_for_an_srq_receive_takes_the_one_posted_later";
    let Some(artifacts) = device_test_artifacts(test) else { return };
    let exe = build_c_example("srq_wait", &out_dir(env!("CARGO_TARGET_TMPDIR")));
    let _l = device_lock();
    let dev = Published::up(&artifacts, &out_dir(env!("CARGO_TARGET_TMPDIR"))).unwrap_or_else(|e| panic!("{e}"));
    assert_all_passed(test, &dev.run(&[exe.as_os_str()], &[]), 14);
}
