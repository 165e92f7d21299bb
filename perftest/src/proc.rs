//! Running the measured programs: each in its own process group, output to
//! log files, with a hard deadline; free ports; waiting for a server to
//! listen without connecting to it (a probe connection would be taken for
//! the client by perftest and ucx_perftest).

use std::fs::File;
use std::io::{self, Read};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// A program with its arguments and extra environment.
#[derive(Debug, Clone, PartialEq)]
pub struct Cmd {
    pub program: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

impl Cmd {
    pub fn new(program: impl Into<String>) -> Self {
        Cmd {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
        }
    }
    pub fn arg(mut self, a: impl Into<String>) -> Self {
        self.args.push(a.into());
        self
    }
    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, a: I) -> Self {
        self.args.extend(a.into_iter().map(Into::into));
        self
    }
    pub fn env(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }
    /// The command line as a shell would show it (environment first), words a shell would
    /// split or interpret quoted (`FI_PROVIDER=verbs;ofi_rxm`), so it can be pasted.
    pub fn display(&self) -> String {
        let mut parts: Vec<String> = self
            .env
            .iter()
            .map(|(k, v)| format!("{k}={}", shell_word(v)))
            .collect();
        parts.push(shell_word(&self.program));
        parts.extend(self.args.iter().map(|a| shell_word(a)));
        parts.join(" ")
    }
}

/// `w` as one shell word: as is when it has only characters no shell treats specially,
/// else in single quotes.
fn shell_word(w: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./=:,+@%".contains(c);
    if !w.is_empty() && w.chars().all(plain) {
        w.to_string()
    } else {
        format!("'{}'", w.replace('\'', "'\\''"))
    }
}

/// A started program.
pub struct Running {
    pub pid: u32,
    done: mpsc::Receiver<io::Result<ExitStatus>>,
    out: PathBuf,
    err: PathBuf,
    status: Option<io::Result<ExitStatus>>,
}

/// How a finished program ended, with what it printed.
#[derive(Debug)]
pub struct Outcome {
    pub exit: Result<ExitStatus, String>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Outcome {
    pub fn success(&self) -> bool {
        !self.timed_out && matches!(&self.exit, Ok(s) if s.success())
    }
    /// "exit status 1", "timed out after 30 s", "killed by signal 9" …
    pub fn describe(&self, timeout: Duration) -> String {
        if self.timed_out {
            return format!("timed out after {} s", timeout.as_secs());
        }
        match &self.exit {
            Ok(s) => match (s.code(), std::os::unix::process::ExitStatusExt::signal(s)) {
                (Some(c), _) => format!("exit status {c}"),
                (None, Some(sig)) => format!("killed by signal {sig}"),
                _ => "unknown exit".into(),
            },
            Err(e) => e.clone(),
        }
    }
}

/// Starts `cmd` in a new process group with stdout/stderr going to
/// `<log>.out` / `<log>.err` (the suffix is appended to the whole name).
pub fn start(cmd: &Cmd, log: &Path) -> Result<Running, String> {
    // Appended, not with_extension(): probe ids contain dots.
    let with = |ext: &str| {
        let mut s = log.as_os_str().to_owned();
        s.push(ext);
        PathBuf::from(s)
    };
    let (out, err) = (with(".out"), with(".err"));
    let create =
        |p: &Path| File::create(p).map_err(|e| format!("cannot create {}: {e}", p.display()));
    let mut c = Command::new(&cmd.program);
    c.args(&cmd.args)
        .envs(cmd.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(create(&out)?)
        .stderr(create(&err)?)
        .process_group(0);
    let child: Child = c
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", cmd.program))?;
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut child = child;
        let _ = tx.send(child.wait());
    });
    Ok(Running {
        pid,
        done: rx,
        out,
        err,
        status: None,
    })
}

