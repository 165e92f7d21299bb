//! Two hosts (`ci/testbed.sh`, as in `twohost.rs`) whose uiw devices carry their QPs over
//! uiw's userspace TCP on raw frames (`uiw up --transport xdp|packet`): unmodified
//! `ibv_rc_pingpong -g 0` and perftest's `ib_write_bw`, `ib_read_bw`, `ib_send_bw` between
//! the namespaces with xdp on both hosts, with packet on both, and with xdp on one host and
//! the kernel's TCP on the other; `integrity` between a packet host and an xdp host; a raw
//! peer killed mid-stream; rdma_cm (`rping -V`, perftest `-R`) over xdp, between xdp and the
//! kernel's TCP both ways, and from packet to xdp; at MTU 9000, the tools between xdp and the
//! kernel's TCP (with `ibv_rc_pingpong --chk` and `integrity` checking the data) and over xdp
//! on both hosts; under 1% and 5% random frame loss in both directions (`--loss`), integrity
//! and perftest between xdp and the kernel's TCP both ways round and from packet to the
//! kernel's TCP. Each run checks from the provider's own log that the raw transport was the
//! one opened.
//!
//! As root nothing here is skipped: a missing tool (ip, nft, ethtool, rdma-core's or
//! perftest's programs) fails the test. Without root the tests are skipped (or fail under
//! `UIW_TEST_REQUIRE=1`): raw sockets and XDP need CAP_NET_RAW, CAP_NET_ADMIN, CAP_BPF.

use std::ffi::OsString;
use std::time::{Duration, Instant};

use uiw_examples::pair::{Finished, Running};
use uiw_examples::testbed::{Host, Testbed};
use uiw_examples::{device_lock, device_test_artifacts, have_program, is_root, skip};

fn testbed(test: &str, opts: &[&str]) -> Option<(std::sync::MutexGuard<'static, ()>, Testbed)> {
    if !is_root() {
        skip(test, "raw-frame transports need root (CAP_NET_RAW, CAP_NET_ADMIN, CAP_BPF)");
        return None;
    }
    let artifacts = device_test_artifacts(test)?;
    for (p, pkg) in [
        ("ip", "iproute2"),
        ("nft", "nftables"),
        ("ethtool", "ethtool"),
        ("ibv_rc_pingpong", "ibverbs-utils"),
        ("ib_write_bw", "perftest"),
        ("ib_read_bw", "perftest"),
        ("ib_send_bw", "perftest"),
        ("ib_send_lat", "perftest"),
    ] {
        assert!(
            have_program(p) || std::path::Path::new("/usr/sbin").join(p).exists(),
            "{test}: {p} is not installed (apt-get install {pkg})"
        );
    }
    let lock = device_lock();
    let tb = Testbed::up(&artifacts, opts).unwrap_or_else(|e| panic!("{test}: {e}"));
    Some((lock, tb))
}


/// The names of the threads of process `pid` and of its descendants (`ci/testbed.sh run`
/// reaches the program through `ip netns exec` and `uiw run`).
fn thread_names(pid: u32) -> Vec<String> {
    let ppid = |p: u32| -> Option<u32> {
        let s = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        s[s.rfind(')')? + 2..].split_whitespace().nth(1)?.parse().ok()
    };
    let all: Vec<u32> = std::fs::read_dir("/proc").unwrap().filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    let mut tree = vec![pid];
    let mut grew = true;
    while grew {
        grew = false;
        for &p in &all {
            if !tree.contains(&p) && ppid(p).is_some_and(|pp| tree.contains(&pp)) {
                tree.push(p);
                grew = true;
            }
        }
    }
    let mut names = Vec::new();
    for p in tree {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else { continue };
        for t in tasks.flatten() {
            if let Ok(c) = std::fs::read_to_string(t.path().join("comm")) {
                names.push(c.trim().to_string());
            }
        }
    }
    names
}

fn os(v: &[&str]) -> Vec<OsString> {
    v.iter().map(OsString::from).collect()
}

