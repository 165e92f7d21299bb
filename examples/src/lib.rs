//! Test support for running example programs under `uiw run`.
//!
//! The example programs in `examples/c/` are plain libibverbs programs. The
//! integration tests in `examples/tests/` build them with the system C
//! compiler, publish a uiw device with the workspace's own `uiw` binary into
//! a private state directory, and run them with `uiw run -- PROGRAM`, exactly
//! as a user would.
//!
//! `cargo test` does not build the binaries and shared objects of other
//! workspace crates for an integration test of this crate, so run
//! `cargo build --workspace` first (`ci/test.sh` does). When they are
//! missing the tests fail and say so: they never pass silently.

use std::env;
use std::ffi::OsStr;
use std::fmt;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

pub mod pair;
pub mod testbed;
pub mod twoproc;

/// File names of the artifacts the tests need, relative to the profile dir.
pub const UIW_BIN: &str = "uiw";
/// The provider cdylib as cargo names it (published as `libuiw-rdmav34.so`).
pub const PROVIDER_SO: &str = "libuiw_rdmav34.so";
/// The `LD_PRELOAD` shim `uiw run` starts programs with.
pub const PRELOAD_SO: &str = "libuiw_preload.so";

/// Set to `1` to turn "skipped: not root" / "skipped: no valgrind" into
/// failures (ci/test.sh does, so CI cannot pass by skipping).
pub const ENV_REQUIRE: &str = "UIW_TEST_REQUIRE_ALL";

/// The workspace root (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("examples/ has a parent")
        .to_path_buf()
}

/// The cargo profile directory holding the workspace's binaries
/// (`target/debug`, `target/release`, or the same under `CARGO_TARGET_DIR`).
///
/// A test executable lives in `<profile dir>/deps/`, which is the most
/// reliable source; otherwise `CARGO_TARGET_DIR` or `<workspace>/target`,
/// with the profile this crate was built in.
pub fn profile_dir() -> PathBuf {
    if let Ok(exe) = env::current_exe() {
        if let Some(deps) = exe.parent() {
            if deps.file_name() == Some(OsStr::new("deps")) {
                if let Some(p) = deps.parent() {
                    return p.to_path_buf();
                }
            }
        }
    }
    let target = env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    target.join(profile)
}

/// Where the built workspace artifacts are.
#[derive(Debug, Clone)]
pub struct Artifacts {
    pub dir: PathBuf,
    pub uiw: PathBuf,
    pub provider: PathBuf,
    pub preload: PathBuf,
}

impl Artifacts {
    /// Locate `uiw`, the provider and the shim, or explain what to build.
    pub fn locate() -> Result<Artifacts, String> {
        let dir = profile_dir();
        let a = Artifacts {
            uiw: dir.join(UIW_BIN),
            provider: dir.join(PROVIDER_SO),
            preload: dir.join(PRELOAD_SO),
            dir,
        };
        let missing: Vec<String> = [&a.uiw, &a.provider, &a.preload]
            .iter()
            .filter(|p| !p.is_file())
            .map(|p| p.display().to_string())
            .collect();
        if missing.is_empty() {
            Ok(a)
        } else {
            Err(format!(
                "missing build artifacts:\n  {}\n\
                 `cargo test` does not build other workspace crates' binaries and \
                 shared objects for this test. Run `cargo build --workspace` \
                 (with the same profile and CARGO_TARGET_DIR) first, or use ./ci/test.sh.",
                missing.join("\n  ")
            ))
        }
    }
}

