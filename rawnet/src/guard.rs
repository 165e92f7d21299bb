//! Keep the kernel out of uiw's flows on the AF_PACKET path.
//!
//! An AF_PACKET socket receives a *copy* of each frame; the kernel still processes the
//! original, finds no socket for uiw's port and answers with RST (RFC 9293 §3.10.7.1),
//! killing the flow. [`RstGuard`] installs an nftables table in the current network
//! namespace that drops IPv4/TCP to uiw's address and port range arriving on the interface,
//! at the input hook — after the AF_PACKET tap has seen it — and removes the table when
//! dropped. (The AF_XDP path needs none: its XDP program redirects those frames before the
//! kernel's stack sees them.)

use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

/// The nftables table, removed on drop — and when the process exits (see [`at_exit`]).
#[derive(Debug)]
pub struct RstGuard {
    table: String,
}

/// The tables this process installed and has not removed, and its pid (a forked child that
/// exits must not remove its parent's tables).
static LIVE: std::sync::Mutex<Vec<(String, u32)>> = std::sync::Mutex::new(Vec::new());

/// `atexit` handler: a process that exits without dropping its transport (an rdma_cm
/// application keeps its devices open to the end, as librdmacm does) removes its tables, so
/// that the kernel's TCP gets the ports back. A killed process still leaves them, until the
/// next raw transport on the interface replaces them.
///
/// The `nft` that removes them is started, not waited for: it takes some 20 ms, which would
/// be added to every such process's exit, while the application's other threads still run.
/// rping's event thread goes back to `rdma_get_cm_event` after the channel it reads was
/// destroyed, and exits with an error when it gets there before the process has ended — a
/// race of rping's that the real librdmacm's near-instant exit hides, and this wait widened
/// (2 server failures in 61 runs on a loaded machine). No table of this process can be
/// installed after its exit, so nothing needs the removal to have finished.
extern "C" fn at_exit() {
    let Ok(live) = LIVE.try_lock() else { return };
    for (table, pid) in live.iter() {
        if *pid == std::process::id() {
            let _ = Command::new("nft")
                .args(["delete", "table", "ip", table])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn();
        }
    }
}

fn register(table: &str) {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let _ = uiw_kabi::raw::at_exit(at_exit);
    });
    if let Ok(mut live) = LIVE.lock() {
        live.push((table.to_string(), std::process::id()));
    }
}

fn unregister(table: &str) {
    if let Ok(mut live) = LIVE.lock() {
        live.retain(|(t, pid)| !(t == table && *pid == std::process::id()));
    }
}

/// The set of the table's further ports (see [`RstGuard::add`]).
const EXTRA_SET: &str = "extra";

fn nft(script: Option<&str>, args: &[&str]) -> io::Result<()> {
    let mut c = Command::new("nft");
    c.args(args).stdin(if script.is_some() { Stdio::piped() } else { Stdio::null() });
    c.stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = c.spawn().map_err(|e| {
        io::Error::new(e.kind(), format!("cannot run nft (apt-get install nftables): {e}"))
    })?;
    if let (Some(s), Some(mut stdin)) = (script, child.stdin.take()) {
        stdin.write_all(s.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("nft {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()),
        ));
    }
    Ok(())
}

impl RstGuard {
    /// Drop TCP to `ip`:`ports` arriving on `ifname` before the kernel's TCP sees it.
    pub fn install(ifname: &str, ip: Ipv4Addr, ports: (u16, u16)) -> io::Result<RstGuard> {
        if !ifname.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "bad interface name"));
        }
        let table = format!("uiw_rawnet_{}", ifname.replace(['-', '.'], "_"));
        let _ = nft(None, &["delete", "table", "ip", &table]);
        let script = format!(
            "table ip {table} {{\n\
             \tset {EXTRA_SET} {{\n\
             \t\ttype inet_service;\n\
             \t}}\n\
             \tchain input {{\n\
             \t\ttype filter hook input priority -300; policy accept;\n\
             \t\tiifname \"{ifname}\" ip daddr {ip} tcp dport {}-{} drop\n\
             \t\tiifname \"{ifname}\" ip daddr {ip} tcp dport @{EXTRA_SET} drop\n\
             \t}}\n\
             }}\n",
            ports.0, ports.1
        );
        nft(Some(&script), &["-f", "-"])?;
        register(&table);
        Ok(RstGuard { table })
    }
}

impl RstGuard {
    /// Drop TCP to `port` as well (a port outside the range that a listener of the stack
    /// uses: rdma_cm's).
    pub fn add(&self, port: u16) -> io::Result<()> {
        nft(None, &["add", "element", "ip", &self.table, EXTRA_SET, &format!("{{ {port} }}")])
    }

    /// No longer drop TCP to `port` (added with [`RstGuard::add`]).
    pub fn remove(&self, port: u16) -> io::Result<()> {
        nft(None, &["delete", "element", "ip", &self.table, EXTRA_SET, &format!("{{ {port} }}")])
    }
}

impl Drop for RstGuard {
    fn drop(&mut self) {
        unregister(&self.table);
        let _ = nft(None, &["delete", "table", "ip", &self.table]);
    }
}
