//! The librdmacm drop-in: its ABI against the installed rdma-core 44 library, the C checks
//! of c/cm_check.c under `uiw run`, forwarding to a stand-in system library, and the
//! unmodified rdma_cm tools of Debian 12 (rping, ucmatose, rdma_server/rdma_client,
//! perftest -R).
//!
//! Needs `cargo build --workspace` first and root (a published device). Connection tests
//! need the provider's uiw_cm.h implementation; without it they print why they skip
//! (UIW_TEST_REQUIRE_ALL=1 makes that a failure).

mod support;

use std::process::Command;
use std::time::Duration;

use support::*;
use uiw_examples::{device_lock, failures, parse_summary, Published};

const SYSTEM_RDMACM: &str = "/usr/lib/x86_64-linux-gnu/librdmacm.so.1";

/// (version node, symbol) of every function a shared object defines.
fn exported(path: &std::path::Path) -> Vec<(String, String)> {
    let o = Command::new("objdump")
        .arg("-T")
        .arg(path)
        .output()
        .expect("run objdump (binutils)");
    let mut v: Vec<(String, String)> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 7 && f[1] == "g" && f[2] == "DF" && f[3] != "*UND*")
                .then(|| (f[f.len() - 2].to_string(), f[f.len() - 1].to_string()))
        })
        .collect();
    v.sort();
    v
}

#[test]
fn exports_match_rdma_core_44() {
    let a = artifacts("exports_match_rdma_core_44");
    if !std::path::Path::new(SYSTEM_RDMACM).exists() {
        uiw_examples::skip(
            "exports_match_rdma_core_44",
            "the system librdmacm1 is not installed",
        );
        return;
    }
    let ours = exported(&a.dir.join(RDMACM_SO));
    let theirs = exported(std::path::Path::new(SYSTEM_RDMACM));
    assert!(
        theirs.len() > 60,
        "objdump found only {} functions in {SYSTEM_RDMACM}",
        theirs.len()
    );
    let missing: Vec<_> = theirs.iter().filter(|s| !ours.contains(s)).collect();
    let extra: Vec<_> = ours.iter().filter(|s| !theirs.contains(s)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "symbol/version differences:\nmissing {missing:?}\nextra {extra:?}"
    );
}

#[test]
fn soname_is_librdmacm_so_1() {
    let a = artifacts("soname_is_librdmacm_so_1");
    let o = Command::new("readelf")
        .arg("-d")
        .arg(a.dir.join(RDMACM_SO))
        .output()
        .expect("run readelf");
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.contains("Library soname: [librdmacm.so.1]"), "{s}");
    let o = Command::new("readelf")
        .arg("-V")
        .arg(a.dir.join(RDMACM_SO))
        .output()
        .expect("run readelf");
    let s = String::from_utf8_lossy(&o.stdout);
    for n in ["RDMACM_1.0", "RDMACM_1.1", "RDMACM_1.2", "RDMACM_1.3"] {
        assert!(
            s.contains(&format!("Name: {n}")),
            "version node {n} not defined:\n{s}"
        );
    }
}

#[test]
fn c_checks_build() {
    build_c("cm_check", false);
    build_c("fake_system_rdmacm", true);
}

/// `uiw run -- cm_check [-p PORT] MODE` (+ envs); all its checks must pass.
fn cm_check(test: &str, mode: &str, port: u16, needs_cm: bool, envs: &[(&str, &str)]) {
    cm_check_args(test, mode, port, needs_cm, envs, &[])
}

fn cm_check_args(
    test: &str,
    mode: &str,
    port: u16,
    needs_cm: bool,
    envs: &[(&str, &str)],
    extra: &[&str],
) {
    let a = artifacts(test);
    if !can_publish(test) || (needs_cm && !need_uiw_cm(test, &a)) {
        return;
    }
    let exe = build_c("cm_check", false);
    let _l = device_lock();
    let dev = Published::up(&a, &out_dir()).unwrap_or_else(|e| panic!("{test}: {e}"));
    let p = port.to_string();
    let mut args = vec![exe.to_str().unwrap(), "-p", &p];
    args.extend_from_slice(extra);
    args.push(mode);
    let c = spawn(&dev, &args, envs);
    let (o, timed_out) = finish(c, Duration::from_secs(120));
    let out = String::from_utf8_lossy(&o.stdout);
    println!("{}", text(&o));
    let s = parse_summary(&out).unwrap_or_else(|| {
        panic!(
            "{test}: no summary (crashed? timed out: {timed_out})\n{}",
            text(&o)
        )
    });
    assert!(
        s.failed == 0 && s.passed > 0 && o.status.success() && !timed_out,
        "{test}: {s}\n  {}\n{}",
        failures(&out).join("\n  "),
        text(&o)
    );
}