/// True when running with effective uid 0 (`/proc/self` belongs to the euid).
pub fn is_root() -> bool {
    fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

/// Whether skips must become failures (see [`ENV_REQUIRE`]).
pub fn skips_forbidden() -> bool {
    env::var(ENV_REQUIRE).map(|v| v == "1").unwrap_or(false)
}

/// Print why a test is skipped, or panic if skipping is forbidden.
pub fn skip(test: &str, reason: &str) {
    if skips_forbidden() {
        panic!("{test}: cannot run ({reason}) and {ENV_REQUIRE}=1 forbids skipping");
    }
    eprintln!("SKIPPED {test}: {reason}");
    println!("SKIPPED {test}: {reason}");
}

/// Is `prog` on PATH?
pub fn have_program(prog: &str) -> bool {
    env::var_os("PATH")
        .map(|paths| env::split_paths(&paths).any(|d| d.join(prog).is_file()))
        .unwrap_or(false)
}

/// The command line the valgrind tests run a program under: memcheck, exit status 99 on any
/// error or definite/possible leak, the project's suppressions (`valgrind/verbs.supp`), and
/// `--fair-sched=yes`. Valgrind runs one thread at a time; its default lock gives the CPU back
/// to whichever thread grabs it first, and on a machine with many cores a thread that spins on
/// a CQ (every test program here) grabs it nearly every time: uiw's progress thread, which
/// serves the passive side, then waited 20 s and more in CI (a peer's zero window outlived
/// `UIW_PEER_TIMEOUT`). The ticket lock takes turns, as a real scheduler does.
pub fn valgrind_command() -> Vec<String> {
    let supp = Path::new(env!("CARGO_MANIFEST_DIR")).join("valgrind/verbs.supp");
    [
        "valgrind",
        "--fair-sched=yes",
        "--error-exitcode=99",
        "--leak-check=full",
        "--show-leak-kinds=definite,possible",
        "--errors-for-leak-kinds=definite,possible",
    ]
    .into_iter()
    .map(String::from)
    .chain([format!("--suppressions={}", supp.display())])
    .collect()
}

/// Compile one example C program with `cc -O1 -g -Wall -Werror ... -libverbs`
/// into `out_dir`, returning the executable's path.
pub fn build_c_example(name: &str, out_dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("c")
        .join(format!("{name}.c"));
    compile_c(&src, &out_dir.join(name), &["-libverbs"], "libibverbs-dev")
}

/// Compiles the C file `src` into `out` (`cc -O1 -g -Wall -Werror`, then `args`), or panics
/// saying what failed and which Debian package (`dev_package`) is the likely cause.
///
/// Tests of one binary build the same program in parallel: each compiles to a file of its own
/// and renames it into place, so no test ever runs (or loads) a half-written file.
pub fn compile_c(src: &Path, out: &Path, args: &[&str], dev_package: &str) -> PathBuf {
    let dir = out.parent().expect("an output path with a directory");
    fs::create_dir_all(dir).expect("create the output directory");
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let name = out.file_name().expect("an output file name").to_string_lossy();
    let tmp = dir.join(format!(
        ".{name}.{}.{}",
        std::process::id(),
        SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let cc = env::var("CC").unwrap_or_else(|_| "cc".into());
    let o = Command::new(&cc)
        .args(["-O1", "-g", "-Wall", "-Werror", "-o"])
        .arg(&tmp)
        .arg(src)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}`: {e}"));
    if !o.status.success() {
        let _ = fs::remove_file(&tmp);
        panic!(
            "building {} failed ({}); is {dev_package} installed?\n{}{}",
            src.display(),
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    fs::rename(&tmp, out).expect("move the built file into place");
    out.to_path_buf()
}

/// Where device tests build programs and keep state directories: `UIW_EXAMPLES_OUT_DIR`
/// (ci/test.sh sets it when it runs the tests under sudo, so that no root-owned file lands in
/// target/), else `uiw-examples` under the test's `CARGO_TARGET_TMPDIR` (pass
/// `env!("CARGO_TARGET_TMPDIR")`).
pub fn out_dir(target_tmpdir: &str) -> PathBuf {
    match env::var_os("UIW_EXAMPLES_OUT_DIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(target_tmpdir).join("uiw-examples"),
    }
}

/// The check every device test starts with: the built artifacts, or `None` (reason printed;
/// a failure under `UIW_TEST_REQUIRE_ALL=1`) when a device cannot be published here.
pub fn device_test_artifacts(test: &str) -> Option<Artifacts> {
    let artifacts = Artifacts::locate().unwrap_or_else(|e| panic!("{test}: {e}"));
    if !is_root() && !Path::new("/dev/infiniband").exists() {
        skip(
            test,
            "publishing a device creates /dev/infiniband/uverbsN and needs root; \
             run `sudo ./ci/test.sh` (or this test as root)",
        );
        return None;
    }
    Some(artifacts)
}

/// Tests that publish a device share /dev/infiniband and the device name:
/// one at a time within a test binary.
pub fn device_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A uiw device published with `uiw up` into a private `UIW_STATE_DIR`;
/// taken down (`uiw down`) and removed on drop.
pub struct Published {
    pub artifacts: Artifacts,
    pub state_dir: PathBuf,
}

impl Published {
    /// `uiw up` with `UIW_STATE_DIR` set to a fresh directory under `base`.
    pub fn up(artifacts: &Artifacts, base: &Path) -> Result<Published, String> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let state_dir = base.join(format!("uiw-state-{}-{nanos}", std::process::id()));
        fs::create_dir_all(&state_dir)
            .map_err(|e| format!("create {}: {e}", state_dir.display()))?;
        let p = Published {
            artifacts: artifacts.clone(),
            state_dir,
        };
        let out = p.uiw(["up"]).map_err(|e| format!("run uiw up: {e}"))?;
        if !out.status.success() {
            return Err(format!("`uiw up` failed ({})\n{}", out.status, show(&out)));
        }
        Ok(p)
    }

    /// A `uiw` command with this publication's environment.
    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.artifacts.uiw);
        // The just-built provider and shim, not an installed or older copy.
        c.env("UIW_STATE_DIR", &self.state_dir)
            .env("UIW_LIBDIR", &self.artifacts.dir)
            .stdin(Stdio::null());
        c
    }

    /// Run `uiw ARGS...` to completion.
    pub fn uiw<I, S>(&self, args: I) -> std::io::Result<Output>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.command().args(args).output()
    }

    /// Run `uiw run -- PROGRAM ARGS...` with extra environment variables.
    pub fn run(&self, program: &[&OsStr], envs: &[(&str, &str)]) -> Output {
        let mut c = self.command();
        c.arg("run").arg("--").args(program);
        for (k, v) in envs {
            c.env(k, v);
        }
        c.output()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.artifacts.uiw.display()))
    }
}

impl Drop for Published {
    fn drop(&mut self) {
        // Best effort: a `uiw down` failure must not hide the test's result.
        match self.uiw(["down"]) {
            Ok(o) if !o.status.success() => {
                eprintln!("warning: `uiw down` failed ({})\n{}", o.status, show(&o))
            }
            Err(e) => eprintln!("warning: cannot run `uiw down`: {e}"),
            _ => {}
        }
        let _ = fs::remove_dir_all(&self.state_dir);
    }
}

/// stdout and stderr of a finished command, for failure messages.
pub fn show(out: &Output) -> String {
    format!(
        "--- stdout ---\n{}--- stderr ---\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The closing line of a TAP-like example program: `N passed, N failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub passed: u32,
    pub failed: u32,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} passed, {} failed", self.passed, self.failed)
    }
}

