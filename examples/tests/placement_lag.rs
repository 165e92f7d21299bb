//! Issue 9's placement-lag probe, `examples/c/placement_lag.c`, as a behavioural test: in one
//! process, every RDMA Write whose completion the initiator polled becomes visible at a
//! passive target (a QP whose CQ nobody polls, as in rdma-core's
//! `test_qp_ex_rc_rdma_write`), and the probe says so — or, when a write never shows up, ends
//! with exit status 1 instead of hanging. Nothing here asserts a time: uiw-bench's
//! `placement_lag` rows measure the lag.
//!
//! Needs `cargo build --workspace` first and root (see `verbs_objects.rs`).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use uiw_examples::{
    build_c_example, device_lock, device_test_artifacts, out_dir, show, Artifacts, Published,
};

fn prepare(test: &str) -> Option<(Artifacts, PathBuf)> {
    let artifacts = device_test_artifacts(test)?;
    let exe = build_c_example("placement_lag", &out_dir(env!("CARGO_TARGET_TMPDIR")));
    Some((artifacts, exe))
}

/// The `visible: N of M writes` line.
fn visible(stdout: &str) -> Option<(u64, u64)> {
    let l = stdout.lines().find_map(|l| l.strip_prefix("visible: "))?;
    let (n, rest) = l.split_once(" of ")?;
    let m = rest.strip_suffix(" writes")?;
    Some((n.parse().ok()?, m.parse().ok()?))
}

/// The `n=` of the `lag_us:` line (how many lags the percentiles were taken over).
fn lag_count(stdout: &str) -> Option<u64> {
    let l = stdout.lines().find(|l| l.starts_with("lag_us: "))?;
    l.split_whitespace()
        .find_map(|w| w.strip_prefix("n=")?.parse().ok())
}

fn run(dev: &Published, exe: &Path, args: &[&str]) -> Output {
    let mut argv: Vec<&OsStr> = vec![exe.as_os_str()];
    argv.extend(args.iter().map(OsStr::new));
    dev.run(&argv, &[])
}

fn assert_all_visible(what: &str, out: &Output, iters: u64) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{what}\n{}", show(out));
    assert!(
        out.status.success(),
        "{what}: exit status {} (a write failed or never became visible)\n{}",
        out.status,
        show(out)
    );
    assert_eq!(
        visible(&stdout),
        Some((iters, iters)),
        "{what}: not every write was seen at the target\n{}",
        show(out)
    );
    assert_eq!(
        lag_count(&stdout),
        Some(iters),
        "{what}: the lags of every timed write\n{}",
        show(out)
    );
    assert!(!stdout.contains("FAILED"), "{what}\n{}", show(out));
}

/// The program compiles warning-free, documents itself and refuses bad arguments (exit 2)
/// without a device.
#[test]
fn placement_lag_builds_and_explains_itself() {
    let exe = build_c_example(
        "placement_lag",
        &out_dir(env!("CARGO_TARGET_TMPDIR")).join("build-only"),
    );
    let help = Command::new(&exe)
        .arg("--help")
        .output()
        .expect("run placement_lag --help");
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.status.success(),
        "placement_lag --help\n{}",
        show(&help)
    );
    for f in [
        "-d DEVICE",
        "-n ITERS",
        "-w WARMUP",
        "-s SIZE",
        "-t MS",
        "-q",
        "-P",
        "-X",
        "EXIT STATUS",
        "lag_us:",
    ] {
        assert!(text.contains(f), "--help does not document {f}\n{text}");
    }
    for bad in [
        &["-s", "12"][..],
        &["-s", "4"],
        &["-n", "0"],
        &["-t", "x"],
        &["extra"],
        &["-Z"],
    ] {
        let out = Command::new(&exe)
            .args(bad)
            .output()
            .expect("run placement_lag");
        assert_eq!(
            out.status.code(),
            Some(2),
            "placement_lag {bad:?}\n{}",
            show(&out)
        );
    }
}

