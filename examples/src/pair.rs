//! Two programs under `uiw run` at once — a server and a client, or a
//! survivor and a peer — with hard timeouts.
//!
//! Every process is started with piped stdout/stderr that reader threads
//! collect line by line, each line stamped with the [`Instant`] it arrived
//! (programs that flush per line can be timed from the outside this way).
//! Nothing here waits without a deadline: a process that outlives its
//! deadline is killed with SIGKILL, as is any process still running when its
//! [`Running`] is dropped (a failing test leaves no stray programs behind).

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fmt;
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::net::{Ipv4Addr, Ipv6Addr, TcpListener};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::Published;

/// Which output stream a [`Line`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One line of a process's output and when the harness read it.
#[derive(Debug, Clone)]
pub struct Line {
    pub at: Instant,
    pub stream: Stream,
    pub text: String,
}

#[derive(Default)]
struct Collected {
    lines: Vec<Line>,
    /// Reader threads that reached end of file.
    closed: u32,
}

/// A started process whose output is being collected.
pub struct Running {
    pub name: String,
    pub started: Instant,
    child: Child,
    status: Option<ExitStatus>,
    out: Arc<Mutex<Collected>>,
    readers: u32,
    killed_at: Option<Instant>,
}

/// `uiw run -- PROGRAM ARGS...` with `dev`'s environment (a `Command` ready
/// for [`Running::spawn`]).
pub fn uiw_run<S: AsRef<OsStr>>(
    dev: &Published,
    program: impl AsRef<OsStr>,
    args: &[S],
) -> Command {
    let mut c = dev.command();
    c.arg("run").arg("--").arg(program).args(args);
    c
}

fn reader<R: Read + Send + 'static>(src: R, stream: Stream, out: Arc<Mutex<Collected>>) {
    thread::spawn(move || {
        let mut r = BufReader::new(src);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match r.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let at = Instant::now();
                    let text = String::from_utf8_lossy(&buf)
                        .trim_end_matches(['\n', '\r'])
                        .to_string();
                    out.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .lines
                        .push(Line { at, stream, text });
                }
            }
        }
        out.lock().unwrap_or_else(|e| e.into_inner()).closed += 1;
    });
}

impl Running {
    /// Start `cmd` with piped stdout and stderr (stdin as the command says;
    /// `Published::command()` makes it /dev/null).
    pub fn spawn(name: &str, mut cmd: Command) -> Running {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let started = Instant::now();
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: cannot start {:?}: {e}", cmd.get_program()));
        let out = Arc::new(Mutex::new(Collected::default()));
        let mut readers = 0;
        if let Some(o) = child.stdout.take() {
            reader(o, Stream::Stdout, out.clone());
            readers += 1;
        }
        if let Some(e) = child.stderr.take() {
            reader(e, Stream::Stderr, out.clone());
            readers += 1;
        }
        Running {
            name: name.to_string(),
            started,
            child,
            status: None,
            out,
            readers,
            killed_at: None,
        }
    }

