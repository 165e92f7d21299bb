//! A thread blocked in `ibv_get_cq_event` behaves as on a kernel provider now that uiw serves
//! the channel's QPs in that thread while it waits (`examples/c/channel_wait.c`): a Send
//! wakes it with its message, a signal ends the wait as it ends a `read(2)` (EINTR without
//! SA_RESTART, nothing with it), `pthread_cancel` ends it and the thread joins (the first
//! version sat in `epoll_wait` inside Rust frames that caught the unwinding: the process
//! aborted), and a non-blocking channel says EAGAIN. Sends posted by another thread go while
//! the waiter sleeps holding their QP, and a signal after them still leaves errno EINTR (the
//! hand-back of the QP as the waiter woke left EEXIST there: qperf's `rc_bi_bw` failed with
//! "failed to get CQ event: File exists" when its alarm ended the test).

use uiw_examples::{assert_all_passed, build_c_example, device_lock, device_test_artifacts, out_dir, Published};

#[test]
fn a_thread_waiting_on_a_completion_channel_wakes_ends_and_cancels_as_read_does() {
    let test = "a_thread_waiting_on_a_completion_channel_wakes_ends_and_cancels_as_read_does";
    let Some(artifacts) = device_test_artifacts(test) else { return };
    let exe = build_c_example("channel_wait", &out_dir(env!("CARGO_TARGET_TMPDIR")));
    let _l = device_lock();
    let dev = Published::up(&artifacts, &out_dir(env!("CARGO_TARGET_TMPDIR"))).unwrap_or_else(|e| panic!("{e}"));
    assert_all_passed(test, &dev.run(&[exe.as_os_str()], &[]), 28);
}