/// `uiw run -- placement_lag`: every 8-byte and 4 KiB Write is seen at the passive target
/// (its last 8 bytes, then its first 8 bytes), also with the target's CQ polled (`-P`: it
/// stays empty), and a look for a number no Write carries (`-X`)
/// gives up after its time limit with exit status 1: the check can fail, and does not hang.
#[test]
fn placement_lag_sees_every_write_at_a_passive_target() {
    const TEST: &str = "placement_lag_sees_every_write_at_a_passive_target";
    let Some((artifacts, exe)) = prepare(TEST) else {
        return;
    };
    let _lock = device_lock();
    let dev = Published::up(&artifacts, &out_dir(env!("CARGO_TARGET_TMPDIR")))
        .unwrap_or_else(|e| panic!("{TEST}: {e}"));

    let out = run(
        &dev,
        &exe,
        &["-d", "uiw_lo", "-n", "300", "-w", "10", "-s", "8"],
    );
    assert_all_visible("placement_lag -s 8", &out, 300);
    let out = run(
        &dev,
        &exe,
        &["-d", "uiw_lo", "-n", "200", "-w", "10", "-s", "4K"],
    );
    assert_all_visible("placement_lag -s 4K", &out, 200);
    // Larger than one FPDU: the message arrives in several pieces, the first and the last
    // 8 bytes in different ones.
    let out = run(
        &dev,
        &exe,
        &["-d", "uiw_lo", "-n", "50", "-w", "2", "-s", "256K"],
    );
    assert_all_visible("placement_lag -s 256K", &out, 50);

    // An active target (its CQ polled between looks): the same, and its CQ stays empty.
    let out = run(&dev, &exe, &["-d", "uiw_lo", "-n", "100", "-w", "10", "-P"]);
    assert_all_visible("placement_lag -P", &out, 100);

    let out = run(
        &dev,
        &exe,
        &["-d", "uiw_lo", "-n", "5", "-w", "0", "-t", "50", "-X"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("placement_lag -X\n{}", show(&out));
    assert_eq!(
        out.status.code(),
        Some(1),
        "placement_lag -X must fail\n{}",
        show(&out)
    );
    assert!(
        stdout.contains(
            "FAILED: write 1: its data was not visible at the target 50 ms after its completion"
        ),
        "placement_lag -X: the failure is the first write's, and says why\n{}",
        show(&out)
    );
    // The write itself did land: the target holds its number, not the one looked for.
    assert!(stdout.contains("last 8 bytes hold 1)"), "{}", show(&out));
    assert_eq!(visible(&stdout), None, "{}", show(&out));
}

/// The `first_look: N of M writes …` line: writes already visible at the first read after
/// their completion.
fn first_look(stdout: &str) -> Option<(u64, u64)> {
    let l = stdout.lines().find_map(|l| l.strip_prefix("first_look: "))?;
    let (n, rest) = l.split_once(" of ")?;
    let m = rest.split_whitespace().next()?;
    Some((n.parse().ok()?, m.parse().ok()?))
}

/// What rdma-core's `test_qp_ex_rc_rdma_write` relies on: with both QPs in one process, a
/// Write's bytes are in the passive target's region by the time the initiator polls the
/// Write's completion — at the first look, every time, not eventually (uiw serves a QP of the
/// same process on the sender's thread). Message sizes that fit loopback's socket buffer.
#[test]
fn a_write_to_a_qp_of_the_same_process_is_visible_at_its_completion() {
    const TEST: &str = "a_write_to_a_qp_of_the_same_process_is_visible_at_its_completion";
    let Some((artifacts, exe)) = prepare(TEST) else {
        return;
    };
    let _lock = device_lock();
    let dev = Published::up(&artifacts, &out_dir(env!("CARGO_TARGET_TMPDIR")))
        .unwrap_or_else(|e| panic!("{TEST}: {e}"));
    for size in ["8", "4K"] {
        let out = run(&dev, &exe, &["-d", "uiw_lo", "-n", "2000", "-w", "10", "-s", size]);
        let what = format!("placement_lag -s {size}");
        assert_all_visible(&what, &out, 2000);
        assert_eq!(
            first_look(&String::from_utf8_lossy(&out.stdout)),
            Some((2000, 2000)),
            "{what}: a Write's bytes were not all in the target region when its completion was \
             polled\n{}",
            show(&out)
        );
    }
}

/// The first Write on a new connection, as rdma-core's tests post it: right after both QPs
/// reach RTS, while the stream's MPA exchange may still be under way. The Write is then queued,
/// and goes out from whichever thread next pumps the initiator — typically its own poll for
/// the completion — not from the post that would have served the target. Its completion must
/// still find the bytes in the target (uiw serves a peer of the same process when a poll takes
/// a Send's or Write's completion). Each run is a new process and a new connection; before
/// that, 5 to 30 in 100 of them found the target untouched (`first_look: 0 of 1`).
#[test]
fn the_first_write_on_a_new_connection_is_visible_at_its_completion() {
    const TEST: &str = "the_first_write_on_a_new_connection_is_visible_at_its_completion";
    const RUNS: usize = 100;
    let Some((artifacts, exe)) = prepare(TEST) else {
        return;
    };
    let _lock = device_lock();
    let dev = Published::up(&artifacts, &out_dir(env!("CARGO_TARGET_TMPDIR")))
        .unwrap_or_else(|e| panic!("{TEST}: {e}"));
    let mut late = Vec::new();
    for run_no in 1..=RUNS {
        let out = run(&dev, &exe, &["-d", "uiw_lo", "-n", "1", "-w", "0"]);
        assert_all_visible("placement_lag -n 1 -w 0", &out, 1);
        if first_look(&String::from_utf8_lossy(&out.stdout)) != Some((1, 1)) {
            late.push(format!("run {run_no}:\n{}", show(&out)));
        }
    }
    assert!(
        late.is_empty(),
        "{} of {RUNS} first Writes were not in the target when their completion was polled:\n{}",
        late.len(),
        late.join("\n")
    );
}

/// The `idle:` line of `-I`: the progress thread's context switches and CPU milliseconds
/// while the connected QPs sat idle.
fn idle(stdout: &str) -> Option<(u64, f64)> {
    let l = stdout.lines().find_map(|l| l.strip_prefix("idle: "))?;
    let field = |k: &str| l.split_whitespace().find_map(|w| w.strip_prefix(k));
    Some((field("switches=")?.parse().ok()?, field("cpu_ms=")?.parse().ok()?))
}

/// An idle process takes no periodic wake-ups, and the progress thread's busy-poll after
/// traffic (`engine::spin`, asked for here with a 50 µs window) ends with the traffic:
/// after 2000 Writes between two connected
/// QPs, a second in which nothing is posted costs the progress thread at most a few
/// wake-ups (a lease handed back, a window ending) and no CPU to speak of. A poll that went
/// on after the traffic shows as CPU time (a second of it), a timer as a wake-up per period.
#[test]
fn a_connected_process_left_idle_takes_no_wake_ups() {
    const TEST: &str = "a_connected_process_left_idle_takes_no_wake_ups";
    let Some((artifacts, exe)) = prepare(TEST) else {
        return;
    };
    let _lock = device_lock();
    let dev = Published::up(&artifacts, &out_dir(env!("CARGO_TARGET_TMPDIR")))
        .unwrap_or_else(|e| panic!("{TEST}: {e}"));
    let argv = [exe.as_os_str(), OsStr::new("-d"), OsStr::new("uiw_lo"), OsStr::new("-n"), OsStr::new("2000"), OsStr::new("-w"), OsStr::new("10"), OsStr::new("-I"), OsStr::new("1000"), OsStr::new("-q")];
    for spin in ["0", "50"] {
        let out = dev.run(&argv, &[("UIW_PROGRESS_SPIN_US", spin)]);
        let what = format!("UIW_PROGRESS_SPIN_US={spin} placement_lag -I 1000");
        assert_all_visible(&what, &out, 2000);
        let (switches, cpu_ms) = idle(&String::from_utf8_lossy(&out.stdout))
            .unwrap_or_else(|| panic!("{what}: no idle: line\n{}", show(&out)));
        assert!(switches <= 4, "{what}: the progress thread woke {switches} times in an idle second\n{}", show(&out));
        assert!(cpu_ms < 50.0, "{what}: the progress thread ran {cpu_ms} ms in an idle second\n{}", show(&out));
    }
}

/// The `polling:` line of `-B`: the progress thread's context switches and CPU milliseconds
/// while the application polled the initiator's CQ without pause, and how many polls it made.
fn polling(stdout: &str) -> Option<(u64, f64, u64)> {
    let l = stdout.lines().find_map(|l| l.strip_prefix("polling: "))?;
    let field = |k: &str| l.split_whitespace().find_map(|w| w.strip_prefix(k));
    Some((field("switches=")?.parse().ok()?, field("cpu_ms=")?.parse().ok()?, field("polls=")?.parse().ok()?))
}

/// A thread that keeps polling holds its QP (issue 9's lease) and costs the progress thread no
/// wake-ups: its polls push the progress thread's lease alarm away instead of letting it go off
/// to check the lease (`engine::lease`). Before, the checks backed off to one a millisecond —
/// a wake-up preempting the poller on a machine whose CPUs pollers hold — so a second of
/// polling cost about a thousand. A few may still come from the claim itself (a first check
/// LEASE_US after it) and from a poller preempted for longer than the alarm's lead.
#[test]
fn a_thread_that_keeps_polling_costs_the_progress_thread_no_wake_ups() {
    const TEST: &str = "a_thread_that_keeps_polling_costs_the_progress_thread_no_wake_ups";
    let Some((artifacts, exe)) = prepare(TEST) else {
        return;
    };
    let _lock = device_lock();
    let dev = Published::up(&artifacts, &out_dir(env!("CARGO_TARGET_TMPDIR")))
        .unwrap_or_else(|e| panic!("{TEST}: {e}"));
    let out = run(&dev, &exe, &["-d", "uiw_lo", "-n", "200", "-w", "10", "-B", "1000", "-q"]);
    let what = "placement_lag -B 1000";
    assert_all_visible(what, &out, 200);
    let (switches, cpu_ms, polls) = polling(&String::from_utf8_lossy(&out.stdout))
        .unwrap_or_else(|| panic!("{what}: no polling: line\n{}", show(&out)));
    assert!(polls > 1000, "{what}: only {polls} polls in a second\n{}", show(&out));
    assert!(
        switches <= 100,
        "{what}: the progress thread woke {switches} times in a second its QP's CQ was polled without pause\n{}",
        show(&out)
    );
    assert!(cpu_ms < 100.0, "{what}: the progress thread ran {cpu_ms} ms in that second\n{}", show(&out));
}
