//! Acceptance test: `examples/c/verbs_objects.c`, an unmodified libibverbs
//! program, run against a uiw device published by the workspace's own `uiw`.
//!
//! Needs `cargo build --workspace` first (for `uiw`, the provider and the
//! shim) and root (publishing creates /dev/infiniband/uverbsN). Without root
//! the device tests print why they are skipped; with
//! `UIW_TEST_REQUIRE_ALL=1` (set by ci/test.sh) they fail instead.

use std::ffi::OsStr;
use std::path::PathBuf;

use uiw_examples::{valgrind_command, 
    build_c_example, device_lock, device_test_artifacts, failures, have_program, out_dir,
    parse_summary, show, skip, Artifacts, Published,
};

/// Every check in verbs_objects.c; a run that reports fewer stopped early.
const MIN_CHECKS: u32 = 60;

/// The checks every device test shares; `None` means "skipped" (reason printed).
fn prepare(test: &str) -> Option<(Artifacts, PathBuf)> {
    let artifacts = device_test_artifacts(test)?;
    let exe = build_c_example("verbs_objects", &out_dir(env!("CARGO_TARGET_TMPDIR")));
    Some((artifacts, exe))
}

/// Assert a TAP-like run passed: exit 0, a summary line, no failures.
fn assert_passed(what: &str, out: &std::process::Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Shown by `cargo test -- --nocapture`, and on failure.
    println!("{}", show(out));
    let summary = parse_summary(&stdout).unwrap_or_else(|| {
        panic!(
            "{what}: no `N passed, N failed` line (exit status {}): the program \
             crashed or stopped early\n{}",
            out.status,
            show(out)
        )
    });
    assert!(
        summary.failed == 0 && out.status.success(),
        "{what}: {summary}, exit status {}\nfailed checks:\n  {}\n{}",
        out.status,
        failures(&stdout).join("\n  "),
        show(out)
    );
    assert!(
        summary.passed >= MIN_CHECKS,
        "{what}: only {} checks ran (expected at least {MIN_CHECKS})\n{}",
        summary.passed,
        show(out)
    );
}

/// The program compiles warning-free against the installed libibverbs
/// headers (needs no device and no root).
#[test]
fn verbs_objects_builds() {
    let exe = build_c_example(
        "verbs_objects",
        &out_dir(env!("CARGO_TARGET_TMPDIR")).join("build-only"),
    );
    assert!(exe.is_file());
}

/// `uiw run -- ./verbs_objects`: every check passes.
#[test]
fn verbs_objects_under_uiw_run() {
    const TEST: &str = "verbs_objects_under_uiw_run";
    let Some((artifacts, exe)) = prepare(TEST) else {
        return;
    };
    let _lock = device_lock();
    let dev = Published::up(&artifacts, &out_dir(env!("CARGO_TARGET_TMPDIR")))
        .unwrap_or_else(|e| panic!("{TEST}: {e}"));
    // Under the launcher the completion-channel shim is present: a channel
    // must be created, not merely fail cleanly.
    let out = dev.run(&[exe.as_os_str()], &[("UIW_EXPECT_COMP_CHANNEL", "1")]);
    assert_passed("uiw run -- verbs_objects", &out);
}

/// `uiw run -- valgrind ... ./verbs_objects`: no memory errors, no leaks,
/// and every check still passes.
#[test]
fn verbs_objects_under_valgrind() {
    const TEST: &str = "verbs_objects_under_valgrind";
    if !have_program("valgrind") {
        skip(TEST, "valgrind is not installed (apt-get install valgrind)");
        return;
    }
    let Some((artifacts, exe)) = prepare(TEST) else {
        return;
    };
    let _lock = device_lock();
    let dev = Published::up(&artifacts, &out_dir(env!("CARGO_TARGET_TMPDIR")))
        .unwrap_or_else(|e| panic!("{TEST}: {e}"));
    let valgrind = valgrind_command();
    let mut args: Vec<&OsStr> = valgrind.iter().map(OsStr::new).collect();
    args.push(exe.as_os_str());
    let out = dev.run(&args, &[("UIW_EXPECT_COMP_CHANNEL", "1")]);
    assert!(
        out.status.code() != Some(99),
        "valgrind found memory errors or leaks (exit 99)\n{}",
        show(&out)
    );
    assert_passed("uiw run -- valgrind verbs_objects", &out);
}
