//! Fault test: what a surviving RC QP sees when its peer dies (SIGKILL) or
//! closes its end (moves its QP to ERROR, or exits normally) in the middle
//! of a transfer. `examples/c/faults.c` is the program (see its header); this
//! file starts the two sides under `uiw run`, kills the peer, and checks the
//! survivor's report:
//!
//! - every WR it had outstanding completes — in error — and none is lost
//!   (counted per queue, in posting order);
//! - its QP is in IBV_QPS_ERR;
//! - it gets IBV_EVENT_QP_FATAL (required when the peer is killed);
//! - nothing hangs: the survivor must exit within [`HANG_GUARD`] of the kill.
//!
//! The time from the kill to the survivor's last completion is measured and
//! printed (`cargo test --test faults -- --nocapture`); it is not asserted
//! (tests check behaviour, not speed) beyond the hang guard.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use uiw_examples::pair::{free_port, uiw_run, Finished, Running};
use uiw_examples::{
    build_c_example, device_lock, device_test_artifacts, failures, out_dir, parse_summary,
    Artifacts, Published,
};

/// Longest a survivor may take from the peer's death (or the start of its
/// close) to its exit before the test calls it a hang.
const HANG_GUARD: Duration = Duration::from_secs(10);
/// Deadline for setup: listening, connecting, traffic flowing.
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Every check the survivor makes when all goes well (fewer means it stopped early).
const MIN_SURVIVOR_CHECKS: u32 = 20;

fn prepare(test: &str) -> Option<(Artifacts, PathBuf)> {
    let artifacts = device_test_artifacts(test)?;
    Some((artifacts, faults_exe()))
}

/// `faults`, built once per test run: the tests run in parallel threads, and
/// rebuilding the executable while another test runs it fails that test
/// (`uiw run: cannot execute ...: Permission denied`, or ETXTBSY for cc).
fn faults_exe() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| build_c_example("faults", &out_dir(env!("CARGO_TARGET_TMPDIR"))))
        .clone()
}

/// Which side streams (Writes and Sends; a full send queue) and which only
/// keeps receives posted.
#[derive(Debug, Clone, Copy, PartialEq)]
enum SurvivorMode {
    /// The survivor streams; the peer is a sink.
    Stream,
    /// The survivor is a sink (posted receives only); the peer streams.
    Sink,
}

/// How the peer goes away.
#[derive(Debug, Clone, Copy, PartialEq)]
enum PeerEnd {
    /// The harness sends it SIGKILL once the survivor prints STREAMING.
    Killed,
    /// It moves its own QP to IBV_QPS_ERR and stays alive.
    QpToError,
    /// It stops, destroys its objects and exits 0.
    Exits,
}

/// A `key=value` field of the survivor's RESULT lines.
fn result_field<'a>(stdout: &'a str, key: &str) -> Option<&'a str> {
    stdout
        .lines()
        .filter(|l| l.starts_with("RESULT "))
        .flat_map(|l| l.split_whitespace())
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

fn result_u64(stdout: &str, key: &str, all: &str) -> u64 {
    result_field(stdout, key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no RESULT {key}=N from the survivor\n{all}"))
}

/// How the survivor waits for completions.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Wait {
    /// Busy-polls the CQ.
    Poll,
    /// Sleeps on a completion channel (`faults -w`): the flushes must wake it.
    Events,
}

/// What a streaming survivor's send queue holds.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Ops {
    /// RDMA Writes and Sends: done once their bytes are on the wire.
    WritesSends,
    /// One WR in 8 an RDMA Read (`faults -R`): outstanding until its
    /// response arrives, so Reads (and the WRs behind them) are in flight
    /// when the peer goes away.
    WithReads,
}