#[test]
fn channel_ids_addresses_and_bad_input() {
    cm_check(
        "channel_ids_addresses_and_bad_input",
        "channel",
        uiw_examples::pair::free_port(),
        false,
        &[],
    );
}

#[test]
fn connect_without_listener_is_rejected_econnrefused() {
    cm_check(
        "connect_without_listener_is_rejected_econnrefused",
        "nolistener",
        uiw_examples::pair::free_port(),
        false,
        &[],
    );
}

/// Ids on an address no uiw device holds (the default-route interface's, with only uiw_lo
/// published) go to the system librdmacm — here a stand-in (c/fake_system_rdmacm.c).
#[test]
fn other_devices_are_forwarded_to_the_system_library() {
    const TEST: &str = "other_devices_are_forwarded_to_the_system_library";
    let Some(ip) = default_route_netdev().and_then(|nd| netdev_ipv4(&nd)) else {
        uiw_examples::skip(
            TEST,
            "no IPv4 address on a default-route interface to stand for another device's",
        );
        return;
    };
    let fake = build_c("fake_system_rdmacm", true);
    cm_check_args(
        TEST,
        "forward",
        uiw_examples::pair::free_port(),
        false,
        &[("UIW_SYSTEM_RDMACM", fake.to_str().unwrap())],
        &["-a", &ip],
    );
}

/// The first IPv4 address of a network interface (`ip -4 -o addr show NETDEV`).
fn netdev_ipv4(nd: &str) -> Option<String> {
    let o = Command::new("ip")
        .args(["-4", "-o", "addr", "show", nd])
        .output()
        .ok()?;
    let s = String::from_utf8_lossy(&o.stdout).into_owned();
    let ip = s
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)?
        .split('/')
        .next()?
        .to_string();
    (!ip.is_empty()).then_some(ip)
}

#[test]
fn private_data_round_trip() {
    cm_check("private_data_round_trip", "pdata", uiw_examples::pair::free_port(), true, &[]);
}

/// IRD/ORD 0 offered and accepted stay 0 on both sides (not floored at 1: SPDK's
/// NVMe-oF target warns "responder_resources must be 0 but set to 1" otherwise).
#[test]
fn ird_ord_zero_honoured() {
    let port = uiw_examples::pair::free_port();
    cm_check("ird_ord_zero_honoured", "depth0", port, true, &[]);
}

/// device_cap_flags' IBV_DEVICE_MEM_MGT_EXTENSIONS is kept: IBV_WR_LOCAL_INV completes and
/// revokes the rkey for the peer.
#[test]
fn local_invalidate_revokes_the_rkey() {
    let port = uiw_examples::pair::free_port();
    cm_check("local_invalidate_revokes_the_rkey", "localinv", port, true, &[]);
}

#[test]
fn reject_with_private_data() {
    cm_check("reject_with_private_data", "reject", uiw_examples::pair::free_port(), true, &[]);
}

#[test]
fn sixty_four_simultaneous_connects() {
    cm_check("sixty_four_simultaneous_connects", "many", uiw_examples::pair::free_port(), true, &[]);
}

/// The unmodified rdma_cm tools of rdmacm-utils and perftest, client and server under
/// `uiw run` on 127.0.0.1.
fn tools(test: &str, prog: &str, server: &[&str], client: &[&str], check: impl Fn(&str, &str)) {
    let a = artifacts(test);
    if !can_publish(test) || !need_program(test, prog) || !need_uiw_cm(test, &a) {
        return;
    }
    let _l = device_lock();
    let dev = Published::up(&a, &out_dir()).unwrap_or_else(|e| panic!("{test}: {e}"));
    let (so, co) = pair(
        &dev,
        server,
        client,
        Duration::from_millis(1500),
        Duration::from_secs(180),
    );
    let (s, c) = (
        String::from_utf8_lossy(&so.stdout).into_owned(),
        String::from_utf8_lossy(&co.stdout).into_owned(),
    );
    println!(
        "=== server ===\n{}\n=== client ===\n{}",
        text(&so),
        text(&co)
    );
    check(&s, &c);
}

