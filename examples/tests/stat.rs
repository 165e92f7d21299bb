//! Acceptance test: `uiw stat` shows the counters of a running `ib_write_bw` pair, read from
//! outside the processes, and they match what was sent.
//!
//! 1. While a timed `ib_write_bw -D` pair runs, `uiw stat qp` (a separate process) shows the
//!    client's QP with growing `tx_bytes`/`tx_msgs` and the server's with growing
//!    `rx_bytes`/`rx_msgs`, both marked live (`comm ib_write_bw`).
//! 2. After `uiw stat --prune` and an `ib_write_bw -n ITERS -s SIZE` pair, `uiw stat qp -a`
//!    shows (processes exited, QPs destroyed) exactly ITERS RDMA Writes of SIZE bytes sent
//!    by the client and received by the server, at least one FPDU per message, no
//!    Terminate, one established stream each; `uiw stat -a` sums the same per device.
//! 3. The server of a timed pair is killed mid-run: the client's QP shows one connection
//!    error and no Terminate.
//!
//! Needs `cargo build --workspace` first, root (see verbs_objects.rs) and perftest.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use uiw_examples::pair::{free_port, uiw_run, wait_listening, Running};
use uiw_examples::{device_lock, device_test_artifacts, have_program, out_dir, show, skip, Published};

/// One line of `uiw stat`: its `key value` pairs (`link` → `uiw_lo/1`, `pid` → …), and
/// the flags that stand alone (`destroyed`, `exited`).
#[derive(Debug)]
struct StatLine {
    kv: HashMap<String, String>,
    flags: Vec<String>,
}

impl StatLine {
    fn parse(line: &str) -> StatLine {
        let mut kv = HashMap::new();
        let mut flags = Vec::new();
        let w: Vec<&str> = line.split_whitespace().collect();
        let mut i = 0;
        while i < w.len() {
            if matches!(w[i], "destroyed" | "exited") {
                flags.push(w[i].to_string());
                i += 1;
            } else {
                kv.insert(w[i].to_string(), w.get(i + 1).unwrap_or(&"").to_string());
                i += 2;
            }
        }
        StatLine { kv, flags }
    }
    fn n(&self, k: &str) -> u64 {
        self.kv.get(k).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no counter {k} in {self:?}"))
    }
    fn pid(&self) -> u32 {
        self.n("pid") as u32
    }
}

fn uiw_stat(dev: &Published, args: &[&str]) -> Vec<StatLine> {
    let o = dev.uiw(std::iter::once("stat").chain(args.iter().copied())).expect("run uiw stat");
    assert!(o.status.success(), "uiw stat {args:?} failed\n{}", show(&o));
    String::from_utf8_lossy(&o.stdout).lines().map(StatLine::parse).collect()
}

fn start_pair(dev: &Published, args: &[&str]) -> (Running, Running) {
    start_tool_pair(dev, "ib_write_bw", args)
}

fn start_tool_pair(dev: &Published, tool: &str, args: &[&str]) -> (Running, Running) {
    let port = free_port();
    let p = port.to_string();
    let mut sa: Vec<&str> = vec!["-d", "uiw_lo", "-x", "0", "-p", &p];
    sa.extend_from_slice(args);
    let mut ca = sa.clone();
    ca.push("127.0.0.1");
    let mut srv = Running::spawn("server", uiw_run(dev, tool, &sa));
    wait_listening(&mut srv, port, Duration::from_secs(30)).unwrap_or_else(|e| panic!("{e}"));
    let cli = Running::spawn("client", uiw_run(dev, tool, &ca));
    (srv, cli)
}

fn finish(srv: Running, cli: Running) {
    let deadline = Instant::now() + Duration::from_secs(90);
    let (s, c) = (srv.finish(deadline), cli.finish(deadline));
    assert!(s.success() && c.success(), "perftest pair failed\n{s}{c}");
}