    /// The process's stdin, if it was started with `Stdio::piped()`.
    pub fn stdin(&mut self) -> Option<ChildStdin> {
        self.child.stdin.take()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGINT (how a capture tool is stopped so that it flushes its file), through the
    /// shell's `kill` builtin: a minimal Debian root has no procps, so no /bin/kill.
    pub fn interrupt(&self) {
        let _ = Command::new("sh")
            .args(["-c", &format!("kill -INT {}", self.pid())])
            .status();
    }

    /// The exit status if the process has ended (reaping it).
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            if let Ok(Some(s)) = self.child.try_wait() {
                self.status = Some(s);
            }
        }
        self.status
    }

    /// SIGKILL (if still running); returns the instant just before the signal.
    pub fn kill(&mut self) -> Instant {
        let at = Instant::now();
        if self.try_status().is_none() {
            let _ = self.child.kill();
            self.killed_at.get_or_insert(at);
        }
        at
    }

    /// When [`Running::kill`] signalled the process, if it did.
    pub fn killed_at(&self) -> Option<Instant> {
        self.killed_at
    }

    /// Wait until the process ends or `deadline` passes.
    pub fn wait_until(&mut self, deadline: Instant) -> Option<ExitStatus> {
        loop {
            if let Some(s) = self.try_status() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// A copy of the lines read so far.
    pub fn lines(&self) -> Vec<Line> {
        self.out
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .lines
            .clone()
    }

    /// The first stdout line containing `pat`, waiting for it until `timeout`
    /// passes or the process ends without printing it.
    pub fn wait_for_line(&mut self, pat: &str, timeout: Duration) -> Result<Line, String> {
        let deadline = Instant::now() + timeout;
        let find = |r: &Running| {
            r.lines()
                .into_iter()
                .find(|l| l.stream == Stream::Stdout && l.text.contains(pat))
        };
        loop {
            if let Some(l) = find(self) {
                return Ok(l);
            }
            if let Some(s) = self.try_status() {
                // Let the readers take in what the process printed last.
                if self.readers_done(Duration::from_millis(500)) {
                    return find(self).ok_or_else(|| {
                        format!("{} ended ({s}) without printing \"{pat}\"", self.name)
                    });
                }
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} printed no \"{pat}\" within {:?}",
                    self.name, timeout
                ));
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    fn readers_done(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.out.lock().unwrap_or_else(|e| e.into_inner()).closed >= self.readers {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            thread::sleep(Duration::from_millis(2));
        }
    }

    /// Wait for the process to end (killing it at `deadline`) and collect
    /// everything it printed.
    pub fn finish(mut self, deadline: Instant) -> Finished {
        let mut timed_out = false;
        if self.wait_until(deadline).is_none() {
            timed_out = true;
            self.kill();
            // Reap it; SIGKILL cannot be ignored.
            self.status = self.child.wait().ok();
        }
        // Output of a killed process ends at once, unless a child of it
        // inherited the pipes: do not wait for those forever.
        self.readers_done(Duration::from_secs(2));
        let lines = self.lines();
        let text = |s: Stream| {
            lines
                .iter()
                .filter(|l| l.stream == s)
                .map(|l| format!("{}\n", l.text))
                .collect::<String>()
        };
        Finished {
            name: self.name.clone(),
            status: self.status,
            timed_out,
            killed_at: self.killed_at,
            started: self.started,
            ended: Instant::now(),
            stdout: text(Stream::Stdout),
            stderr: text(Stream::Stderr),
            lines,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.try_status().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A process that has ended (or was killed) and everything it printed.
#[derive(Debug, Clone)]
pub struct Finished {
    pub name: String,
    /// `None` only if the process could not even be reaped.
    pub status: Option<ExitStatus>,
    /// It outlived its deadline and the harness killed it.
    pub timed_out: bool,
    /// When the harness sent SIGKILL, for whatever reason.
    pub killed_at: Option<Instant>,
    pub started: Instant,
    pub ended: Instant,
    pub stdout: String,
    pub stderr: String,
    pub lines: Vec<Line>,
}

impl Finished {
    /// Exited by itself with status 0.
    pub fn success(&self) -> bool {
        !self.timed_out && self.status.map(|s| s.success()).unwrap_or(false)
    }

    /// The first stdout line containing `pat`.
    pub fn line(&self, pat: &str) -> Option<&Line> {
        self.lines
            .iter()
            .find(|l| l.stream == Stream::Stdout && l.text.contains(pat))
    }
}

impl fmt::Display for Finished {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = match (self.timed_out, self.status) {
            (true, _) => "still running at the harness's deadline: killed".to_string(),
            (false, Some(s)) => s.to_string(),
            (false, None) => "unknown exit status".to_string(),
        };
        write!(
            f,
            "=== {} ({status}, ran {:.2?}) ===\n--- stdout ---\n{}--- stderr ---\n{}",
            self.name,
            self.ended.duration_since(self.started),
            self.stdout,
            self.stderr
        )
    }
}

/// Where [`free_port`] looks: below uiw's QP ports (`UIW_PORT_BASE`, 20000 and up) and
/// below the kernel's ephemeral range (32768 and up by default). A port the kernel hands out
/// as an ephemeral one can be taken, between the check and the server's `listen`, by the local
/// end of any outgoing connection (the tests make hundreds) — then `listen` fails with
/// EADDRINUSE.
pub const TEST_PORTS: std::ops::Range<u16> = 10000..20000;

/// A TCP port in [`TEST_PORTS`] nothing is bound to (on 127.0.0.1, 0.0.0.0 and ::) right
/// now, and not handed out before by this process. The search starts at a place that differs
/// between processes, so test binaries running side by side rarely try the same ports.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let given = given.get_or_insert_with(HashSet::new);
    let span = u32::from(TEST_PORTS.end - TEST_PORTS.start);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let start = (std::process::id().wrapping_mul(2_654_435_761) ^ nanos) % span;
    for i in 0..span {
        let port = TEST_PORTS.start + ((start + i) % span) as u16;
        if given.contains(&port) {
            continue;
        }
        let lo = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok();
        let any4 = lo && TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).is_ok();
        // A host without IPv6 cannot have anything listening there either.
        let any6 = any4
            && (TcpListener::bind((Ipv6Addr::UNSPECIFIED, port)).is_ok()
                || !std::path::Path::new("/proc/net/tcp6").exists());
        if any6 {
            given.insert(port);
            return port;
        }
    }
    panic!("cannot find a free TCP port in {TEST_PORTS:?}");
}

/// Is some socket in LISTEN state on TCP `port` (any address, v4 or v6)?
pub fn is_listening(port: u16) -> bool {
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        fs::read_to_string(f)
            .map(|t| {
                t.lines().skip(1).any(|l| {
                    let mut cols = l.split_whitespace();
                    let local = cols.nth(1).unwrap_or("");
                    let state = cols.nth(1).unwrap_or("");
                    state == "0A"
                        && local
                            .rsplit_once(':')
                            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
                            == Some(port)
                })
            })
            .unwrap_or(false)
    })
}