/// Runs `server` on B and, once it listens on `port`, `client` on A, with the provider's
/// information messages on (they name the transport a device's QPs use); both must end
/// within 2 minutes.
fn pair(tb: &Testbed, server: &[&str], client: &[&str], port: u16) -> (Finished, Finished) {
    pair_within(tb, server, client, port, Duration::from_secs(120))
}

/// [`pair`], both ending within `limit`.
fn pair_within(tb: &Testbed, server: &[&str], client: &[&str], port: u16, limit: Duration) -> (Finished, Finished) {
    let (s, c) = pair_ran(tb, server, client, port, limit);
    assert_both_succeeded(client, &s, &c);
    (s, c)
}

/// What a program printed, both streams.
fn output(f: &Finished) -> String {
    format!("{}{}", f.stdout, f.stderr)
}

/// Both the server `s` and the client `c` (run as `client`) exited 0.
fn assert_both_succeeded(client: &[&str], s: &Finished, c: &Finished) {
    for f in [s, c] {
        assert!(f.status.is_some_and(|st| st.success()), "{client:?}: {} failed\nserver: {}\nclient: {}", f.name, output(s), output(c));
    }
}

/// The server on B and the client on A, both ending within `limit`, whatever their status.
fn pair_ran(tb: &Testbed, server: &[&str], client: &[&str], port: u16, limit: Duration) -> (Finished, Finished) {
    let mut s = tb.run_cmd(Host::B, &os(server));
    s.env("VERBS_LOG_LEVEL", "3");
    let s = Running::spawn("server", s);
    tb.wait_listening_b(port, &s);
    let mut c = tb.run_cmd(Host::A, &os(client));
    c.env("VERBS_LOG_LEVEL", "3");
    let c = Running::spawn("client", c);
    let deadline = Instant::now() + limit;
    let c = c.finish(deadline);
    let s = s.finish(deadline);
    assert!(!c.timed_out && !s.timed_out, "{client:?}: did not finish\nserver: {}\nclient: {}", output(&s), output(&c));
    (s, c)
}

/// Whether an `rping` pair failed only by rping's own exit race — one side hit it, the other
/// succeeded or hit it too. Its event thread calls `rdma_get_cm_event` again after `main`
/// destroyed the channel, and exits with status 255 ("rdma_get_cm_event: Invalid argument";
/// with the system librdmacm, EBADF). A raw transport's exit takes longer than the kernel's,
/// so the thread gets there more often (rawnet's guard, 41cb266).
fn only_rping_exit_race(s: &Finished, c: &Finished) -> bool {
    let race = |f: &Finished| f.status.is_some_and(|st| st.code() == Some(255)) && f.stderr.trim_end().ends_with("rdma_get_cm_event: Invalid argument");
    let ok = |f: &Finished| f.status.is_some_and(|st| st.success());
    (race(s) || race(c)) && (race(s) || ok(s)) && (race(c) || ok(c))
}

/// The provider said the device's QPs go over `transport` (or, for `tcp`, opened none).
fn assert_transport(side: &Finished, transport: &str) {
    let text = output(side);
    let raw = text.lines().find(|l| l.contains("QP streams go over uiw's TCP on veth0"));
    match transport {
        "tcp" => assert!(raw.is_none(), "{}: a raw transport was opened on a tcp device: {text}", side.name),
        t => {
            let l = raw.unwrap_or_else(|| panic!("{}: no raw transport was opened: {text}", side.name));
            assert!(l.contains(&format!("({t}")), "{}: not the {t} transport: {l}", side.name);
        }
    }
}

/// perftest `args` between the hosts, server on B (the client's arguments are the same, with
/// B's address added), the tool's exchange on `port`: the client must print its result line for
/// `size` bytes × `iters`, and each side must have used its transport (`transports`: A's, B's).
fn perftest_between(tb: &Testbed, args: &[&str], port: u16, size: &str, iters: &str, transports: (&str, &str)) {
    let mut cv = args.to_vec();
    cv.push(&tb.addr_b);
    let (s, c) = pair(tb, args, &cv, port);
    assert!(
        c.stdout.lines().any(|l| l.split_whitespace().next() == Some(size) && l.split_whitespace().nth(1) == Some(iters)),
        "{}: no result line\nclient: {}\nserver: {}",
        args.join(" "),
        output(&c),
        output(&s)
    );
    assert_transport(&c, transports.0);
    assert_transport(&s, transports.1);
}

