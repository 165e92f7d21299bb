//! Helpers for the librdmacm drop-in's tests, on top of uiw-examples' harness
//! (Artifacts, Published, skip rules): building the C checks against librdmacm, running
//! server/client pairs under `uiw run` with time limits, and asking whether the provider
//! implements uiw_cm.h yet.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use uiw_examples::{is_root, skip, Artifacts, Published};

/// The drop-in as cargo names it.
pub const RDMACM_SO: &str = "libuiw_rdmacm.so";

pub fn out_dir() -> PathBuf {
    match std::env::var_os("UIW_EXAMPLES_OUT_DIR") {
        Some(d) => PathBuf::from(d).join("rdmacm"),
        None => Path::new(env!("CARGO_TARGET_TMPDIR")).join("uiw-rdmacm"),
    }
}

/// `cc -O1 -g -Wall -Werror [-shared -fPIC] -o OUT rdmacm/c/NAME.c -lrdmacm -libverbs -lpthread`
pub fn build_c(name: &str, shared: bool) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("c")
        .join(format!("{name}.c"));
    let out = out_dir().join(if shared {
        format!("lib{name}.so")
    } else {
        name.to_string()
    });
    let args: &[&str] = if shared {
        &["-shared", "-fPIC"]
    } else {
        &["-lrdmacm", "-libverbs", "-lpthread"]
    };
    uiw_examples::compile_c(&src, &out, args, "librdmacm-dev")
}

/// The built artifacts including the drop-in, or a panic saying what to build.
pub fn artifacts(test: &str) -> Artifacts {
    let a = Artifacts::locate().unwrap_or_else(|e| panic!("{test}: {e}"));
    assert!(
        a.dir.join(RDMACM_SO).is_file(),
        "{test}: {} missing: run `cargo build --workspace` first",
        a.dir.join(RDMACM_SO).display()
    );
    a
}

/// Device tests need root (publishing creates /dev/infiniband/uverbsN).
pub fn can_publish(test: &str) -> bool {
    if !is_root() && !Path::new("/dev/infiniband").exists() {
        skip(
            test,
            "publishing a device needs root; run the tests as root (sudo ./ci/test.sh)",
        );
        return false;
    }
    true
}

/// Does the built provider export the uiw_cm.h v1 interface (MPA in the provider)?
pub fn provider_has_uiw_cm(a: &Artifacts) -> bool {
    Command::new("objdump")
        .arg("-T")
        .arg(&a.provider)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("uiw_cm_passive_v1"))
        .unwrap_or(false)
}

/// Skip (or fail under UIW_TEST_REQUIRE_ALL=1) when connections cannot be set up yet.
pub fn need_uiw_cm(test: &str, a: &Artifacts) -> bool {
    if !provider_has_uiw_cm(a) {
        skip(test, "the provider does not export uiw_cm_*_v1 yet (provider/include/uiw_cm.h): no MPA, no connection");
        return false;
    }
    true
}

pub fn need_program(test: &str, p: &str) -> bool {
    if !uiw_examples::have_program(p) {
        skip(
            test,
            &format!("{p} is not installed (rdmacm-utils / perftest)"),
        );
        return false;
    }
    true
}

/// `uiw run -- ARGS` as a child with piped output.
pub fn spawn(dev: &Published, args: &[&str], envs: &[(&str, &str)]) -> Child {
    let mut c = dev.command();
    c.arg("run").arg("--").args(args.iter().map(OsStr::new));
    for (k, v) in envs {
        c.env(k, v);
    }
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c.spawn()
        .unwrap_or_else(|e| panic!("cannot start {args:?}: {e}"))
}

/// Wait for a child at most `limit`; kill it when it takes longer (the bool says so). Its
/// output is read while it runs, so a chatty child never blocks on a full pipe.
pub fn finish(c: Child, limit: Duration) -> (Output, bool) {
    finish_until(c, limit, &AtomicBool::new(false))
}

/// `finish`, also killing the child as soon as `stop` is set.
pub fn finish_until(mut c: Child, limit: Duration, stop: &AtomicBool) -> (Output, bool) {
    use std::io::Read;
    fn drain<R: Read + Send + 'static>(r: Option<R>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            v
        })
    }
    let (out, err) = (drain(c.stdout.take()), drain(c.stderr.take()));
    let start = Instant::now();
    let mut timed_out = false;
    let status = loop {
        match c.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if start.elapsed() > limit || stop.load(Ordering::SeqCst) => {
                let _ = c.kill();
                timed_out = true;
                break c.wait().expect("wait for the killed child");
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("wait for child: {e}"),
        }
    };
    let o = Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    };
    (o, timed_out)
}

pub fn text(o: &Output) -> String {
    format!(
        "status {}\n--- stdout ---\n{}--- stderr ---\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Waits until the server's port (its `-p PORT`, or fabtests' `-B PORT`) is listening, for at
/// most a minute, so that a server slow to start under load is not met by a client that
/// finds nothing there (REJECTED / ECONNREFUSED). A server with no port in its arguments
/// gets `delay`.
fn wait_for_server(server: &[&str], delay: Duration) {
    let port = server
        .windows(2)
        .find(|w| w[0] == "-p" || w[0] == "-B")
        .and_then(|w| w[1].parse::<u16>().ok());
    let Some(port) = port else {
        std::thread::sleep(delay);
        return;
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !uiw_examples::pair::is_listening(port) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Run a server, wait until it listens ([`wait_for_server`]), run the client; both must exit 0
/// in time.
pub fn pair(
    dev: &Published,
    server: &[&str],
    client: &[&str],
    delay: Duration,
    limit: Duration,
) -> (Output, Output) {
    let s = spawn(dev, server, &[]);
    // The server's output must be read while the client runs (rping -v fills a pipe).
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let waiter = std::thread::spawn(move || finish_until(s, limit + delay, &stop2));
    wait_for_server(server, delay);
    let c = spawn(dev, client, &[]);
    let (co, ct) = finish(c, limit);
    if !co.status.success() {
        std::thread::sleep(Duration::from_secs(2));
        stop.store(true, Ordering::SeqCst);
    }
    let (so, st) = waiter.join().expect("server waiter");
    assert!(
        !ct && !st && co.status.success() && so.status.success(),
        "{server:?} / {client:?} failed (timed out: server {st}, client {ct})\n=== server ===\n{}\n=== client ===\n{}",
        text(&so),
        text(&co)
    );
    (so, co)
}
