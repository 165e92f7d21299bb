//! Acceptance test: `examples/c/integrity.c` — data integrity of every RC
//! operation at every size — run as two processes (server and client), each
//! under `uiw run`, against a uiw device published by the workspace's own
//! `uiw`.
//!
//! Needs `cargo build --workspace` first and root (publishing creates
//! /dev/infiniband/uverbsN). Without root the device tests print why they
//! are skipped; with `UIW_TEST_REQUIRE_ALL=1` (set by ci/test.sh) they fail.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use uiw_examples::twoproc::{free_tcp_port, run_pair, PairOutput};
use uiw_examples::{valgrind_command, 
    build_c_example, device_lock, device_test_artifacts, failures, have_program, out_dir,
    parse_summary, show, skip, Artifacts, Published,
};

/// Checks a passing default run (-m 8M, ibv_post_send) reports on each side;
/// a run that reports fewer skipped part of the plan or stopped early. The
/// plan is fixed for a given -m and granted max_inline_data (64 is asked; a
/// larger grant only adds inline sizes); -N adds two checks per side.
const CLIENT_CHECKS_FULL: u32 = 2628;
const SERVER_CHECKS_FULL: u32 = 2558;
/// The same for `-m 64K` (the valgrind runs).
const CLIENT_CHECKS_SMALL: u32 = 1890;
const SERVER_CHECKS_SMALL: u32 = 1818;

/// Time limits: the default run takes well under a minute on 2 vCPUs.
const LIMIT: Duration = Duration::from_secs(300);
const LIMIT_VALGRIND: Duration = Duration::from_secs(900);

/// The checks every device test shares; `None` means "skipped" (reason printed).
fn prepare(test: &str) -> Option<(Artifacts, PathBuf)> {
    let artifacts = device_test_artifacts(test)?;
    let exe = build_c_example("integrity", &out_dir(env!("CARGO_TARGET_TMPDIR")));
    Some((artifacts, exe))
}

/// What is wrong with one side's run, if anything: no summary line, failed
/// checks, a non-zero exit, or fewer checks than `min`. Returns the number of
/// checks that passed and the problem, if any.
fn judge_side(side: &str, out: &Output, min: u32) -> (u32, Option<String>) {
    const SHOWN: usize = 25;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stderr_tail: String = {
        let lines: Vec<&str> = stderr.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    };
    let Some(summary) = parse_summary(&stdout) else {
        return (
            0,
            Some(format!(
                "{side}: no `N passed, N failed` line ({}): it crashed, hung or stopped \
                 early\n--- {side} stderr (tail) ---\n{stderr_tail}",
                out.status
            )),
        );
    };
    if summary.failed != 0 || !out.status.success() {
        let failed = failures(&stdout);
        return (
            summary.passed,
            Some(format!(
                "{side}: {summary}, {}; failed checks (first {} of {}):\n  {}\n--- {side} stderr (tail) ---\n{stderr_tail}",
                out.status,
                failed.len().min(SHOWN),
                failed.len(),
                failed[..failed.len().min(SHOWN)].join("\n  ")
            )),
        );
    }
    if summary.passed < min {
        return (
            summary.passed,
            Some(format!(
                "{side}: only {} checks ran (expected at least {min})",
                summary.passed
            )),
        );
    }
    (summary.passed, None)
}

fn assert_pair_passed(what: &str, pair: &PairOutput, min_client: u32, min_server: u32) {
    // Both full outputs: shown by `cargo test -- --nocapture`, and on failure.
    println!("{}", pair.show());
    assert!(
        !pair.timed_out,
        "{what}: still running after {:?}; both were killed (outputs above)",
        pair.elapsed
    );
    // The server first: when it fails, the client only says so.
    let (s, s_problem) = judge_side("server", &pair.server, min_server);
    let (c, c_problem) = judge_side("client", &pair.client, min_client);
    let problems: Vec<String> = [s_problem, c_problem].into_iter().flatten().collect();
    assert!(
        problems.is_empty(),
        "{what} failed (full outputs above):\n{}",
        problems.join("\n")
    );
    println!(
        "{what}: client {c} checks, server {s} checks passed in {:.1} s",
        pair.elapsed.as_secs_f64()
    );
}

