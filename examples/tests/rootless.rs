//! Acceptance test: uiw as an unprivileged user, with no `/dev/infiniband` at all.
//!
//! `ci/rootless-test.sh` (run here as root) creates the user `uiw-rootless`, hides
//! `/dev/infiniband` behind an empty tmpfs in a private mount namespace, drops to that
//! user with no capabilities (`setpriv`) and runs `uiw up` (rootless mode),
//! `ibv_devinfo`, a listing of `/sys/class/infiniband` by `ls` and `python3`, hwloc's
//! `lstopo` (which must find `OpenFabrics "uiw_lo"`), an
//! `ib_write_bw` pair, an `rping -V` pair and an `ibv_rc_pingpong -e` pair, all under
//! `uiw run`, then `uiw down`. Needs root (to create the user and the namespace),
//! `cargo build --workspace`, perftest, rdmacm-utils, ibverbs-utils and hwloc.

use std::process::Command;

use uiw_examples::pair::free_port;
use uiw_examples::{have_program, is_root, skip, workspace_root, Artifacts};

#[test]
fn unprivileged_user_without_dev_infiniband() {
    let test = "unprivileged_user_without_dev_infiniband";
    let a = Artifacts::locate().unwrap_or_else(|e| panic!("{test}: {e}"));
    if !is_root() {
        skip(test, "creating the test user and mount namespace needs root (sudo ./ci/test.sh)");
        return;
    }
    for (p, pkg) in [("setpriv", "util-linux"), ("unshare", "util-linux"), ("useradd", "passwd"),
        ("ib_write_bw", "perftest"), ("rping", "rdmacm-utils"), ("ibv_rc_pingpong", "ibverbs-utils"),
        ("lstopo-no-graphics", "hwloc"), ("python3", "python3")] {
        if !have_program(p) && !std::path::Path::new("/usr/sbin").join(p).exists() {
            skip(test, &format!("{p} is not installed (apt-get install {pkg})"));
            return;
        }
    }
    let ports: Vec<String> = (0..3).map(|_| free_port().to_string()).collect();
    let o = Command::new("bash")
        .arg(workspace_root().join("ci/rootless-test.sh"))
        .arg(&a.dir)
        .args(&ports)
        .output()
        .expect("run ci/rootless-test.sh");
    let out = format!(
        "--- stdout\n{}\n--- stderr\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    println!("{out}");
    assert!(o.status.success(), "ci/rootless-test.sh failed ({}):\n{out}", o.status);
    assert!(String::from_utf8_lossy(&o.stdout).contains("ROOTLESS-OK"), "{out}");
}