/// Kills process group `pgid` (the program and whatever it forked).
fn kill_group(pgid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

fn read_lossy(p: &Path) -> String {
    let mut v = Vec::new();
    if let Ok(mut f) = File::open(p) {
        let _ = f.read_to_end(&mut v);
    }
    String::from_utf8_lossy(&v).into_owned()
}

impl Running {
    /// Has the program exited (without blocking)?
    pub fn exited(&mut self) -> bool {
        if self.status.is_none() {
            if let Ok(s) = self.done.try_recv() {
                self.status = Some(s);
            }
        }
        self.status.is_some()
    }

    /// Waits for the program to exit until `deadline`, without killing it.
    /// Returns whether it exited.
    pub fn wait_until(&mut self, deadline: Instant) -> bool {
        if self.status.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if let Ok(s) = self.done.recv_timeout(left) {
                self.status = Some(s);
            }
        }
        self.status.is_some()
    }

    /// Waits until `deadline`; kills the whole group if still running then.
    /// Always kills leftovers of the group (forked helpers) at the end.
    pub fn finish(mut self, deadline: Instant) -> Outcome {
        let mut timed_out = false;
        if self.status.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.done.recv_timeout(left) {
                Ok(s) => self.status = Some(s),
                Err(_) => {
                    timed_out = true;
                    kill_group(self.pid);
                    self.status = self.done.recv_timeout(Duration::from_secs(5)).ok();
                }
            }
        }
        kill_group(self.pid);
        let exit = match self.status.take() {
            Some(Ok(s)) => Ok(s),
            Some(Err(e)) => Err(format!("wait failed: {e}")),
            None => Err("did not die after SIGKILL".into()),
        };
        Outcome {
            exit,
            timed_out,
            stdout: read_lossy(&self.out),
            stderr: read_lossy(&self.err),
        }
    }
}

/// A TCP port that nobody listens on right now (bound then released).
pub fn free_port() -> Result<u16, String> {
    let l =
        TcpListener::bind("127.0.0.1:0").map_err(|e| format!("cannot pick a free port: {e}"))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("cannot pick a free port: {e}"))
}

/// Does /proc/net/tcp{,6} text show a socket in LISTEN on `port`?
pub fn proc_net_tcp_listens(table: &str, port: u16) -> bool {
    let want = format!("{port:04X}");
    table.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 3
            && f[3] == "0A"
            && f[1]
                .rsplit(':')
                .next()
                .is_some_and(|p| p.eq_ignore_ascii_case(&want))
    })
}

/// Waits until some socket listens on `port`, the server dies, or `limit`
/// passes. Returns whether it listens. The sockets are looked up in the server's own
/// network namespace (`/proc/PID/net/tcp`): a server started with `ip netns exec`
/// listens in another one than ours.
pub fn wait_listening(server: &mut Running, port: u16, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    let tables = [format!("/proc/{}/net/tcp", server.pid), format!("/proc/{}/net/tcp6", server.pid)];
    loop {
        let listening = tables
            .iter()
            .any(|p| proc_net_tcp_listens(&std::fs::read_to_string(p).unwrap_or_default(), port));
        if listening {
            return true;
        }
        if server.exited() || Instant::now() >= end {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `cmd` to completion (setup helpers: gcc, apt-get, uiw up).
pub fn run_capture(cmd: &Cmd, timeout: Duration, log: &Path) -> Result<Outcome, String> {
    let r = start(cmd, log)?;
    Ok(r.finish(Instant::now() + timeout))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_table() {
        let t = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:9C4F 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0\n   1: 0100007F:9C50 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 100 0 0 10 0\n";
        assert!(proc_net_tcp_listens(t, 0x9C4F));
        assert!(
            !proc_net_tcp_listens(t, 0x9C50),
            "ESTABLISHED is not LISTEN"
        );
        assert!(!proc_net_tcp_listens(t, 80));
        let t6 = "  sl  local_address                         remote_address                        st\n   0: 00000000000000000000000000000000:4E20 00000000000000000000000000000000:0000 0A 0\n";
        assert!(proc_net_tcp_listens(t6, 20000));
    }

    #[test]
    fn logs_keep_dotted_names() {
        let dir = std::env::temp_dir().join(format!("uiw-bench-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("tcp.bw.65536-rep1-client");
        let r = start(&Cmd::new("sh").args(["-c", "echo out; echo err >&2"]), &log).unwrap();
        let o = r.finish(Instant::now() + Duration::from_secs(30));
        assert!(o.success());
        assert_eq!((o.stdout.as_str(), o.stderr.as_str()), ("out\n", "err\n"));
        assert!(dir.join("tcp.bw.65536-rep1-client.out").is_file());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn display_shows_env_then_argv() {
        let c = Cmd::new("ib_write_bw")
            .args(["-d", "uiw_lo"])
            .env("BENCH_TCPCC", "cubic");
        assert_eq!(c.display(), "BENCH_TCPCC=cubic ib_write_bw -d uiw_lo");
        let c = Cmd::new("mpirun").args(["-x", "FI_PROVIDER=verbs;ofi_rxm", "it's", ""]);
        assert_eq!(c.display(), "mpirun -x 'FI_PROVIDER=verbs;ofi_rxm' 'it'\\''s' ''");
    }
}
