//! Acceptance test (issue 9): `examples/c/dereg_race.c` — `ibv_dereg_mr` while a peer
//! streams RDMA Writes into the region and Reads out of it returns only when no transfer
//! touches it any more (nothing lands afterwards, no Read returns made-up bytes), and a Read
//! Request for a region already gone draws a Terminate (`IBV_WC_REM_ACCESS_ERR`). Under
//! valgrind with the region freed right after the dereg: no access to freed memory.
//!
//! Needs `cargo build --workspace` first and root (see `verbs_objects.rs`).

use std::ffi::OsStr;
use std::path::PathBuf;

use uiw_examples::{valgrind_command, 
    build_c_example, device_lock, device_test_artifacts, failures, have_program, out_dir,
    parse_summary, show, skip, Artifacts, Published,
};

/// Checks a run makes: per round 4 for the writes (3 with `-f`: the freed region is not
/// looked at) and 4 for the reads, then 5 for the gone region. A run that reports fewer
/// stopped early.
fn checks(rounds: u32, freed: bool) -> u32 {
    rounds * if freed { 7 } else { 8 } + 5
}

fn prepare(test: &str) -> Option<(Artifacts, PathBuf)> {
    let artifacts = device_test_artifacts(test)?;
    let exe = build_c_example("dereg_race", &out_dir(env!("CARGO_TARGET_TMPDIR")));
    Some((artifacts, exe))
}

fn assert_passed(what: &str, out: &std::process::Output, want: u32) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{}", show(out));
    let summary = parse_summary(&stdout).unwrap_or_else(|| {
        panic!("{what}: no `N passed, N failed` line (exit status {})\n{}", out.status, show(out))
    });
    assert!(
        summary.failed == 0 && out.status.success(),
        "{what}: {summary}, exit status {}\nfailed checks:\n  {}\n{}",
        out.status,
        failures(&stdout).join("\n  "),
        show(out)
    );
    assert!(
        summary.passed >= want,
        "{what}: only {} checks ran (expected {want})\n{}",
        summary.passed,
        show(out)
    );
}

/// `uiw run -- ./dereg_race -r 8`: every check passes.
#[test]
fn dereg_while_streaming_under_uiw_run() {
    const TEST: &str = "dereg_while_streaming_under_uiw_run";
    let Some((artifacts, exe)) = prepare(TEST) else {
        return;
    };
    let _lock = device_lock();
    let dev = Published::up(&artifacts, &out_dir(env!("CARGO_TARGET_TMPDIR")))
        .unwrap_or_else(|e| panic!("{TEST}: {e}"));
    let out = dev.run(&[exe.as_os_str(), OsStr::new("-r"), OsStr::new("8")], &[]);
    assert_passed("uiw run -- dereg_race -r 8", &out, checks(8, false));
}

/// `uiw run -- valgrind ./dereg_race -r 2 -f`: the region is freed right after
/// `ibv_dereg_mr` returns; valgrind finds no access to it (nor any other error or leak).
#[test]
fn dereg_while_streaming_under_valgrind() {
    const TEST: &str = "dereg_while_streaming_under_valgrind";
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
    args.extend([exe.as_os_str(), OsStr::new("-r"), OsStr::new("2"), OsStr::new("-f")]);
    // Warnings (a QP going to ERROR and why) on stderr: a failure explains itself.
    let out = dev.run(&args, &[("VERBS_LOG_LEVEL", "2")]);
    assert!(out.status.code() != Some(99), "valgrind found memory errors or leaks (exit 99)\n{}", show(&out));
    assert_passed("uiw run -- valgrind dereg_race -r 2 -f", &out, checks(2, true));
}