fn run_fault(test: &str, mode: SurvivorMode, end: PeerEnd, wait: Wait, ops: Ops) {
    let Some((artifacts, exe)) = prepare(test) else {
        return;
    };
    let _lock = device_lock();
    let dev = Published::up(&artifacts, &out_dir(env!("CARGO_TARGET_TMPDIR")))
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    let port = free_port().to_string();
    let (smode, pmode) = match mode {
        SurvivorMode::Stream => ("stream", "sink"),
        SurvivorMode::Sink => ("sink", "stream"),
    };
    let (action, event) = match end {
        PeerEnd::Killed => ("kill", "required"),
        PeerEnd::QpToError => ("error", "optional"),
        PeerEnd::Exits => ("exit", "optional"),
    };
    // A sink sees one Send per 8 WRs: ask it for fewer before STREAMING.
    let streaming_after = match mode {
        SurvivorMode::Stream => "200",
        SurvivorMode::Sink => "50",
    };
    let mut sargs = vec![
        "-r",
        "survivor",
        "-m",
        smode,
        "-p",
        &port,
        "-s",
        streaming_after,
        "-e",
        event,
        "-t",
        "8",
    ];
    if wait == Wait::Events {
        sargs.push("-w");
    }
    if ops == Ops::WithReads {
        sargs.push("-R");
    }
    let mut survivor = Running::spawn("survivor", uiw_run(&dev, &exe, &sargs));
    let all = |s: &Finished, p: &Finished| format!("{s}{p}");

    if let Err(e) = survivor.wait_for_line("LISTENING", SETUP_TIMEOUT) {
        let s = survivor.finish(Instant::now());
        panic!("{test}: {e}\n{s}");
    }
    let mut peer = Running::spawn(
        "peer",
        uiw_run(
            &dev,
            &exe,
            &[
                "-r",
                "peer",
                "-m",
                pmode,
                "-a",
                action,
                "-k",
                "64",
                "-p",
                &port,
                "127.0.0.1",
            ],
        ),
    );

    // The moment the connection starts going away, as the harness sees it.
    let end_at = match end {
        PeerEnd::Killed => {
            if let Err(e) = survivor.wait_for_line("STREAMING", SETUP_TIMEOUT) {
                let now = Instant::now();
                let (s, p) = (survivor.finish(now), peer.finish(now));
                panic!("{test}: no traffic before the kill: {e}\n{}", all(&s, &p));
            }
            if let Some(st) = peer.try_status() {
                let now = Instant::now();
                let (s, p) = (survivor.finish(now), peer.finish(now));
                panic!(
                    "{test}: the peer ended ({st}) before it was killed\n{}",
                    all(&s, &p)
                );
            }
            peer.kill()
        }
        PeerEnd::QpToError | PeerEnd::Exits => {
            let pat = if end == PeerEnd::Exits {
                "PEER_EXITING"
            } else {
                "PEER_QP_ERROR"
            };
            match peer.wait_for_line(pat, SETUP_TIMEOUT) {
                Ok(l) => l.at,
                Err(e) => {
                    let now = Instant::now();
                    let (s, p) = (survivor.finish(now), peer.finish(now));
                    panic!("{test}: {e}\n{}", all(&s, &p));
                }
            }
        }
    };

    let s = survivor.finish(end_at + HANG_GUARD);
    let p = peer.finish(Instant::now() + Duration::from_secs(5));
    let out = all(&s, &p);
    println!("{out}");

    assert!(
        !s.timed_out,
        "{test}: the survivor HUNG: still running {HANG_GUARD:?} after the peer went away\n{out}"
    );
    let status = s.status.expect("reaped");
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_ne!(
            status.signal(),
            Some(13),
            "{test}: the survivor died of SIGPIPE: the provider wrote to the dead peer's \
             socket without MSG_NOSIGNAL\n{out}"
        );
    }
    let summary = parse_summary(&s.stdout).unwrap_or_else(|| {
        panic!("{test}: no `N passed, N failed` line from the survivor ({status}): it crashed or stopped early\n{out}")
    });
    assert!(
        summary.failed == 0 && status.success(),
        "{test}: survivor {summary}, exit status {status}\nfailed checks:\n  {}\n{out}",
        failures(&s.stdout).join("\n  ")
    );
    assert!(
        summary.passed >= MIN_SURVIVOR_CHECKS,
        "{test}: only {} survivor checks ran (expected at least {MIN_SURVIVOR_CHECKS})\n{out}",
        summary.passed
    );

    // The survivor's own counts, re-checked here: outstanding WRs existed,
    // every posted WR completed, and the outstanding ones did so in error.
    let n = |k: &str| result_u64(&s.stdout, k, &out);
    assert!(
        n("outstanding_at_detect") > 0,
        "{test}: nothing was outstanding\n{out}"
    );
    assert_eq!(
        n("sq_posted"),
        n("sq_ok") + n("sq_err"),
        "{test}: send WRs lost\n{out}"
    );
    assert_eq!(
        n("rq_posted"),
        n("rq_ok") + n("rq_err"),
        "{test}: receive WRs lost\n{out}"
    );
    assert!(
        n("rq_err") > 0,
        "{test}: no receive WR completed in error\n{out}"
    );
    if mode == SurvivorMode::Stream {
        assert!(
            n("sq_err") > 0,
            "{test}: no send WR completed in error\n{out}"
        );
    }
    // With Wait::Events a survivor whose flushes raise no completion event
    // sleeps until the hang guard kills it (asserted above); whether an event
    // or a poll before arming delivered them is timing, and not asserted.
    match end {
        PeerEnd::Killed => {
            assert!(
                s.line("ASYNC_EVENT IBV_EVENT_QP_FATAL (1) for this QP")
                    .is_some(),
                "{test}: no IBV_EVENT_QP_FATAL for the survivor's QP\n{out}"
            );
            // The peer died of our SIGKILL, not by itself.
            assert!(
                p.killed_at.is_some(),
                "{test}: the peer was not killed\n{out}"
            );
        }
        PeerEnd::QpToError | PeerEnd::Exits => {
            assert!(
                p.success(),
                "{test}: the peer must finish its own checks and exit 0\n{out}"
            );
        }
    }

    // The measurement the issue asks for (not asserted beyond the hang guard).
    let last = s
        .line("LAST_COMPLETION")
        .unwrap_or_else(|| panic!("{test}: no LAST_COMPLETION line\n{out}"));
    let field = |k: &str| result_field(&s.stdout, k).unwrap_or("?").to_string();
    println!(
        "### {test}: peer {action} -> survivor's last flushed completion: {:.1} ms (harness clock; \
         target < 1 s); in-process: first error -> last completion {} ms, last successful \
         completion -> last completion {} ms; {}; {} WRs outstanding; {}",
        last.at.saturating_duration_since(end_at).as_secs_f64() * 1e3,
        field("detect_to_last_ms"),
        field("last_ok_to_last_ms"),
        s.line("FIRST_ERROR").map(|l| l.text.as_str()).unwrap_or("no error completion"),
        field("outstanding_at_detect"),
        s.line("ASYNC_EVENT").map(|l| l.text.as_str()).unwrap_or("no ASYNC_EVENT line"),
    );
    if let Some(l) = s.line("RESULT cq_events=") {
        println!("### {test}: {}", l.text);
    }
}

