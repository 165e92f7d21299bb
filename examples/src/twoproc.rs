//! Two example programs side by side — a server and its client — each under
//! `uiw run`, as two separate processes with their own uiw engine, which is
//! how RDMA programs meet in practice (ibv_rc_pingpong, perftest).

use std::ffi::OsStr;
use std::io::Read;
use std::net::TcpListener;
use std::process::{Child, Output, Stdio};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::{show, Published};

/// A TCP port on which nothing listened a moment ago: bind port 0 on the
/// loopback address, read the port the kernel picked, release it. The
/// programs use it for their out-of-band exchange; the window in which
/// another process could take it is tiny (and would only fail the test).
pub fn free_tcp_port() -> u16 {
    TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0 to find a free TCP port")
}

/// What a server/client run produced.
pub struct PairOutput {
    pub server: Output,
    pub client: Output,
    /// Wall time from starting the server until both had exited.
    pub elapsed: Duration,
    /// True when the time limit was hit and the survivors were killed.
    pub timed_out: bool,
}

impl PairOutput {
    /// Both outputs, labelled, for failure messages.
    pub fn show(&self) -> String {
        format!(
            "===== server ({}) =====\n{}\n===== client ({}) =====\n{}",
            self.server.status,
            show(&self.server),
            self.client.status,
            show(&self.client)
        )
    }
}

/// A running child whose stdout and stderr are drained by two threads, so
/// that a chatty program never blocks on a full pipe.
struct Running {
    child: Child,
    stdout: JoinHandle<Vec<u8>>,
    stderr: JoinHandle<Vec<u8>>,
}

fn drain<R: Read + Send + 'static>(r: Option<R>) -> JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut r) = r {
            let _ = r.read_to_end(&mut buf);
        }
        buf
    })
}

impl Running {
    fn start(dev: &Published, program: &[&OsStr], envs: &[(&str, &str)]) -> Running {
        let mut c = dev.command();
        c.arg("run").arg("--").args(program);
        for (k, v) in envs {
            c.env(k, v);
        }
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = c
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", dev.artifacts.uiw.display()));
        let stdout = drain(child.stdout.take());
        let stderr = drain(child.stderr.take());
        Running {
            child,
            stdout,
            stderr,
        }
    }

    fn finish(mut self, kill: bool) -> Output {
        if kill {
            // Only this child (`uiw run` execs the program in place).
            let _ = self.child.kill();
        }
        let status = self.child.wait().expect("wait for a child");
        Output {
            status,
            stdout: self.stdout.join().unwrap_or_default(),
            stderr: self.stderr.join().unwrap_or_default(),
        }
    }
}

/// Run `uiw run -- SERVER...` and `uiw run -- CLIENT...` at the same time
/// (the client is expected to retry its connection until the server
/// listens) and wait for both, killing whatever still runs after `limit`.
pub fn run_pair(
    dev: &Published,
    server: &[&OsStr],
    client: &[&OsStr],
    envs: &[(&str, &str)],
    limit: Duration,
) -> PairOutput {
    let t0 = Instant::now();
    let mut s = Running::start(dev, server, envs);
    let mut c = Running::start(dev, client, envs);
    let mut timed_out = false;
    loop {
        let s_done = matches!(s.child.try_wait(), Ok(Some(_)));
        let c_done = matches!(c.child.try_wait(), Ok(Some(_)));
        if s_done && c_done {
            break;
        }
        if t0.elapsed() > limit {
            timed_out = true;
            break;
        }
        thread::sleep(Duration::from_millis(50));
    }
    let client = c.finish(timed_out);
    let server = s.finish(timed_out);
    PairOutput {
        server,
        client,
        elapsed: t0.elapsed(),
        timed_out,
    }
}
