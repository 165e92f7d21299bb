//! A test bed for the raw-frame drivers' tests and benchmark (needs root, iproute2,
//! nftables, ethtool): namespaces `xdp<id>a` and `xdp<id>b`, addresses 198.51.100.1 (a: the
//! userspace TCP) and .2 (b: the kernel's TCP), each with a veth (offloads off) to a bridge
//! in a third namespace, `xdp<id>w`: the wire. Optional random loss in both directions is
//! applied there (nftables, `bridge` family, `forward` hook), after the sender's stack took
//! the frame as sent — a real loss either way. A drop in the sender's own namespace is not:
//! the kernel's TCP hears of an `output` or `egress` drop (NET_XMIT_DROP) and sends the
//! segment again later without counting a loss, and a raw socket's frames pass no hook there.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

pub const A_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
pub const B_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 2);
pub const IF: &str = "veth0";

/// The three namespaces; deleted on drop.
pub struct Bed {
    pub a: String,
    pub b: String,
    /// The wire between them: a bridge with one port toward each host (`to-a`, `to-b`).
    pub w: String,
}

fn run(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0]).args(&args[1..]).output().map_err(|e| format!("{}: {e}", args[0]))?;
    if !out.status.success() {
        return Err(format!("{}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(())
}

fn nft_in(ns: &str, script: &str) -> Result<(), String> {
    use std::io::Write;
    let mut c = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    c.stdin.take().unwrap().write_all(script.as_bytes()).map_err(|e| e.to_string())?;
    let out = c.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("nft: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(())
}

/// Whether this run may set up namespaces. Not root: a skip — unless the run demands
/// everything (`UIW_TEST_REQUIRE_ALL=1`, as ci/test.sh does as root), then a failure.
pub fn privileged(test: &str) -> bool {
    // The effective uid, from /proc.
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0")))
        .unwrap_or(false);
    let tools = ["ip", "nft", "ethtool"].iter().all(|t| Command::new(t).arg("-V").output().is_ok()
        || Command::new(t).arg("--version").output().is_ok());
    if root && tools {
        return true;
    }
    let why = if !root { "not root" } else { "ip, nft or ethtool missing (apt-get install iproute2 nftables ethtool)" };
    if std::env::var("UIW_TEST_REQUIRE_ALL").as_deref() == Ok("1") {
        panic!("{test}: cannot run ({why}) and UIW_TEST_REQUIRE_ALL=1");
    }
    eprintln!("{test}: SKIPPED: {why}");
    false
}

/// How long one privileged test body may take before it fails instead of hanging: the
/// exchanges take seconds; loss or a loaded machine stretches that, a lost wake-up never ends.
pub const WATCHDOG: std::time::Duration = std::time::Duration::from_secs(180);

/// Runs the test body `f` when [`privileged`] allows, on a thread of its own (so that
/// `netns::enter` never leaks into the test harness's threads), and fails the test if it has
/// not finished within [`WATCHDOG`]. A panic in `f` is passed on.
pub fn run_privileged(name: &str, f: impl FnOnce() + Send + 'static) {
    if !privileged(name) {
        return;
    }
    let (done, finished) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        f();
        let _ = done.send(());
    });
    match finished.recv_timeout(WATCHDOG) {
        // Finished, or panicked (the sender dropped): join to pass a panic on.
        Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            worker.join().unwrap_or_else(|e| std::panic::resume_unwind(e))
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("{name}: no result within {WATCHDOG:?}: the exchange hung")
        }
    }
}

/// A `dumpcap` running in host b on [`IF`]: every frame on the wire between the two hosts.
pub struct Capture {
    child: std::process::Child,
    /// The pcapng file it writes.
    pub path: String,
}

impl Capture {
    /// Starts the capture into `path` and returns once dumpcap has begun writing (at most
    /// 10 s), so that no frame of the exchange that follows is missed.
    pub fn start(bed: &Bed, path: &str) -> Capture {
        use std::time::{Duration, Instant};
        let _ = std::fs::remove_file(path);
        let child = Command::new("ip")
            .args(["netns", "exec", &bed.b, "dumpcap", "-q", "-i", IF, "-w", path])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("dumpcap (apt-get install tshark)");
        let t = Instant::now();
        while std::fs::metadata(path).map_or(true, |m| m.len() == 0) && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(200));
        Capture { child, path: path.to_string() }
    }

    /// Lets the last frames reach the file, then stops dumpcap (SIGINT, through the shell's
    /// `kill` builtin: a fresh Debian root may lack procps' /bin/kill) and waits for it.
    pub fn stop(mut self) -> String {
        std::thread::sleep(std::time::Duration::from_millis(300));
        let _ = Command::new("sh").args(["-c", &format!("kill -INT {}", self.child.id())]).status();
        self.child.wait().expect("wait for dumpcap");
        self.path
    }
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

