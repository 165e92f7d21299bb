//! Two hosts for a test: `ci/testbed.sh` (two network namespaces, each with a veth to a
//! bridge in a third, the wire, a uiw
//! device `uiw_veth0` published in each), torn down on drop. Needs root, iproute2 and
//! nftables.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::{show, workspace_root, Artifacts};

/// A running two-host testbed.
pub struct Testbed {
    pub prefix: String,
    pub addr_a: String,
    pub addr_b: String,
    /// The uiw device on both hosts.
    pub dev: String,
    script: PathBuf,
}

/// Which host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Host {
    A,
    B,
}

impl Host {
    fn arg(self) -> &'static str {
        match self {
            Host::A => "a",
            Host::B => "b",
        }
    }
}

impl Testbed {
    /// `ci/testbed.sh up` with a prefix unique to this process and call, and `opts`
    /// (`--loss 1`, `--mtu 9000`, ...).
    pub fn up(artifacts: &Artifacts, opts: &[&str]) -> Result<Testbed, String> {
        static N: AtomicU32 = AtomicU32::new(0);
        let prefix = format!("uiwt{}x{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
        let script = workspace_root().join("ci/testbed.sh");
        let out = Command::new(&script)
            .args(["-p", &prefix, "up", "--uiw"])
            .arg(&artifacts.uiw)
            .args(opts)
            .env("UIW_LIBDIR", &artifacts.dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("run {}: {e}", script.display()))?;
        let tb = Testbed {
            prefix,
            addr_a: "198.51.100.1".into(),
            addr_b: "198.51.100.2".into(),
            dev: "uiw_veth0".into(),
            script,
        };
        if !out.status.success() {
            return Err(format!("ci/testbed.sh up failed ({})\n{}", out.status, show(&out)));
        }
        Ok(tb)
    }

    /// `ci/testbed.sh run HOST -- PROGRAM...`: the program under `uiw run` on that host.
    pub fn run_cmd<S: AsRef<OsStr>>(&self, host: Host, program: &[S]) -> Command {
        let mut c = Command::new(&self.script);
        c.args(["-p", &self.prefix, "run", host.arg(), "--"]).args(program).stdin(Stdio::null());
        c
    }

    /// The frames the testbed's loss rule for `dir` ("a->b" or "b->a") dropped so far, on the
    /// wire (`ci/testbed.sh loss`: the bridge's forward hook in the third namespace). Panics
    /// unless exactly one such rule exists.
    pub fn dropped(&self, dir: &str) -> u64 {
        let o = self.ctl(&["exec", "w", "nft", "list", "ruleset"]);
        let text = String::from_utf8_lossy(&o.stdout).to_string();
        let found: Vec<u64> = text
            .lines()
            .filter(|l| l.contains(&format!("comment \"loss {dir}\"")))
            .map(|line| {
                let w: Vec<&str> = line.split_whitespace().collect();
                let at = w.iter().position(|&x| x == "packets").unwrap_or_else(|| panic!("no counter: {line}"));
                w[at + 1].parse::<u64>().unwrap()
            })
            .collect();
        assert_eq!(found.len(), 1, "one loss rule for {dir}, not {found:?}\n{text}");
        found[0]
    }

    /// `ci/testbed.sh SUBCOMMAND ARGS...` (`loss`, `cut`, `restore`, `exec`), to completion.
    pub fn ctl(&self, args: &[&str]) -> Output {
        Command::new(&self.script)
            .args(["-p", &self.prefix])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", self.script.display()))
    }

    /// Waits until something on host B listens on TCP `port` (a tool's out-of-band exchange,
    /// over the kernel's TCP whatever the device's transport); `s` is that tool, whose output
    /// the failure shows.
    pub fn wait_listening_b(&self, port: u16, s: &crate::pair::Running) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let o = self.ctl(&["exec", "b", "ss", "-Hltn", &format!("sport = :{port}")]);
            if !String::from_utf8_lossy(&o.stdout).trim().is_empty() {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "nothing listens on {port} on host B: {:?}", s.lines());
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        let _ = Command::new(&self.script).args(["-p", &self.prefix, "down"]).stdin(Stdio::null()).output();
    }
}