/// `ib_send_lat -e` waits for each message in `ibv_get_cq_event` (a blocking read of its
/// completion channel): under `uiw run` that read serves the QP's stream in the waiting
/// thread, woken by the arrival itself, instead of waiting for the progress thread to be woken
/// and to wake it (two wake-ups per message). `reader_serves` counts those services; without
/// them it stays 0 (the progress thread serves every arrival), and while the progress thread
/// also watched the stream during the sleep it won most races (about 15 %). Now the sleep
/// holds the QP and the waiting thread serves nearly every message. The run's messages all
/// arrive intact either way.
#[test]
fn a_thread_waiting_in_ibv_get_cq_event_serves_its_qp() {
    let test = "a_thread_waiting_in_ibv_get_cq_event_serves_its_qp";
    let Some(artifacts) = device_test_artifacts(test) else { return };
    if !have_program("ib_send_lat") {
        skip(test, "ib_send_lat is not installed (apt-get install perftest)");
        return;
    }
    let _lock = device_lock();
    let dev = Published::up(&artifacts, &out_dir(env!("CARGO_TARGET_TMPDIR"))).unwrap_or_else(|e| panic!("{test}: {e}"));
    let o = dev.uiw(["stat", "--prune"]).unwrap();
    assert!(o.status.success(), "{}", show(&o));
    let iters = 300u64;
    let (srv, cli) = start_tool_pair(&dev, "ib_send_lat", &["-e", "-s", "8", "-n", &iters.to_string()]);
    let (spid, cpid) = (srv.pid(), cli.pid());
    finish(srv, cli);
    let lines = uiw_stat(&dev, &["qp", "-a"]);
    for pid in [cpid, spid] {
        let l = lines.iter().find(|l| l.pid() == pid).unwrap_or_else(|| panic!("pid {pid}'s QP: {lines:?}"));
        assert!(l.n("rx_msgs") >= iters, "{l:?}");
        assert_eq!((l.n("tx_terminates"), l.n("rx_terminates"), l.n("conn_errors")), (0, 0, 0), "{l:?}");
        assert!(
            l.n("reader_serves") * 2 >= iters,
            "fewer than half the arrivals were served by the thread waiting on the channel: {l:?}"
        );
    }
}

