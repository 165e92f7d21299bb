//! The provider's progress thread has finished starting when the verbs call that started it
//! (`ibv_create_qp`, the context's first QP) returns (`examples/c/thread_start.c`).
//!
//! Issue 13: fabtests' servers died with SIGSEGV at `__munmap+0x9` ← `malloc` ←
//! `__tls_get_addr` ← `std::thread::current::set_current` in `uiw-progress`: the thread,
//! started while libfabric's verbs provider probed a QP in `fi_getinfo`, was creating its
//! malloc arena (mmap + munmap) on its own schedule while the main thread, in `fi_domain`,
//! had libfabric's memory monitor rewrite `munmap`'s first 13 bytes with a jump.
//!
//! The program pins itself to one CPU at SCHED_FIFO, so that a thread the provider does not
//! wait for has not run at all when `ibv_create_qp` returns: without the wait the check
//! fails every time, not by chance.

use uiw_examples::{assert_all_passed, build_c_example, device_lock, device_test_artifacts, out_dir, Published};

#[test]
fn the_progress_thread_has_started_when_ibv_create_qp_returns() {
    let test = "the_progress_thread_has_started_when_ibv_create_qp_returns";
    let Some(artifacts) = device_test_artifacts(test) else { return };
    let exe = build_c_example("thread_start", &out_dir(env!("CARGO_TARGET_TMPDIR")));
    let _l = device_lock();
    let dev = Published::up(&artifacts, &out_dir(env!("CARGO_TARGET_TMPDIR"))).unwrap_or_else(|e| panic!("{e}"));
    // Fresh processes: only a process's first thread creates an arena (later ones reuse it).
    for run in 0..3 {
        let out = dev.run(&[exe.as_os_str(), "-n".as_ref(), "5".as_ref()], &[]);
        assert_all_passed(&format!("{test}: run {run}"), &out, 3);
    }
}