/// Find the last `N passed, N failed` line in a program's output.
pub fn parse_summary(stdout: &str) -> Option<Summary> {
    stdout.lines().rev().find_map(|line| {
        let (p, f) = line.trim().split_once(" passed, ")?;
        let f = f.strip_suffix(" failed")?;
        Some(Summary {
            passed: p.parse().ok()?,
            failed: f.parse().ok()?,
        })
    })
}

/// The `not ok - ...` lines of a TAP-like output.
pub fn failures(stdout: &str) -> Vec<&str> {
    stdout.lines().filter(|l| l.starts_with("not ok")).collect()
}

/// Asserts that a TAP-like example program's run (`what` names it in messages) exited 0 with
/// exactly `passed` checks passed and none failed, showing the failed checks and its output
/// otherwise.
pub fn assert_all_passed(what: &str, out: &Output, passed: u32) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let sum = parse_summary(&stdout).unwrap_or_else(|| panic!("{what}: no summary\n{}", show(out)));
    assert!(
        out.status.success() && sum.failed == 0 && sum.passed == passed,
        "{what}: {sum:?}: {:?}\n{}",
        failures(&stdout),
        show(out)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_is_parsed_from_the_last_matching_line() {
        let out = "ok - a\nnot ok - b: x\n1 passed, 1 failed\n";
        assert_eq!(
            parse_summary(out),
            Some(Summary {
                passed: 1,
                failed: 1
            })
        );
        assert_eq!(failures(out), vec!["not ok - b: x"]);
        assert_eq!(parse_summary("ok - a\n"), None);
        assert_eq!(parse_summary("x passed, 0 failed\n"), None);
    }
}
