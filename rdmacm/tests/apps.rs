//! Real applications over uiw through the librdmacm drop-in, unmodified, under `uiw run`:
//! qperf's RC tests with `-cm 1` (connection setup by rdma_cm), and two Open MPI ranks over
//! libfabric's `verbs;ofi_rxm` running perftest/mpi/mpi_check.c.
//!
//! Needs `cargo build --workspace` first and root (a published device); a missing program
//! (`apt-get install qperf openmpi-bin libopenmpi-dev`) skips, and under UIW_TEST_REQUIRE_ALL=1 fails.

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

/// A network namespace of this test's own with a veth pair (`v0` 10.77.0.1/24, `v1`):
/// libfabric 1.17's verbs provider skips loopback netdevs, so MPI needs uiw on a
/// non-loopback one, and a namespace keeps it and its address off the host's network.
struct Netns(String);

impl Netns {
    fn new(name: String) -> Netns {
        // A namespace left by an earlier run that was killed.
        let _ = std::process::Command::new("ip").args(["netns", "del", &name]).output();
        let ns = Netns(name);
        for args in [
            vec!["netns", "add", &ns.0],
            vec!["-n", &ns.0, "link", "set", "lo", "up"],
            vec!["-n", &ns.0, "link", "add", "v0", "type", "veth", "peer", "name", "v1"],
            vec!["-n", &ns.0, "addr", "add", "10.77.0.1/24", "dev", "v0"],
            vec!["-n", &ns.0, "link", "set", "v0", "up"],
            vec!["-n", &ns.0, "link", "set", "v1", "up"],
        ] {
            let o = std::process::Command::new("ip").args(&args).output().expect("run ip (iproute2)");
            assert!(o.status.success(), "ip {args:?}: {}", text(&o));
        }
        ns
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Open MPI (Debian 12's 4.1: `--mca pml cm --mca mtl ofi`, `FI_PROVIDER="verbs;ofi_rxm"`)
/// runs two ranks of perftest/mpi/mpi_check.c over uiw: ping-pong and streaming with every
/// byte checked, allreduce results exact. The traffic went through uiw: uiw's librdmacm
/// (UIW_RDMACM_DEBUG) reports the ranks' connections accepted and established by the uiw
/// provider, and the namespace has no other RDMA device.
#[test]
fn open_mpi_two_ranks_over_verbs_ofi_rxm() {
    const TEST: &str = "open_mpi_two_ranks_over_verbs_ofi_rxm";
    let a = artifacts(TEST);
    if !can_publish(TEST)
        || !need_program(TEST, "mpicc")
        || !need_program(TEST, "mpirun")
        || !need_program(TEST, "ip")
        || !need_uiw_cm(TEST, &a)
    {
        return;
    }
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../perftest/mpi/mpi_check.c");
    std::fs::create_dir_all(out_dir()).expect("create the output directory");
    let exe = out_dir().join("mpi_check");
    let o = std::process::Command::new("mpicc")
        .args(["-O2", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("run mpicc");
    assert!(o.status.success(), "mpicc {}: {}", src.display(), text(&o));
    let _l = device_lock();
    let dev = Published::up(&a, &out_dir()).unwrap_or_else(|e| panic!("{TEST}: {e}"));
    let ns = Netns::new(format!("apps-mpi-{}", std::process::id()));
    let in_ns = |args: &[&str]| {
        let mut c = std::process::Command::new("ip");
        c.args(["netns", "exec", &ns.0]).arg(&a.uiw).args(args);
        c.env("UIW_STATE_DIR", &dev.state_dir).env("UIW_LIBDIR", &a.dir).stdin(std::process::Stdio::null());
        // The test's own choice of rxm protocol, whatever the caller's environment says.
        c.env_remove("FI_OFI_RXM_SAR_LIMIT");
        c
    };
    for args in [["up", "--netdev", "v0"], ["down", "--netdev", "lo"]] {
        let o = in_ns(&args).output().expect("run uiw in the namespace");
        assert!(o.status.success(), "uiw {args:?}: {}", text(&o));
    }
    let exe = exe.display().to_string();
    // Both of rxm's protocols above its 16 KiB eager limit: rendezvous (one RDMA Read), which
    // `uiw run` selects with FI_OFI_RXM_SAR_LIMIT=16384, and rxm's own segmentation into 16 KiB
    // Sends up to 128 KiB, which a user who sets the variable gets. rxm's log of the value it
    // read shows which one ran.
    for (how, sar) in [("uiw run's default (rendezvous)", None), ("rxm's SAR up to 128 KiB", Some("131072"))] {
        let sar_x = sar.map(|v| format!("FI_OFI_RXM_SAR_LIMIT={v}"));
        let mut args = vec![
            "run", "--", "mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2",
            "--mca", "pml", "cm", "--mca", "mtl", "ofi", "--mca", "btl", "self",
            "--mca", "oob_tcp_if_include", "v0",
            "-x", "FI_PROVIDER=verbs;ofi_rxm", "-x", "UIW_RDMACM_DEBUG=1",
            "-x", "FI_LOG_LEVEL=info", "-x", "FI_LOG_PROV=ofi_rxm",
        ];
        if let Some(x) = &sar_x {
            args.extend(["-x", x.as_str()]);
        }
        args.push(&exe);
        let mut c = in_ns(&args);
        c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        let (o, timed_out) = finish(c.spawn().expect("start mpirun"), Duration::from_secs(300));
        let out = String::from_utf8_lossy(&o.stdout);
        let err = String::from_utf8_lossy(&o.stderr);
        println!("{how}:\n{out}");
        let summary = uiw_examples::parse_summary(&out);
        assert!(
            !timed_out && o.status.success() && summary.is_some_and(|s| s.failed == 0 && s.passed >= 40),
            "{TEST}, {how}: mpirun failed (timed out: {timed_out}, summary {summary:?})\n{}",
            text(&o)
        );
        let limit = format!("sar_limit={}", sar.unwrap_or("16384"));
        assert!(
            err.lines().any(|l| l.contains("ofi_rxm") && l.ends_with(&limit)),
            "{TEST}, {how}: rxm did not report {limit}\n{}",
            text(&o)
        );
        // Proof of path: uiw's librdmacm accepted the ranks' connections and the uiw provider
        // reported their MPA exchanges (UIW_RDMACM_DEBUG, rdmacm/src/cm.rs).
        let accepted = err.lines().filter(|l| l.starts_with("uiw-rdmacm[") && l.contains(": accepted ")).count();
        let provider = err.lines().filter(|l| l.starts_with("uiw-rdmacm[") && l.contains("provider event")).count();
        println!("uiw-rdmacm: {accepted} connection(s) accepted, {provider} provider event(s)");
        assert!(accepted >= 1 && provider >= 2, "{TEST}, {how}: no trace of uiw carrying the ranks' connections\n{}", text(&o));
    }
}
