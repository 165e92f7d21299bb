//! rdma-core's fork rules under uiw (`examples/c/fork.c`): a process with connected QPs forks;
//! the child opens the device anew and moves data over QPs of its own, and the parent's QPs
//! carry on, during and after the child's life (the child neither reads from nor closes the
//! parent's streams, and does not inherit a transport without its progress thread).

use uiw_examples::{build_c_example, device_lock, device_test_artifacts, failures, out_dir, parse_summary, show, Published};

#[test]
fn a_forked_child_gets_a_clean_usable_library() {
    let Some(artifacts) = device_test_artifacts("a_forked_child_gets_a_clean_usable_library") else { return };
    let exe = build_c_example("fork", &out_dir(env!("CARGO_TARGET_TMPDIR")));
    let _l = device_lock();
    let dev = Published::up(&artifacts, &out_dir(env!("CARGO_TARGET_TMPDIR"))).unwrap_or_else(|e| panic!("{e}"));
    let out = dev.run(&[exe.as_os_str()], &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let sum = parse_summary(&stdout).unwrap_or_else(|| panic!("no summary\n{}", show(&out)));
    // The parent's 7 checks (its last line), and the child's 2 (its own summary line).
    assert!(out.status.success() && sum.failed == 0 && sum.passed == 7, "{sum:?}: {:?}\n{}", failures(&stdout), show(&out));
    assert!(stdout.lines().any(|l| l == "child: 2 passed, 0 failed"), "{}", show(&out));
}