/// `examples/c/integrity.c` (every operation at every size, 0 B … 8 MiB, checked on both
/// sides; RTR-connected) between the hosts, server on B, both ending within `limit`: each side
/// must report more than 2000 checks and no failure, over its transport (`transports`: A's, B's).
fn integrity_between(tb: &Testbed, limit: Duration, transports: (&str, &str)) {
    let exe = uiw_examples::build_c_example("integrity", &uiw_examples::out_dir(env!("CARGO_TARGET_TMPDIR")));
    let exe = exe.to_str().unwrap();
    let (s, c) = pair_within(tb, &[exe, "-s", "-p", "7476", "-d", &tb.dev], &[exe, "-c", &tb.addr_b, "-p", "7476", "-d", &tb.dev], 7476, limit);
    for r in [&s, &c] {
        let sum = uiw_examples::parse_summary(&r.stdout).unwrap_or_else(|| panic!("{}: no summary\n{}", r.name, output(r)));
        assert!(sum.failed == 0 && sum.passed > 2000, "{}: {sum:?}: {:?}", r.name, uiw_examples::failures(&r.stdout));
    }
    assert_transport(&c, transports.0);
    assert_transport(&s, transports.1);
}

/// `ibv_rc_pingpong -g 0` and the three perftest bandwidth tests, A (client) to B (server).
fn tools(test: &str, opts: &[&str], transport_a: &str, transport_b: &str) {
    let Some((_l, tb)) = testbed(test, opts) else { return };
    let dev = tb.dev.clone();
    let (s, c) = pair(
        &tb,
        &["ibv_rc_pingpong", "-d", &dev, "-g", "0", "-n", "200"],
        &["ibv_rc_pingpong", "-d", &dev, "-g", "0", "-n", "200", &tb.addr_b],
        18515,
    );
    for r in [&s, &c] {
        assert!(r.stdout.contains("200 iters in"), "ibv_rc_pingpong {}: no result\n{}", r.name, output(r));
    }
    assert_transport(&c, transport_a);
    assert_transport(&s, transport_b);
    for prog in ["ib_write_bw", "ib_read_bw", "ib_send_bw"] {
        let args = [prog, "-d", &dev, "-x", "0", "-n", "300", "-s", "65536", "-p", "7472"];
        perftest_between(&tb, &args, 7472, "65536", "300", (transport_a, transport_b));
    }
}

#[test]
fn tools_over_xdp_on_both_hosts() {
    tools("tools_over_xdp_on_both_hosts", &["--transport", "xdp"], "xdp", "xdp");
}

#[test]
fn tools_over_packet_on_both_hosts() {
    tools("tools_over_packet_on_both_hosts", &["--transport", "packet"], "packet", "packet");
}

#[test]
fn tools_between_xdp_and_kernel_tcp() {
    tools("tools_between_xdp_and_kernel_tcp", &["--transport-a", "xdp", "--transport-b", "tcp"], "xdp", "tcp");
}

