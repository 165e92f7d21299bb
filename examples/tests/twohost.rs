//! Two hosts over veths and a bridge (`ci/testbed.sh`: two network namespaces, a uiw device
//! in each, nftables on the wire dropping 1% of the frames each host sends): the integrity program and
//! perftest across a real (non-loopback) netdev with loss, and a peer whose address
//! disappears in the middle of a transfer — the survivor's QP must fail, every WR flushed,
//! within the dead-peer timeout instead of hanging.

use std::ffi::OsString;
use std::time::{Duration, Instant};

use uiw_examples::pair::{Finished, Running};
use uiw_examples::testbed::{Host, Testbed};
use uiw_examples::{build_c_example, device_lock, device_test_artifacts, failures, have_program, out_dir, parse_summary, skip};

fn testbed(test: &str, opts: &[&str]) -> Option<(std::sync::MutexGuard<'static, ()>, Testbed)> {
    let artifacts = device_test_artifacts(test)?;
    for p in ["ip", "nft"] {
        if !have_program(p) && !std::path::Path::new("/usr/sbin").join(p).exists() {
            skip(test, &format!("{p} is not installed (apt-get install iproute2 nftables)"));
            return None;
        }
    }
    let lock = device_lock();
    let tb = Testbed::up(&artifacts, opts).unwrap_or_else(|e| panic!("{test}: {e}"));
    Some((lock, tb))
}


/// Runs a server on B and, once it listens on `port`, its client on A, both to completion
/// within `limit` (all of their output read).
fn pair(tb: &Testbed, server: &[OsString], client: &[OsString], port: u16, limit: Duration) -> (Finished, Finished) {
    let s = Running::spawn("server", tb.run_cmd(Host::B, server));
    tb.wait_listening_b(port, &s);
    let c = Running::spawn("client", tb.run_cmd(Host::A, client));
    let deadline = Instant::now() + limit;
    let c = c.finish(deadline);
    let s = s.finish(deadline);
    assert!(!c.timed_out && !s.timed_out, "did not finish within {limit:?}\nserver: {}\nclient: {}", s.stdout, c.stdout);
    (s, c)
}

fn os(v: &[&str]) -> Vec<OsString> {
    v.iter().map(OsString::from).collect()
}

#[test]
fn integrity_across_a_lossy_veth() {
    let Some((_l, tb)) = testbed("integrity_across_a_lossy_veth", &["--loss", "1"]) else { return };
    let exe = build_c_example("integrity", &out_dir(env!("CARGO_TARGET_TMPDIR")));
    let exe = exe.to_str().unwrap();
    let (s, c) = pair(
        &tb,
        &os(&[exe, "-s", "-p", "7471", "-d", &tb.dev]),
        &os(&[exe, "-c", &tb.addr_b, "-p", "7471", "-d", &tb.dev]),
        7471,
        Duration::from_secs(300),
    );
    for (side, r) in [("server", &s), ("client", &c)] {
        let sum = parse_summary(&r.stdout).unwrap_or_else(|| panic!("{side}: no summary\n{}\n{}", r.stdout, r.stderr));
        assert!(sum.failed == 0 && sum.passed > 2000, "{side}: {sum:?}: {:?}", failures(&r.stdout));
    }
    // The loss really happened, both ways.
    let (ab, ba) = (tb.dropped("a->b"), tb.dropped("b->a"));
    assert!(ab > 0 && ba > 0, "frames must be lost both ways: a->b {ab}, b->a {ba}");
}

#[test]
fn perftest_across_a_lossy_veth() {
    let Some((_l, tb)) = testbed("perftest_across_a_lossy_veth", &["--loss", "1"]) else { return };
    for prog in ["ib_write_bw", "ib_read_bw", "ib_send_bw"] {
        if !have_program(prog) {
            skip("perftest_across_a_lossy_veth", &format!("{prog} is not installed (apt-get install perftest)"));
            return;
        }
        let port = "7472";
        let common = ["-d", &tb.dev, "-x", "0", "-n", "1000", "-s", "65536", "-p", port];
        let mut sv = vec![prog];
        sv.extend(common);
        let mut cv = sv.clone();
        cv.push(&tb.addr_b);
        let (s, c) = pair(&tb, &os(&sv), &os(&cv), 7472, Duration::from_secs(120));
        assert!(
            c.stdout.lines().any(|l| l.split_whitespace().next() == Some("65536") && l.split_whitespace().nth(1) == Some("1000")),
            "{prog}: no result line\nclient: {}{}\nserver: {}{}",
            c.stdout,
            c.stderr,
            s.stdout,
            s.stderr
        );
    }
}

/// A peer whose address disappears in the middle of a transfer: no FIN, no RST, nothing. The
/// survivor (streaming Writes and Sends) must see its QP fail — every WR completed in error,
/// QP_FATAL — after about UIW_PEER_TIMEOUT (3 s here), not after TCP's 15 minutes; faults
/// gives up (and fails) if nothing goes wrong for 20 s.
#[test]
fn a_vanished_peer_is_detected() {
    let Some((_l, tb)) = testbed("a_vanished_peer_is_detected", &[]) else { return };
    let exe = build_c_example("faults", &out_dir(env!("CARGO_TARGET_TMPDIR")));
    let exe = exe.to_str().unwrap();
    let mut cmd = tb.run_cmd(Host::B, &[exe, "-r", "survivor", "-m", "stream", "-p", "7473", "-d", &tb.dev, "-T", "20", "-t", "20", "-L"]);
    cmd.env("UIW_PEER_TIMEOUT", "3");
    let mut s = Running::spawn("survivor", cmd);
    tb.wait_listening_b(7473, &s);
    let mut cmd = tb.run_cmd(Host::A, &[exe, "-r", "peer", "-m", "sink", "-p", "7473", "-a", "kill", "-d", &tb.dev, &tb.addr_b]);
    cmd.env("UIW_PEER_TIMEOUT", "3");
    let _peer = Running::spawn("peer", cmd);
    s.wait_for_line("STREAMING", Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}: {:?}", s.lines()));
    let cut = Instant::now();
    let o = tb.ctl(&["cut", "a"]);
    assert!(o.status.success(), "cut: {}", uiw_examples::show(&o));
    let s = s.finish(Instant::now() + Duration::from_secs(60));
    let first = s.lines.iter().find(|l| l.text.starts_with("FIRST_ERROR")).map(|l| l.at.saturating_duration_since(cut));
    println!("survivor: first error {first:?} after the cut");
    assert!(s.status.is_some_and(|st| st.success()), "survivor failed: {:?}\n{}", failures(&s.stdout), s.stdout);
    assert!(first.is_some(), "no FIRST_ERROR: {}", s.stdout);
}