#[test]
fn rping_1000_verified() {
    let port = uiw_examples::pair::free_port().to_string();
    tools(
        "rping_1000_verified",
        "rping",
        &[
            "rping",
            "-s",
            "-a",
            "127.0.0.1",
            "-p",
            &port,
            "-C",
            "1000",
            "-v",
        ],
        &[
            "rping",
            "-c",
            "-a",
            "127.0.0.1",
            "-p",
            &port,
            "-C",
            "1000",
            "-v",
        ],
        |_, c| {
            let n = c
                .lines()
                .filter(|l| l.starts_with("ping data: rdma-ping-"))
                .count();
            assert_eq!(n, 1000, "client verified {n} of 1000 pings");
        },
    );
}

#[test]
fn ucmatose_one_connection() {
    let port = uiw_examples::pair::free_port().to_string();
    tools(
        "ucmatose_one_connection",
        "ucmatose",
        &["ucmatose", "-p", &port],
        &["ucmatose", "-s", "127.0.0.1", "-p", &port],
        |s, c| {
            assert!(
                s.contains("test complete") && c.contains("test complete"),
                "no 'test complete'"
            );
        },
    );
}

#[test]
fn ucmatose_ten_connections() {
    let port = uiw_examples::pair::free_port().to_string();
    tools(
        "ucmatose_ten_connections",
        "ucmatose",
        &["ucmatose", "-p", &port, "-c", "10"],
        &["ucmatose", "-s", "127.0.0.1", "-p", &port, "-c", "10"],
        |s, c| {
            assert!(
                s.contains("test complete") && c.contains("test complete"),
                "no 'test complete'"
            )
        },
    );
}

#[test]
fn rdma_server_and_client() {
    let port = uiw_examples::pair::free_port().to_string();
    tools(
        "rdma_server_and_client",
        "rdma_server",
        &["rdma_server", "-p", &port],
        &["rdma_client", "-s", "127.0.0.1", "-p", &port],
        |s, c| {
            assert!(
                s.contains("rdma_server: end 0") && c.contains("rdma_client: end 0"),
                "no 'end 0'"
            )
        },
    );
}

fn perftest(test: &str, prog: &str, port: &str) {
    tools(
        test,
        prog,
        &[prog, "-R", "-d", "uiw_lo", "-p", port, "-n", "1000"],
        &[
            prog,
            "-R",
            "-d",
            "uiw_lo",
            "-p",
            port,
            "-n",
            "1000",
            "127.0.0.1",
        ],
        |_, c| assert!(c.contains("#bytes"), "no result table"),
    );
}

#[test]
fn ib_write_bw_rdma_cm() {
    perftest("ib_write_bw_rdma_cm", "ib_write_bw", &uiw_examples::pair::free_port().to_string());
}

#[test]
fn ib_read_bw_rdma_cm() {
    perftest("ib_read_bw_rdma_cm", "ib_read_bw", &uiw_examples::pair::free_port().to_string());
}

#[test]
fn ib_send_bw_rdma_cm() {
    perftest("ib_send_bw_rdma_cm", "ib_send_bw", &uiw_examples::pair::free_port().to_string());
}

#[test]
fn ib_write_lat_rdma_cm() {
    perftest("ib_write_lat_rdma_cm", "ib_write_lat", &uiw_examples::pair::free_port().to_string());
}