/// The survivor streams Writes and Sends (full send queue, receives posted);
/// the sink peer is SIGKILLed mid-transfer.
#[test]
fn peer_killed_while_survivor_streams() {
    run_fault(
        "peer_killed_while_survivor_streams",
        SurvivorMode::Stream,
        PeerEnd::Killed,
        Wait::Poll,
        Ops::WritesSends,
    );
}

/// The survivor only has receives posted; the streaming peer is SIGKILLed.
#[test]
fn streaming_peer_killed_while_survivor_receives() {
    run_fault(
        "streaming_peer_killed_while_survivor_receives",
        SurvivorMode::Sink,
        PeerEnd::Killed,
        Wait::Poll,
        Ops::WritesSends,
    );
}

/// Clean close: the sink peer moves its own QP to IBV_QPS_ERR (and stays alive).
#[test]
fn peer_moves_its_qp_to_error() {
    run_fault(
        "peer_moves_its_qp_to_error",
        SurvivorMode::Stream,
        PeerEnd::QpToError,
        Wait::Poll,
        Ops::WritesSends,
    );
}

/// Clean close: the sink peer destroys its QP and exits normally.
#[test]
fn peer_exits_normally() {
    run_fault(
        "peer_exits_normally",
        SurvivorMode::Stream,
        PeerEnd::Exits,
        Wait::Poll,
        Ops::WritesSends,
    );
}

/// Clean close seen by a receiver: the streaming peer stops, waits for its
/// sends and exits normally; the survivor's posted receives are flushed.
#[test]
fn streaming_peer_exits_while_survivor_receives() {
    run_fault(
        "streaming_peer_exits_while_survivor_receives",
        SurvivorMode::Sink,
        PeerEnd::Exits,
        Wait::Poll,
        Ops::WritesSends,
    );
}

/// As `peer_killed_while_survivor_streams`, but the survivor sleeps on a
/// completion channel: the flushed WRs must generate completion events.
#[test]
fn peer_killed_while_survivor_streams_on_events() {
    run_fault(
        "peer_killed_while_survivor_streams_on_events",
        SurvivorMode::Stream,
        PeerEnd::Killed,
        Wait::Events,
        Ops::WritesSends,
    );
}

/// A receive-only survivor asleep in poll()/ibv_get_cq_event when its
/// streaming peer is killed: only the flush can wake it.
#[test]
fn streaming_peer_killed_while_survivor_sleeps_on_events() {
    run_fault(
        "streaming_peer_killed_while_survivor_sleeps_on_events",
        SurvivorMode::Sink,
        PeerEnd::Killed,
        Wait::Events,
        Ops::WritesSends,
    );
}

/// As `peer_killed_while_survivor_streams` with RDMA Reads in the stream: a
/// Read awaiting its response when the peer dies completes in error, and so
/// must every WR posted after it — the Writes behind it, whose bytes had
/// already left, included (no successful completion after the first error
/// on a queue). Whether a Read is the oldest outstanding WR at the kill is
/// timing; with 256 KiB Reads it almost always is.
#[test]
fn peer_killed_while_survivor_streams_with_reads() {
    run_fault(
        "peer_killed_while_survivor_streams_with_reads",
        SurvivorMode::Stream,
        PeerEnd::Killed,
        Wait::Poll,
        Ops::WithReads,
    );
}

/// The program compiles warning-free (needs no device and no root).
#[test]
fn faults_builds() {
    let exe = build_c_example(
        "faults",
        &out_dir(env!("CARGO_TARGET_TMPDIR")).join("build-only"),
    );
    assert!(exe.is_file());
}

#[test]
fn result_fields_are_parsed() {
    let out =
        "ok - x\nRESULT sq_posted=10 sq_ok=3 first_error_status=5\nRESULT detect_to_last_ms=1.5\n";
    assert_eq!(result_field(out, "sq_posted"), Some("10"));
    assert_eq!(result_field(out, "sq_ok"), Some("3"));
    assert_eq!(result_field(out, "detect_to_last_ms"), Some("1.5"));
    assert_eq!(result_field(out, "sq"), None);
}
