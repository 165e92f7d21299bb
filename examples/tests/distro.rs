//! Acceptance test: uiw, built here (Debian 12, rdma-core 44), serves other distributions'
//! rdma-core — Debian 13's 56.1 (private ABI 34) and Debian unstable's 65.0 (private ABI 65) —
//! and their own, unmodified tools run over it: `ibv_devinfo`, `ibv_rc_pingpong`, perftest's
//! `ib_{write,read,send}_bw` and `rping` through uiw's librdmacm drop-in. A libibverbs of a
//! release uiw does not know is refused with a message.
//!
//! The work is `ci/distro-chroot.sh SUITE` (an `mmdebstrap` chroot per suite, cached under
//! /var/cache/uiw-chroot outside CI, entered in namespaces of its own); this test runs it and
//! fails with its output if anything fails. Needs root, mmdebstrap and the Debian archive;
//! without them it says why it skips, and with `UIW_TEST_REQUIRE_ALL=1` (ci/test.sh as root)
//! it fails.

use std::process::Command;

use uiw_examples::{have_program, is_root, skip, Artifacts};

/// Runs ci/distro-chroot.sh for `suite`, expecting its libibverbs to be rdma-core `release`.
/// One suite at a time: two chroots' perftest pairs at once only load the machine.
fn distro(test: &str, suite: &str, release: u32) {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let artifacts = Artifacts::locate().unwrap_or_else(|e| panic!("{test}: {e}"));
    if !is_root() {
        return skip(test, "building and entering a chroot needs root; run `sudo ./ci/test.sh`");
    }
    for (prog, package) in [("mmdebstrap", "mmdebstrap"), ("unshare", "util-linux"), ("timeout", "coreutils")] {
        if !have_program(prog) {
            return skip(test, &format!("{prog} is not installed (apt-get install {package})"));
        }
    }
    let script = uiw_examples::workspace_root().join("ci/distro-chroot.sh");
    // A hard deadline for the whole run (building the chroot included); `timeout` signals the
    // script's whole process group, and the chroot's namespaces die with it.
    let out = Command::new("timeout")
        .args(["-k", "10", "900", "bash"])
        .arg(&script)
        .arg("--libdir")
        .arg(&artifacts.dir)
        .args(["--expect-release", &release.to_string(), suite])
        .output()
        .unwrap_or_else(|e| panic!("{test}: cannot run {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{test}: ci/distro-chroot.sh {suite} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // What ran and what it measured (shown with --nocapture).
    println!("{stderr}");
    for want in [
        format!("registering with rdma-core v{release} (IBVERBS_PRIVATE_"),
        "ib_write_bw:".into(),
        "ib_read_bw:".into(),
        "ib_send_bw:".into(),
        "rping -c".into(),
        "provider not registered".into(),
        format!("distro-chroot[{suite}]: all passed"),
    ] {
        assert!(stderr.contains(&want), "{test}: missing {want:?} in:\n{stderr}");
    }
}

#[test]
fn debian13_rdma_core_56_runs_its_tools_over_uiw() {
    distro("debian13_rdma_core_56_runs_its_tools_over_uiw", "trixie", 56);
}

#[test]
fn debian_unstable_rdma_core_65_runs_its_tools_over_uiw() {
    distro("debian_unstable_rdma_core_65_runs_its_tools_over_uiw", "sid", 65);
}