impl Bed {
    /// Create the namespaces and the veth pair at `mtu`. Panics on failure (a test bed).
    pub fn new(mtu: u32) -> Bed {
        let id = format!("{}-{}", std::process::id() % 100000, SEQ.fetch_add(1, Ordering::Relaxed));
        let bed = Bed { a: format!("xdp{id}a"), b: format!("xdp{id}b"), w: format!("xdp{id}w") };
        let mtu = mtu.to_string();
        for ns in [&bed.a, &bed.b, &bed.w] {
            run(&["ip", "netns", "add", ns]).unwrap();
        }
        // The wire: no IPv6 of its own (no router or neighbour solicitations of its own on
        // the ports), a bridge without STP (forwarding as soon as a port is up).
        run(&["ip", "netns", "exec", &bed.w, "sh", "-c", "echo 1 >/proc/sys/net/ipv6/conf/all/disable_ipv6; echo 1 >/proc/sys/net/ipv6/conf/default/disable_ipv6"]).unwrap();
        run(&["ip", "-n", &bed.w, "link", "add", "br0", "mtu", &mtu, "type", "bridge", "stp_state", "0"]).unwrap();
        for (ns, port) in [(&bed.a, "to-a"), (&bed.b, "to-b")] {
            run(&["ip", "link", "add", "name", IF, "mtu", &mtu, "netns", ns, "type", "veth", "peer", "name", port, "mtu", &mtu, "netns", &bed.w]).unwrap();
            run(&["ip", "netns", "exec", &bed.w, "ethtool", "-K", port, "tx", "off", "tso", "off", "gso", "off", "gro", "off"]).unwrap();
            run(&["ip", "-n", &bed.w, "link", "set", port, "master", "br0", "up"]).unwrap();
        }
        run(&["ip", "-n", &bed.w, "link", "set", "br0", "up"]).unwrap();
        for (ns, ip) in [(&bed.a, A_IP), (&bed.b, B_IP)] {
            run(&["ip", "-n", ns, "link", "set", "lo", "up"]).unwrap();
            run(&["ip", "-n", ns, "addr", "add", &format!("{ip}/24"), "dev", IF]).unwrap();
            // Offloads off: the userspace TCP computes and checks every checksum, and GRO
            // must not merge frames beyond the MTU before a raw socket sees them.
            run(&["ip", "netns", "exec", ns, "ethtool", "-K", IF, "tx", "off", "tso", "off", "gso", "off", "gro", "off"]).unwrap();
            // The kernel may keep or adjust a feature ethtool asks to change: check what it
            // reports, before the link is up (and any frame is sent). With tx checksumming on,
            // the kernel's frames would carry unfilled (CHECKSUM_PARTIAL) checksums on the
            // wire; with it off, the kernel computes each in software before the frame reaches
            // the veth (and a capture tap) — as 0xffff when it sums to zero, see the capture
            // tests.
            let out = Command::new("ip").args(["netns", "exec", ns, "ethtool", "-k", IF]).output().unwrap();
            let feats = String::from_utf8_lossy(&out.stdout);
            for f in ["tx-checksumming: off", "tcp-segmentation-offload: off", "generic-segmentation-offload: off", "generic-receive-offload: off"] {
                assert!(feats.lines().any(|l| l.trim() == f || l.trim().starts_with(&format!("{f} "))), "{ns}: ethtool -k {IF} does not say {f:?}:\n{feats}");
            }
            run(&["ip", "-n", ns, "link", "set", IF, "up"]).unwrap();
        }
        for ns in [&bed.a, &bed.b] {
            for _ in 0..100 {
                let out = Command::new("ip").args(["-n", ns, "-o", "link", "show", IF]).output().unwrap();
                if String::from_utf8_lossy(&out.stdout).contains("state UP") {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        bed
    }

    /// Drop `pct` percent of the TCP frames in each direction at random (0 removes the
    /// rules), on the wire (see the module's comment).
    pub fn loss(&self, pct: f64) {
        let per10k = (pct * 100.0).round() as u32;
        let _ = run(&["ip", "netns", "exec", &self.w, "nft", "delete", "table", "bridge", "xdp_loss"]);
        if per10k == 0 {
            return;
        }
        let rule = |port: &str| format!("iifname \"{port}\" ip protocol tcp numgen random mod 10000 < {per10k} counter drop");
        nft_in(&self.w, &format!(
            "table bridge xdp_loss {{\n\tchain forward {{\n\t\ttype filter hook forward priority 0; policy accept;\n\
             \t\t{}\n\t\t{}\n\t}}\n}}\n",
            rule("to-a"),
            rule("to-b")
        ))
        .unwrap();
    }

    /// Frames the loss rules dropped so far (both directions).
    pub fn dropped(&self) -> u64 {
        let out = Command::new("ip").args(["netns", "exec", &self.w, "nft", "list", "table", "bridge", "xdp_loss"]).output().unwrap();
        let s = String::from_utf8_lossy(&out.stdout);
        let mut n = 0;
        for part in s.split("packets ").skip(1) {
            n += part.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        }
        n
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b, &self.w] {
            let _ = run(&["ip", "netns", "del", ns]);
        }
    }
}

/// A kernel TCP echo server in namespace `ns` on `addr` (a thread): it reads the whole stream,
/// writes it back, and returns how many bytes it echoed. Returns once it listens.
pub fn kernel_echo_server(ns: &str, addr: std::net::SocketAddrV4) -> std::thread::JoinHandle<usize> {
    use std::io::{Read, Write};
    let (tx, rx) = std::sync::mpsc::channel();
    let ns = ns.to_string();
    let server = std::thread::spawn(move || {
        crate::netns::enter(&ns).unwrap();
        let l = std::net::TcpListener::bind(addr).unwrap();
        tx.send(()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(60))).unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        s.write_all(&got).unwrap();
        got.len()
    });
    rx.recv().unwrap();
    server
}