#[test]
fn uiw_stat_counts_an_ib_write_bw_run() {
    let test = "uiw_stat_counts_an_ib_write_bw_run";
    let Some(artifacts) = device_test_artifacts(test) else { return };
    if !have_program("ib_write_bw") {
        skip(test, "ib_write_bw is not installed (apt-get install perftest)");
        return;
    }
    let _lock = device_lock();
    let dev = Published::up(&artifacts, &out_dir(env!("CARGO_TARGET_TMPDIR"))).unwrap_or_else(|e| panic!("{test}: {e}"));

    // 1. Live: a 3-second run, sampled from outside.
    let (srv, cli) = start_pair(&dev, &["-D", "3", "-s", "65536"]);
    let (spid, cpid) = (srv.pid(), cli.pid());
    let mut seen: Vec<(u64, u64)> = Vec::new(); // (client tx_bytes, server rx_bytes)
    let until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until && seen.iter().filter(|s| s.0 > 0 && s.1 > 0).count() < 3 {
        let lines = uiw_stat(&dev, &["qp"]);
        // `uiw run` execs the tool, so the tool's pid is the child's.
        let c = lines.iter().find(|l| l.pid() == cpid);
        let s = lines.iter().find(|l| l.pid() == spid);
        if let (Some(c), Some(s)) = (c, s) {
            assert_eq!((c.kv["comm"].as_str(), c.flags.len()), ("ib_write_bw", 0), "{c:?}");
            assert_eq!((c.n("rx_msgs"), s.n("tx_msgs")), (0, 0), "RDMA Writes flow one way: {c:?} {s:?}");
            seen.push((c.n("tx_bytes"), s.n("rx_bytes")));
            // Messages count with their last FPDU: at most one is part-way out.
            let (m, b) = (c.n("tx_msgs"), c.n("tx_bytes"));
            assert!(m * 65536 <= b && b < (m + 1) * 65536, "{c:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let nonzero: Vec<&(u64, u64)> = seen.iter().filter(|s| s.0 > 0 && s.1 > 0).collect();
    assert!(nonzero.len() >= 3, "uiw stat never showed the running pair's traffic: {seen:?}");
    assert!(nonzero.last().unwrap().0 > nonzero[0].0, "counters did not grow during the run: {seen:?}");
    finish(srv, cli);

    // 2. Exact: ITERS writes of SIZE bytes, read back after the processes exited.
    let o = dev.uiw(["stat", "--prune"]).unwrap();
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("removed the statistics of 2 exited"), "{}", show(&o));
    assert!(uiw_stat(&dev, &["-a"]).is_empty(), "prune left files");
    let (iters, size) = (1000u64, 65536u64);
    let (srv, cli) = start_pair(&dev, &["-n", &iters.to_string(), "-s", &size.to_string()]);
    let (spid, cpid) = (srv.pid(), cli.pid());
    finish(srv, cli);
    assert!(uiw_stat(&dev, &["qp"]).is_empty(), "exited processes are not shown without -a");
    let lines = uiw_stat(&dev, &["qp", "-a"]);
    assert_eq!(lines.len(), 2, "{lines:?}");
    let c = lines.iter().find(|l| l.pid() == cpid).expect("the client's QP");
    let s = lines.iter().find(|l| l.pid() == spid).expect("the server's QP");
    for l in [c, s] {
        assert_eq!(l.flags, vec!["exited".to_string(), "destroyed".to_string()], "{l:?}");
        assert_eq!((l.n("tx_terminates"), l.n("rx_terminates"), l.n("conn_errors")), (0, 0, 0), "{l:?}");
        assert_eq!(l.n("conn_established"), 1, "{l:?}");
    }
    assert_eq!((c.n("tx_msgs"), c.n("tx_bytes")), (iters, iters * size), "client sent: {c:?}");
    assert_eq!((s.n("rx_msgs"), s.n("rx_bytes")), (iters, iters * size), "server received: {s:?}");
    assert!(c.n("tx_fpdus") >= iters && c.n("tx_fpdus") == s.n("rx_fpdus"), "{c:?} {s:?}");
    assert_eq!((c.n("rx_msgs"), s.n("tx_msgs")), (0, 0), "{c:?} {s:?}");
    // Per device: the sum of both processes.
    let d = uiw_stat(&dev, &["-a", "-d", "uiw_lo"]);
    assert_eq!(d[0].kv["processes"], "2", "{d:?}");
    assert_eq!((d[0].n("tx_bytes"), d[0].n("rx_bytes")), (iters * size, iters * size), "{d:?}");

    // 3. A dead peer: the server is killed mid-run; the client's QP counts one failed
    //    stream (no Terminate: the peer just went away).
    dev.uiw(["stat", "--prune"]).unwrap();
    let (mut srv, mut cli) = start_pair(&dev, &["-D", "30", "-s", "65536"]);
    let (spid, cpid) = (srv.pid(), cli.pid());
    let until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until && !uiw_stat(&dev, &["qp"]).iter().any(|l| l.pid() == spid && l.n("rx_msgs") > 0) {
        std::thread::sleep(Duration::from_millis(100));
    }
    srv.kill();
    let _ = srv.wait_until(Instant::now() + Duration::from_secs(10));
    // perftest gives up on the failed QP by itself.
    let st = cli.wait_until(Instant::now() + Duration::from_secs(60));
    if st.is_none() {
        cli.kill();
    }
    let lines = uiw_stat(&dev, &["qp", "-a"]);
    let c = lines.iter().find(|l| l.pid() == cpid).unwrap_or_else(|| panic!("the client's QP: {lines:?}"));
    assert!(c.n("tx_msgs") > 0, "{c:?}");
    assert_eq!((c.n("conn_errors"), c.n("tx_terminates"), c.n("rx_terminates")), (1, 0, 0), "{c:?}");
}
