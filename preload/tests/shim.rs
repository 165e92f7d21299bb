//! Runs tests/shim_check.c under LD_PRELOAD=libuiw_preload.so, with and without SYSFS_PATH.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `target/<profile>/libuiw_preload.so`: this test binary lives in `target/<profile>/deps`.
fn shim() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().unwrap().parent().unwrap();
    let so = profile.join("libuiw_preload.so");
    if !so.exists() {
        // cargo builds the cdylib for `cargo test -p uiw-preload`; build it if not.
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut c = Command::new(cargo);
        c.args(["build", "-p", "uiw-preload"]).current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile.file_name().is_some_and(|n| n == "release") {
            c.arg("--release");
        }
        assert!(c.status().unwrap().success());
    }
    assert!(so.exists(), "{} missing", so.display());
    so
}

fn build_check() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    // One binary per call: the tests run in parallel threads of one process, and each removes
    // its binary when done.
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = std::env::temp_dir().join(format!("uiw_shim_check_{}_{n}", std::process::id()));
    let st = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(dir.join("tests/shim_check.c"))
        .arg("-I")
        .arg(dir.join("include"))
        .arg("-ldl")
        .status()
        .expect("a C compiler (cc)");
    assert!(st.success(), "compiling shim_check.c failed");
    out
}

fn run(sysfs: bool) -> String {
    let so = shim();
    let exe = build_check();
    let mut c = Command::new(&exe);
    c.env("LD_PRELOAD", &so);
    if sysfs {
        c.env("SYSFS_PATH", "/nonexistent");
    } else {
        c.env_remove("SYSFS_PATH");
    }
    let o = c.output().unwrap();
    let _ = std::fs::remove_file(&exe);
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "shim_check failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains("all ok"), "{stdout}");
    stdout
}

#[test]
fn with_sysfs_path_netlink_rdma_is_refused() {
    let out = run(true);
    assert!(out.contains("ok netlink_rdma_refused"), "{out}");
    assert!(out.contains("ok write_goes_to_handler"), "{out}");
    assert!(out.contains("ok close_unregisters"), "{out}");
}

#[test]
fn without_sysfs_path_socket_passes_through() {
    let out = run(false);
    assert!(out.contains("ok netlink_rdma_passthrough"), "{out}");
    assert!(out.contains("ok response_written"), "{out}");
}

/// The symbols the provider looks up and the libc functions the shim interposes.
#[test]
fn exports() {
    let so = shim();
    let o = Command::new("nm").args(["-D", "--defined-only"]).arg(&so).output();
    let Ok(o) = o else {
        eprintln!("skipping: nm not available");
        return;
    };
    let s = String::from_utf8_lossy(&o.stdout);
    for sym in [
        "uiw_preload_register_cmd_fd_v1",
        "uiw_preload_unregister_cmd_fd_v1",
        "uiw_preload_register_read_fd_v1",
        "uiw_preload_unregister_read_fd_v1",
        "write",
        "read",
        "close",
        "socket",
        "dup2",
        "dup3",
        "close_range",
    ] {
        assert!(s.lines().any(|l| l.ends_with(&format!(" T {sym}"))), "{sym} not exported:\n{s}");
    }
}