/// Wait until `port` is listening, `server` ended, or `timeout` passed.
pub fn wait_listening(server: &mut Running, port: u16, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        if is_listening(port) {
            return Ok(());
        }
        if let Some(s) = server.try_status() {
            return Err(format!(
                "{} ended ({s}) before listening on port {port}",
                server.name
            ));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{} did not listen on TCP port {port} within {timeout:?}",
                server.name
            ));
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Both sides of a finished client/server run.
pub struct PairOutcome {
    pub server: Finished,
    pub client: Finished,
    /// Why the run did not complete normally (a side never listened, or a
    /// side outlived the deadline and both were killed).
    pub problem: Option<String>,
    pub elapsed: Duration,
}

impl PairOutcome {
    /// Both exited 0 on their own.
    pub fn success(&self) -> bool {
        self.problem.is_none() && self.server.success() && self.client.success()
    }
}

impl fmt::Display for PairOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(p) = &self.problem {
            writeln!(f, "PROBLEM: {p}")?;
        }
        write!(f, "{}{}", self.server, self.client)
    }
}

/// Run a server (`server`, which listens on TCP `port` for its own
/// out-of-band exchange) and then a client (`client`), as ibv_rc_pingpong
/// and perftest are run. The client starts once the port is listening.
/// If anything is still running `timeout` after the start, both are killed
/// and the outcome says so.
pub fn run_pair(server: Command, client: Command, port: u16, timeout: Duration) -> PairOutcome {
    run_pair_with_grace(server, client, port, timeout, FAILURE_GRACE)
}

/// How long [`run_pair`] lets one side run on after the other failed (it
/// may be blocked on the dead one) before killing it.
pub const FAILURE_GRACE: Duration = Duration::from_secs(5);