/// The traffic of rping and perftest -R decodes in Wireshark's iwarp_mpa and
/// iwarp_ddp_rdmap dissectors with no malformed or expert-error frame (ci/tshark-check.sh).
#[test]
fn traffic_decodes_in_tshark() {
    const TEST: &str = "traffic_decodes_in_tshark";
    let a = artifacts(TEST);
    if !can_publish(TEST)
        || !need_program(TEST, "tshark")
        || !need_program(TEST, "rping")
        || !need_uiw_cm(TEST, &a)
    {
        return;
    }
    let _l = device_lock();
    let dev = Published::up(&a, &out_dir()).unwrap_or_else(|e| panic!("{TEST}: {e}"));
    let uiw = a.uiw.display().to_string();
    let pair = |srv: &str, cli: &str| {
        format!("( timeout 60 {uiw} run -- {srv} >/dev/null 2>&1 & sleep 1.5; timeout 60 {uiw} run -- {cli} >/dev/null 2>&1 || exit 1; wait $! ) && ")
    };
    // Free ports, never fixed ones (other test runs share the machine); the capture
    // filter names them.
    let ports: Vec<u16> = (0..4).map(|_| uiw_examples::pair::free_port()).collect();
    let mut script = String::new();
    script += &pair(
        &format!("rping -s -a 127.0.0.1 -p {} -C 20 -V", ports[0]),
        &format!("rping -c -a 127.0.0.1 -p {} -C 20 -V", ports[0]),
    );
    for (i, t) in ["ib_write_bw", "ib_read_bw", "ib_send_bw"]
        .iter()
        .enumerate()
    {
        let p = ports[i + 1];
        script += &pair(
            &format!("{t} -R -d uiw_lo -p {p} -n 50"),
            &format!("{t} -R -d uiw_lo -p {p} -n 50 127.0.0.1"),
        );
    }
    script += "true";
    let pcap = out_dir().join("rdmacm-traffic.pcap");
    let check = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ci/tshark-check.sh");
    let capture = || {
        Command::new(&check)
            .arg("-f")
            .arg(ports.iter().map(|p| format!("tcp port {p}")).collect::<Vec<_>>().join(" or "))
            .arg("-w")
            .arg(&pcap)
            .args(["--", "sh", "-c", &script])
            .env("UIW_STATE_DIR", &dev.state_dir)
            .env("UIW_LIBDIR", &a.dir)
            .output()
            .expect("run ci/tshark-check.sh")
    };
    let mut o = capture();
    println!("{}", text(&o));
    if o.status.code() == Some(3) {
        // The capture lost segments (a loaded machine) and tshark could not follow MPA past
        // the gaps: inconclusive, so once more (a decoding error in a whole capture fails).
        println!("{TEST}: the capture had gaps; capturing once more");
        o = capture();
        println!("{}", text(&o));
    }
    assert!(o.status.success(), "tshark-check failed\n{}", text(&o));
}

/// The interface of the default route (libfabric's verbs provider ignores `lo`).
fn default_route_netdev() -> Option<String> {
    let t = std::fs::read_to_string("/proc/net/route").ok()?;
    t.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 2 && f[1] == "00000000").then(|| f[0].to_string())
    })
}

/// libfabric's verbs provider (FI_EP_MSG and ofi_rxm's FI_EP_RDM) over a uiw device on the
/// default-route interface: fi_pingpong, unmodified, under `uiw run`.
#[test]
fn libfabric_verbs_fi_pingpong() {
    const TEST: &str = "libfabric_verbs_fi_pingpong";
    let a = artifacts(TEST);
    if !can_publish(TEST) || !need_program(TEST, "fi_pingpong") || !need_uiw_cm(TEST, &a) {
        return;
    }
    let Some(nd) = default_route_netdev() else {
        // Not a missing package CI could install: a host without any network interface but
        // lo. libfabric's verbs provider ignores lo, so there is nothing to run it on; this
        // test (beyond the acceptance) says so instead of failing the run.
        eprintln!("{TEST}: not run: no default-route interface (libfabric's verbs provider skips lo)");
        return;
    };
    let _l = device_lock();
    let dev = Published::up(&a, &out_dir()).unwrap_or_else(|e| panic!("{TEST}: {e}"));
    // Only the netdev's device: with uiw_lo published, "localhost" (which libfabric binds
    // to find its device) would name uiw_lo, which it skips.
    for args in [
        vec!["up", "--netdev", nd.as_str()],
        vec!["down", "--netdev", "lo"],
    ] {
        let o = dev.uiw(&args).expect("run uiw");
        assert!(o.status.success(), "uiw {args:?}: {}", text(&o));
    }
    let ip = netdev_ipv4(&nd).unwrap_or_default();
    assert!(!ip.is_empty(), "{TEST}: no IPv4 address on {nd}");
    for (prov, ep) in [("verbs", "msg"), ("verbs;ofi_rxm", "rdm")] {
        // The control port: a free one, not fi_pingpong's fixed 47592 (the machine is shared).
        let ctl = uiw_examples::pair::free_port().to_string();
        let (_, co) = pair(
            &dev,
            &["fi_pingpong", "-p", prov, "-e", ep, "-I", "100", "-B", &ctl],
            &["fi_pingpong", "-p", prov, "-e", ep, "-I", "100", "-P", &ctl, &ip],
            Duration::from_millis(1500),
            Duration::from_secs(60),
        );
        let c = String::from_utf8_lossy(&co.stdout);
        assert!(
            c.contains("=100"),
            "{prov} {ep}: no completed transfers\n{}",
            text(&co)
        );
    }
}