/// Server and client argument lists for `integrity` with `extra` options.
fn args(prefix: &[&str], exe: &Path, port: u16, extra: &[&str]) -> (Vec<OsString>, Vec<OsString>) {
    let port = port.to_string();
    let mut common: Vec<OsString> = vec!["-p".into(), port.into()];
    common.extend(extra.iter().map(OsString::from));
    let side = |role: &[&str]| -> Vec<OsString> {
        let mut v: Vec<OsString> = prefix.iter().map(OsString::from).collect();
        v.push(exe.as_os_str().to_owned());
        v.extend(role.iter().map(OsString::from));
        v.extend(common.iter().cloned());
        v
    };
    (side(&["-s"]), side(&["-c", "127.0.0.1"]))
}

fn run(test: &str, prefix: &[&str], extra: &[&str], limit: Duration) -> Option<PairOutput> {
    let (artifacts, exe) = prepare(test)?;
    let _lock = device_lock();
    let dev = Published::up(&artifacts, &out_dir(env!("CARGO_TARGET_TMPDIR")))
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    let (server, client) = args(prefix, &exe, free_tcp_port(), extra);
    let s: Vec<&OsStr> = server.iter().map(|a| a.as_os_str()).collect();
    let c: Vec<&OsStr> = client.iter().map(|a| a.as_os_str()).collect();
    Some(run_pair(&dev, &s, &c, &[], limit))
}

/// The program compiles warning-free against the installed libibverbs
/// headers and its command line works (needs no device and no root).
#[test]
fn integrity_builds_and_explains_itself() {
    let exe = build_c_example(
        "integrity",
        &out_dir(env!("CARGO_TARGET_TMPDIR")).join("build-only"),
    );
    let help = Command::new(&exe)
        .arg("--help")
        .output()
        .expect("run integrity --help");
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.status.success() && text.contains("-c HOST") && text.contains("-N"),
        "integrity --help\n{}",
        show(&help)
    );
    // Neither -s nor -c, or both: a usage error (exit 2), not a run.
    for bad in [
        &[][..],
        &["-s", "-c", "127.0.0.1"][..],
        &["-s", "-m", "0"][..],
    ] {
        let out = Command::new(&exe)
            .args(bad)
            .output()
            .expect("run integrity");
        assert_eq!(
            out.status.code(),
            Some(2),
            "integrity {bad:?}\n{}",
            show(&out)
        );
    }
}

/// Every operation, size and variant, posted with ibv_post_send.
#[test]
fn integrity_post_send() {
    const TEST: &str = "integrity_post_send";
    let Some(pair) = run(TEST, &[], &[], LIMIT) else {
        return;
    };
    assert_pair_passed(
        "integrity (ibv_post_send)",
        &pair,
        CLIENT_CHECKS_FULL,
        SERVER_CHECKS_FULL,
    );
}

/// The same plan, posted with the ibv_wr_* API (ibv_qp_ex).
#[test]
fn integrity_wr_api() {
    const TEST: &str = "integrity_wr_api";
    let Some(pair) = run(TEST, &[], &["-N"], LIMIT) else {
        return;
    };
    assert_pair_passed(
        "integrity -N (ibv_wr_*)",
        &pair,
        CLIENT_CHECKS_FULL,
        SERVER_CHECKS_FULL,
    );
}

/// Both processes under valgrind with a small -m: no memory errors, no
/// leaks, and every check still passes.
fn under_valgrind(test: &str, extra: &[&str]) {
    if !have_program("valgrind") {
        skip(test, "valgrind is not installed (apt-get install valgrind)");
        return;
    }
    let valgrind = valgrind_command();
    let prefix: Vec<&str> = valgrind.iter().map(String::as_str).collect();
    let mut opts = vec!["-m", "64K"];
    opts.extend_from_slice(extra);
    let Some(pair) = run(test, &prefix, &opts, LIMIT_VALGRIND) else {
        return;
    };
    for (side, out) in [("server", &pair.server), ("client", &pair.client)] {
        assert!(
            out.status.code() != Some(99),
            "valgrind found memory errors or leaks in the {side} (exit 99)\n{}",
            pair.show()
        );
    }
    assert_pair_passed(test, &pair, CLIENT_CHECKS_SMALL, SERVER_CHECKS_SMALL);
}

/// ibv_post_send under valgrind.
#[test]
fn integrity_under_valgrind() {
    under_valgrind("integrity_under_valgrind", &[]);
}

/// The ibv_wr_* builder (more pointer-passing into the provider) under
/// valgrind.
#[test]
fn integrity_wr_api_under_valgrind() {
    under_valgrind("integrity_wr_api_under_valgrind", &["-N"]);
}
