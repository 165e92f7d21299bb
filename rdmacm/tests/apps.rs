//! Real applications over uiw through the librdmacm drop-in, unmodified, under `uiw run`:
//! qperf's RC tests with `-cm 1` (connection setup by rdma_cm).
//!
//! Needs `cargo build --workspace` first and root (a published device); a missing program
//! (`apt-get install qperf`) skips, and under UIW_TEST_REQUIRE_ALL=1 fails.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::*;
use uiw_examples::pair::free_port;
use uiw_examples::{device_lock, Published};

/// Every RC test of Debian 12's qperf 0.4.11 (`qperf --help tests`), with the word its
/// result line starts with. qperf's servers for the one-sided and atomic tests create their
/// QP with `max_send_wr = 0` (a receive-only QP); the atomic tests need REMOTE_ATOMIC on
/// the rdma_cm QP; `ver_rc_*` check every returned value. `rc_bw`, `rc_bi_bw` and
/// `rc_rdma_write_bw` (Write with Immediate) send without credits: a receiver that
/// reposts late makes a Send wait for its buffer (wire `rnr_wait_ms`) instead of failing.
const QPERF_RC_TESTS: &[(&str, &str)] = &[
    ("rc_bw", "bw"),
    ("rc_bi_bw", "bw"),
    ("rc_lat", "latency"),
    ("rc_rdma_write_bw", "bw"),
    ("rc_rdma_write_lat", "latency"),
    ("rc_rdma_write_poll_lat", "latency"),
    ("rc_rdma_read_bw", "bw"),
    ("rc_rdma_read_lat", "latency"),
    ("rc_compare_swap_mr", "msg_rate"),
    ("rc_fetch_add_mr", "msg_rate"),
    ("ver_rc_compare_swap", "msg_rate"),
    ("ver_rc_fetch_add", "msg_rate"),
];

#[test]
fn qperf_rc_tests_with_rdma_cm() {
    const TEST: &str = "qperf_rc_tests_with_rdma_cm";
    let a = artifacts(TEST);
    if !can_publish(TEST) || !need_program(TEST, "qperf") || !need_uiw_cm(TEST, &a) {
        return;
    }
    let _l = device_lock();
    let dev = Published::up(&a, &out_dir()).unwrap_or_else(|e| panic!("{TEST}: {e}"));
    // -lp: qperf's own control connection; the rdma_cm port is the server's ephemeral one,
    // which it sends over that connection.
    let lp = free_port().to_string();
    let server = spawn(&dev, &["qperf", "-lp", &lp], &[("UIW_DEBUG", "1")]);
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let server = std::thread::spawn(move || finish_until(server, Duration::from_secs(600), &stop2));
    std::thread::sleep(Duration::from_millis(1500));
    let mut failed = Vec::new();
    for (t, word) in QPERF_RC_TESTS {
        let c = spawn(
            &dev,
            &["qperf", "-lp", &lp, "-cm", "1", "-t", "1", "127.0.0.1", t],
            &[("UIW_DEBUG", "1")],
        );
        let (o, timed_out) = finish(c, Duration::from_secs(60));
        let out = String::from_utf8_lossy(&o.stdout);
        // "rc_bw:\n    bw  =  1.63 GB/sec": a number after the result's name.
        let result = out.lines().find_map(|l| {
            let (k, v) = l.trim().split_once('=')?;
            (k.trim() == *word).then(|| v.split_whitespace().next()?.parse::<f64>().ok())?
        });
        let ok = !timed_out && o.status.success() && result.is_some_and(|v| v > 0.0);
        println!("{} qperf -cm 1 {t}: {}", if ok { "ok" } else { "FAILED" }, out.lines().nth(1).unwrap_or("").trim());
        if !ok {
            failed.push(format!("{t} (timed out: {timed_out})\n{}", text(&o)));
        }
    }
    // qperf's server serves until it is killed: this test's own child (`uiw run` exec()s
    // qperf, so it is that process), by its pid.
    stop.store(true, Ordering::SeqCst);
    let (so, _) = server.join().expect("qperf server waiter");
    assert!(failed.is_empty(), "{TEST}: {} of {} qperf RC tests failed:\n{}\n=== server ===\n{}", failed.len(), QPERF_RC_TESTS.len(), failed.join("\n"), text(&so));
}