/// [`run_pair`] with another grace period after a failure.
pub fn run_pair_with_grace(
    server: Command,
    client: Command,
    port: u16,
    timeout: Duration,
    grace: Duration,
) -> PairOutcome {
    let start = Instant::now();
    let deadline = start + timeout;
    let mut srv = Running::spawn("server", server);
    if let Err(e) = wait_listening(&mut srv, port, timeout) {
        let server = srv.finish(Instant::now());
        let client = Finished {
            name: "client (not started)".into(),
            status: None,
            timed_out: false,
            killed_at: None,
            started: Instant::now(),
            ended: Instant::now(),
            stdout: String::new(),
            stderr: String::new(),
            lines: Vec::new(),
        };
        return PairOutcome {
            server,
            client,
            problem: Some(e),
            elapsed: start.elapsed(),
        };
    }
    let mut cli = Running::spawn("client", client);
    // Wait for either side; when one fails, give the other a short grace
    // period (it may be blocked on the dead one) before the hard deadline.
    let mut grace_deadline = deadline;
    loop {
        let s = srv.try_status();
        let c = cli.try_status();
        if s.is_some() && c.is_some() {
            break;
        }
        let failed =
            s.map(|s| !s.success()).unwrap_or(false) || c.map(|c| !c.success()).unwrap_or(false);
        if failed && grace_deadline == deadline {
            grace_deadline = (Instant::now() + grace).min(deadline);
        }
        if Instant::now() >= grace_deadline {
            break;
        }
        thread::sleep(Duration::from_millis(5));
    }
    let now = Instant::now();
    let server = srv.finish(now);
    let client = cli.finish(now);
    let problem = if server.timed_out || client.timed_out {
        Some(format!(
            "did not finish within {:?} (hung: {}{}); killed",
            if grace_deadline < deadline {
                grace_deadline.duration_since(start)
            } else {
                timeout
            },
            if server.timed_out { "server " } else { "" },
            if client.timed_out { "client" } else { "" },
        ))
    } else {
        None
    };
    PairOutcome {
        server,
        client,
        problem,
        elapsed: start.elapsed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_port_is_not_listening_and_a_bound_one_is() {
        let port = free_port();
        assert!(!is_listening(port));
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).unwrap();
        assert!(is_listening(port));
        drop(l);
        assert_ne!(free_port(), port, "ports are not handed out twice");
    }

    /// A "server" whose port the test itself holds open.
    fn listening_server(port: u16) -> (TcpListener, Command) {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).unwrap();
        let mut server = Command::new("sh");
        server.args(["-c", "echo up; exec sleep 60"]);
        (l, server)
    }

    #[test]
    fn a_hung_pair_is_killed_at_the_deadline() {
        let port = free_port();
        let (_l, server) = listening_server(port);
        let mut client = Command::new("sleep");
        client.arg("60");
        let t = Instant::now();
        let o = run_pair(server, client, port, Duration::from_secs(2));
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "took {:?}",
            t.elapsed()
        );
        assert!(!o.success());
        assert!(o.server.timed_out && o.client.timed_out, "{o}");
        assert!(
            o.problem
                .as_deref()
                .unwrap_or("")
                .contains("did not finish"),
            "{o}"
        );
        assert!(o.server.stdout.contains("up"), "{o}");
    }

    #[test]
    fn a_failing_client_ends_the_pair_early() {
        let port = free_port();
        let (_l, server) = listening_server(port);
        let mut client = Command::new("sh");
        client.args(["-c", "echo bad >&2; exit 3"]);
        let grace = Duration::from_millis(500);
        let o = run_pair_with_grace(server, client, port, Duration::from_secs(30), grace);
        assert!(o.elapsed < Duration::from_secs(10), "{:?}", o.elapsed);
        assert_eq!(o.client.status.and_then(|s| s.code()), Some(3), "{o}");
        assert!(o.client.stderr.contains("bad"), "{o}");
        assert!(o.server.timed_out, "{o}");
        assert!(!o.success());
    }

    #[test]
    fn a_server_that_never_listens_is_reported() {
        let port = free_port();
        let mut server = Command::new("sh");
        server.args(["-c", "echo cannot >&2; exit 1"]);
        let o = run_pair(server, Command::new("true"), port, Duration::from_secs(5));
        assert!(!o.success());
        assert!(
            o.problem
                .as_deref()
                .unwrap_or("")
                .contains("before listening"),
            "{o}"
        );
        assert!(o.server.stderr.contains("cannot"), "{o}");
    }

    #[test]
    fn lines_are_collected_with_their_arrival_time() {
        let mut c = Command::new("sh");
        c.args(["-c", "echo one; sleep 0.3; echo two; echo err >&2"]);
        let mut r = Running::spawn("lines", c);
        let one = r.wait_for_line("one", Duration::from_secs(10)).unwrap();
        let f = r.finish(Instant::now() + Duration::from_secs(10));
        assert!(f.success(), "{f}");
        let two = f.line("two").expect("second line").clone();
        assert!(two.at.duration_since(one.at) >= Duration::from_millis(250));
        assert_eq!(f.stdout, "one\ntwo\n");
        assert_eq!(f.stderr, "err\n");
    }
}