/// rdma_cm over the raw transports (issue 12): the librdmacm drop-in listens and connects
/// through the provider (`uiw_cm.h` v2) over the device's own transport, so unmodified
/// `rping -V` (every ping's data checked) and perftest with `-R` connect as over the kernel's
/// TCP. Both programs use their default ports (rping 7174, perftest 18515), outside uiw's
/// steered range: the transport steers a listener's port for it. Before v2 the provider
/// refused the drop-in's kernel sockets with EOPNOTSUPP.
fn rdma_cm_tools(test: &str, opts: &[&str], transport_a: &str, transport_b: &str) {
    let Some((_l, tb)) = testbed(test, opts) else { return };
    assert!(have_program("rping"), "{test}: rping is not installed (apt-get install rdmacm-utils)");
    let dev = tb.dev.clone();
    let server = ["rping", "-s", "-a", &tb.addr_b, "-V", "-C", "10"];
    let client = ["rping", "-c", "-a", &tb.addr_b, "-V", "-C", "10", "-v"];
    let mut ran = pair_ran(&tb, &server, &client, 7174, Duration::from_secs(120));
    if only_rping_exit_race(&ran.0, &ran.1) {
        // rping's race, not uiw's: once more (a second hit fails below).
        eprintln!("{test}: rping hit its own exit race (rdma_get_cm_event after the channel's destroy); once more");
        ran = pair_ran(&tb, &server, &client, 7174, Duration::from_secs(120));
    }
    let (s, c) = ran;
    assert_both_succeeded(&client, &s, &c);
    let pings = c.stdout.lines().filter(|l| l.starts_with("ping data: rdma-ping-")).count();
    assert_eq!(pings, 10, "rping: {pings} of 10 pings\nclient: {}\nserver: {}", output(&c), output(&s));
    assert_transport(&c, transport_a);
    assert_transport(&s, transport_b);
    for (prog, size, qps) in [("ib_write_bw", "65536", "4"), ("ib_read_bw", "65536", "4"), ("ib_send_lat", "4096", "1")] {
        let mut common = vec![prog, "-R", "-d", &dev, "-n", "200", "-s", size];
        if qps != "1" {
            // perftest takes -q in its bandwidth tests only
            common.extend(["-q", qps]);
        }
        let iters = if qps == "4" { "800" } else { "200" };
        perftest_between(&tb, &common, 18515, size, iters, (transport_a, transport_b));
    }
    // Every program exited normally: no nftables guard of a raw transport is left behind to
    // keep the kernel's TCP off the ports (perftest's own exchange uses 18515 too). A program
    // starts the guard's removal as it exits and does not wait for it (rawnet's guard): give
    // that `nft` a few seconds on a loaded machine.
    for host in ["a", "b"] {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let o = tb.ctl(&["exec", host, "nft", "list", "tables"]);
            let tables = String::from_utf8_lossy(&o.stdout).to_string();
            if !tables.contains("uiw_rawnet") {
                break;
            }
            assert!(Instant::now() < deadline, "host {host}: a raw transport's guard outlived its program by 10 s: {tables}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn rdma_cm_over_xdp_on_both_hosts() {
    rdma_cm_tools("rdma_cm_over_xdp_on_both_hosts", &["--transport", "xdp"], "xdp", "xdp");
}

/// The xdp host connects to a kernel-TCP host's listener.
#[test]
fn rdma_cm_from_xdp_to_kernel_tcp() {
    rdma_cm_tools("rdma_cm_from_xdp_to_kernel_tcp", &["--transport-a", "xdp", "--transport-b", "tcp"], "xdp", "tcp");
}

/// A kernel-TCP host connects to the xdp host's listener.
#[test]
fn rdma_cm_from_kernel_tcp_to_xdp() {
    rdma_cm_tools("rdma_cm_from_kernel_tcp_to_xdp", &["--transport-a", "tcp", "--transport-b", "xdp"], "tcp", "xdp");
}

#[test]
fn rdma_cm_from_packet_to_xdp() {
    rdma_cm_tools("rdma_cm_from_packet_to_xdp", &["--transport-a", "packet", "--transport-b", "xdp"], "packet", "xdp");
}

/// A raw-transport peer killed in the middle of a transfer: its XDP socket and program go
/// with it, nothing answers for its address and ports any more (no FIN, no RST). The
/// survivor, streaming Writes and Sends over xdp, must see its QP fail — every WR completed
/// in error, QP_FATAL — after about UIW_PEER_TIMEOUT (3 s here: the userspace TCP's
/// retransmissions give up then), not after utcp's default of minutes; `faults` fails if
/// nothing goes wrong for 20 s.
#[test]
fn a_killed_raw_peer_is_detected() {
    let test = "a_killed_raw_peer_is_detected";
    let Some((_l, tb)) = testbed(test, &["--transport", "xdp"]) else { return };
    let exe = uiw_examples::build_c_example("faults", &uiw_examples::out_dir(env!("CARGO_TARGET_TMPDIR")));
    let exe = exe.to_str().unwrap();
    let mut cmd = tb.run_cmd(Host::B, &[exe, "-r", "survivor", "-m", "stream", "-p", "7475", "-d", &tb.dev, "-T", "20", "-t", "20", "-L"]);
    cmd.env("UIW_PEER_TIMEOUT", "3");
    let mut s = Running::spawn("survivor", cmd);
    tb.wait_listening_b(7475, &s);
    let mut cmd = tb.run_cmd(Host::A, &[exe, "-r", "peer", "-m", "sink", "-p", "7475", "-a", "kill", "-d", &tb.dev, &tb.addr_b]);
    cmd.env("UIW_PEER_TIMEOUT", "3");
    let mut peer = Running::spawn("peer", cmd);
    s.wait_for_line("STREAMING", Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}: {:?}", s.lines()));
    // The xdp transport has no thread of its own: the provider's progress thread waits on
    // the AF_XDP socket itself (issue 12's polling model; an arriving frame used to wake a
    // `uiw-rawnet` thread, which then woke the progress thread).
    let threads = thread_names(s.pid());
    assert!(threads.iter().any(|t| t == "uiw-progress"), "the survivor's threads: {threads:?}");
    assert!(!threads.iter().any(|t| t == "uiw-rawnet"), "a transport thread between the socket and the QPs: {threads:?}");
    let killed = peer.kill();
    let s = s.finish(Instant::now() + Duration::from_secs(60));
    let first = s.lines.iter().find(|l| l.text.starts_with("FIRST_ERROR")).map(|l| l.at.saturating_duration_since(killed));
    println!("survivor: first error {first:?} after the kill");
    assert!(s.status.is_some_and(|st| st.success()), "survivor failed: {:?}\n{}", uiw_examples::failures(&s.stdout), s.stdout);
    assert!(first.is_some(), "no FIRST_ERROR: {}", s.stdout);
}

/// `examples/c/integrity.c` (every operation at every size, 0 B … 8 MiB, checked on both
/// sides; RTR-connected, no rdma_cm) between a packet host and an xdp host.
#[test]
fn integrity_between_packet_and_xdp() {
    let test = "integrity_between_packet_and_xdp";
    let Some((_l, tb)) = testbed(test, &["--transport-a", "packet", "--transport-b", "xdp"]) else { return };
    integrity_between(&tb, Duration::from_secs(120), ("packet", "xdp"));
}

/// MTU 9000 (issue 12): an xdp host and a kernel-TCP host over a 9000-byte link. The xdp
/// host's TCP announces MSS 8960, so its full segments take three 4 KiB UMEM chunks each
/// (AF_XDP multi-buffer), and so do the kernel's segments it receives. `ibv_rc_pingpong -s
/// 16384 --chk` and `integrity` check every byte; `ib_send_bw`/`ib_write_bw` at 64 KiB move
/// bulk. nftables counters in host B prove the frames were jumbo: the xdp host's SYNs
/// announced MSS 8960 (not the 3786 of a stack clamped to one chunk), and B's kernel received
/// frames larger than 4096 bytes from it (B's veth has GRO off: one count per wire frame).
#[test]
fn tools_between_xdp_and_kernel_tcp_at_mtu_9000() {
    let test = "tools_between_xdp_and_kernel_tcp_at_mtu_9000";
    let Some((_l, tb)) = testbed(test, &["--transport-a", "xdp", "--transport-b", "tcp", "--mtu", "9000"]) else { return };
    let dev = tb.dev.clone();
    // Only uiw's own connections (source ports in its range), not the tools' out-of-band
    // exchanges over A's kernel TCP, which announces 8960 too.
    let from_a = format!("ip saddr {} tcp sport 20000-24095", tb.addr_a);
    for cmd in [
        "add table inet uiw_mtu_probe".to_string(),
        "add chain inet uiw_mtu_probe rx { type filter hook input priority 0 ; }".to_string(),
        format!("add rule inet uiw_mtu_probe rx {from_a} tcp option maxseg size 8960 counter comment \"mss\""),
        format!("add rule inet uiw_mtu_probe rx {from_a} meta length > 4096 counter comment \"jumbo\""),
    ] {
        let mut args = vec!["exec", "b", "nft"];
        args.extend(cmd.split(' '));
        let o = tb.ctl(&args);
        assert!(o.status.success(), "nft {cmd}: {}", String::from_utf8_lossy(&o.stderr));
    }
    let (s, c) = pair(
        &tb,
        &["ibv_rc_pingpong", "-d", &dev, "-g", "0", "-n", "200", "-s", "16384", "-c"],
        &["ibv_rc_pingpong", "-d", &dev, "-g", "0", "-n", "200", "-s", "16384", "-c", &tb.addr_b],
        18515,
    );
    for r in [&s, &c] {
        assert!(r.stdout.contains("200 iters in"), "ibv_rc_pingpong {}: no result\n{}", r.name, output(r));
    }
    assert_transport(&c, "xdp");
    assert_transport(&s, "tcp");
    for prog in ["ib_send_bw", "ib_write_bw"] {
        let args = [prog, "-d", &dev, "-x", "0", "-n", "300", "-s", "65536", "-p", "7472"];
        perftest_between(&tb, &args, 7472, "65536", "300", ("xdp", "tcp"));
    }
    integrity_between(&tb, Duration::from_secs(120), ("xdp", "tcp"));
    let o = tb.ctl(&["exec", "b", "nft", "list", "table", "inet", "uiw_mtu_probe"]);
    let table = String::from_utf8_lossy(&o.stdout).to_string();
    let count = |tag: &str| -> u64 {
        let line = table.lines().find(|l| l.contains(&format!("comment \"{tag}\""))).unwrap_or_else(|| panic!("no {tag} rule: {table}"));
        let w: Vec<&str> = line.split_whitespace().collect();
        let at = w.iter().position(|&x| x == "packets").unwrap_or_else(|| panic!("no counter: {line}"));
        w[at + 1].parse().unwrap()
    };
    println!("host B's counters: {table}");
    assert!(count("mss") > 0, "the xdp host's connections did not announce MSS 8960: {table}");
    assert!(count("jumbo") > 1000, "few frames over 4096 bytes from the xdp host: {table}");
}

/// MTU 9000 with the userspace TCP at both ends: each host's multi-buffer chains are the
/// other's received frames.
#[test]
fn tools_over_xdp_on_both_hosts_at_mtu_9000() {
    tools("tools_over_xdp_on_both_hosts_at_mtu_9000", &["--transport", "xdp", "--mtu", "9000"], "xdp", "xdp");
}

/// A counter of the kernel's TCP (`nstat`) in `host`'s namespace.
fn nstat(tb: &Testbed, host: &str, name: &str) -> u64 {
    let o = tb.ctl(&["exec", host, "nstat", "-az", "--json", name]);
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    let at = text.find(&format!("\"{name}\":")).unwrap_or_else(|| panic!("nstat {name}: {text}"));
    text[at + name.len() + 3..].trim_start().split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

/// Issue 12, loss: host A on transport `ta`, host B on `tb_` (at least one raw), with `loss`
/// percent of the frames each sends dropped at random on the wire between them
/// (`ci/testbed.sh --loss`: the bridge's forward hook, after the sender took each frame as
/// sent, so a kernel TCP must repair its losses as a raw host must). `integrity` (every
/// operation at every size, checked on both sides) when `with_integrity`, then perftest's
/// Send, Write and Read at 64 KiB over two QPs, A the client. Every transfer must complete;
/// the loss rules' counters must show frames dropped in both directions. With a kernel-TCP
/// host, that host must also have retransmitted (TcpRetransSegs: what it lost toward the raw
/// host) and queued segments out of order (TcpExtTCPOFOQueue: holes in what the raw host
/// sent, which only the userspace TCP's retransmissions can have filled, since every byte
/// arrived).
fn under_loss(test: &str, ta: &str, tb_: &str, loss: &str, with_integrity: bool) {
    let started = Instant::now();
    let Some((_l, tb)) = testbed(test, &["--transport-a", ta, "--transport-b", tb_, "--loss", loss]) else { return };
    let dev = tb.dev.clone();
    if with_integrity {
        let t = Instant::now();
        // 18 s at 1 % loss here, 150 s at 5 % (each lost small message's repair waits for a
        // probe or an RTO on one side or the other, some 2 000 of them).
        let limit = Duration::from_secs(if loss == "1" { 120 } else { 600 });
        integrity_between(&tb, limit, (ta, tb_));
        println!("{test}: integrity in {:?}", t.elapsed());
    }
    for prog in ["ib_send_bw", "ib_write_bw", "ib_read_bw"] {
        let args = [prog, "-d", &dev, "-x", "0", "-q", "2", "-n", "100", "-s", "65536", "-p", "7472"];
        let t = Instant::now();
        perftest_between(&tb, &args, 7472, "65536", "200", (ta, tb_));
        println!("{test}: {prog} in {:?}", t.elapsed());
    }
    let (ab, ba) = (tb.dropped("a->b"), tb.dropped("b->a"));
    println!("{test}: dropped a->b {ab}, b->a {ba}; {:?} in all", started.elapsed());
    assert!(ab > 0 && ba > 0, "frames must be lost both ways: a->b {ab}, b->a {ba}");
    let (kernel_host, raw) = match (ta, tb_) {
        ("tcp", raw) => ("a", raw),
        (raw, "tcp") => ("b", raw),
        _ => return,
    };
    let retrans = nstat(&tb, kernel_host, "TcpRetransSegs");
    let ofo = nstat(&tb, kernel_host, "TcpExtTCPOFOQueue");
    println!("{test}: host {kernel_host} (kernel TCP): TcpRetransSegs {retrans}, TcpExtTCPOFOQueue {ofo}");
    assert!(retrans > 0, "the kernel host retransmitted nothing toward the {raw} host");
    assert!(ofo > 0, "the kernel host saw no hole in what the {raw} host sent");
}

/// `loss_test!(name, transport_a, transport_b, percent, with_integrity)`: a test that runs
/// [`under_loss`] under its own name.
macro_rules! loss_test {
    ($(#[$m:meta])* $name:ident, $ta:literal, $tb:literal, $pct:literal, $integrity:literal) => {
        $(#[$m])*
        #[test]
        fn $name() {
            under_loss(stringify!($name), $ta, $tb, $pct, $integrity);
        }
    };
}

loss_test!(loss_1pct_from_xdp_to_kernel_tcp, "xdp", "tcp", "1", true);
loss_test!(loss_1pct_from_kernel_tcp_to_xdp, "tcp", "xdp", "1", true);
loss_test!(loss_5pct_from_xdp_to_kernel_tcp, "xdp", "tcp", "5", false);
loss_test!(loss_5pct_from_kernel_tcp_to_xdp, "tcp", "xdp", "5", false);
loss_test!(loss_5pct_from_packet_to_kernel_tcp, "packet", "tcp", "5", false);

loss_test!(
    /// `integrity` at 5% loss passes but takes about 2.5 minutes here (8 s without loss, 18 s
    /// at 1%; 6 minutes before the userspace TCP had a tail loss probe): a lone lost segment —
    /// the only one of a small message — still waits for the 200 ms RTO (the probe waits for a
    /// possible delayed ACK first, RFC 8985 §7.2), and the kernel's side pays the same. Too long
    /// for every test run: run it with `--ignored`.
    #[ignore = "about 2.5 minutes: integrity's small messages, each lost one repaired by an RTO"]
    loss_5pct_integrity_from_xdp_to_kernel_tcp, "xdp", "tcp", "5", true
);

loss_test!(
    /// Two raw hosts under loss: the wire drops what each userspace TCP sends, and each must
    /// repair what the other lost.
    loss_5pct_between_xdp_and_packet, "xdp", "packet", "5", false
);
