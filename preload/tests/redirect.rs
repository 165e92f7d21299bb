//! Rootless mode's filesystem answers (src/redirect.rs), checked with ordinary tools under
//! `LD_PRELOAD=libuiw_preload.so` against a fake published tree — no root needed.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

fn shim() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let so = exe.parent().unwrap().parent().unwrap().join("libuiw_preload.so");
    assert!(so.exists(), "{} missing (cargo build -p uiw-preload)", so.display());
    so
}

/// A published tree: uiw device `uiw_fake` at uverbs977 (a directory), a mirrored "kernel"
/// uverbs978 (a symlink), as `uiw up` writes them.
fn tree(name: &str) -> PathBuf {
    let root = std::env::temp_dir().join(format!("uiw-redirect-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&root);
    let s = root.join("sysfs");
    fs::create_dir_all(s.join("class/infiniband/uiw_fake/ports/1")).unwrap();
    fs::write(s.join("class/infiniband/uiw_fake/node_type"), "4: RNIC\n").unwrap();
    fs::create_dir_all(s.join("class/infiniband_verbs/uverbs977")).unwrap();
    fs::write(s.join("class/infiniband_verbs/uverbs977/ibdev"), "uiw_fake\n").unwrap();
    fs::write(s.join("class/infiniband_verbs/abi_version"), "6\n").unwrap();
    symlink("/nonexistent/uverbs978", s.join("class/infiniband_verbs/uverbs978")).unwrap();
    root
}

fn sh(sysfs: Option<&Path>, script: &str) -> (bool, String, String) {
    let mut c = Command::new("sh");
    c.arg("-c").arg(script).env("LD_PRELOAD", shim()).env("LC_ALL", "C");
    match sysfs {
        Some(p) => c.env("SYSFS_PATH", p),
        None => c.env_remove("SYSFS_PATH"),
    };
    let o = c.output().unwrap();
    (o.status.success(), String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn sys_class_infiniband_reads_the_published_tree() {
    let root = tree("class");
    let s = root.join("sysfs");
    let (ok, out, err) = sh(Some(&s), "ls /sys/class/infiniband; cat /sys/class/infiniband/uiw_fake/node_type; ls /sys/class/infiniband_verbs; test -d /sys/class/infiniband/uiw_fake/ports/1 && echo dir");
    assert!(ok, "{err}");
    assert_eq!(out, "uiw_fake\n4: RNIC\nabi_version\nuverbs977\nuverbs978\ndir\n");
    // Relative to a directory fd (hwloc opens sys/class/infiniband relative to `/`).
    let (ok, out, err) = sh(Some(&s), "cd / && ls sys/class/infiniband && cd /sys && ls class/infiniband");
    assert!(ok, "{err}");
    assert_eq!(out, "uiw_fake\nuiw_fake\n");
    // Other classes are not redirected; without SYSFS_PATH nothing is.
    let (_, out, _) = sh(Some(&s), "ls /sys/class/infiniband_mad 2>&1; ls -d /sys/class/net");
    assert!(out.ends_with("/sys/class/net\n") && !out.contains("uiw_fake"), "{out}");
    let (_, out, _) = sh(None, "ls /sys/class/infiniband 2>/dev/null");
    assert!(!out.contains("uiw_fake"), "{out}");
    let _ = fs::remove_dir_all(&root);
}

#[test]
fn absent_uverbs_node_of_a_uiw_device_is_dev_null() {
    if Path::new("/dev/infiniband/uverbs977").exists() || Path::new("/dev/infiniband/uverbs978").exists() {
        panic!("/dev/infiniband/uverbs977 or 978 exists on this host: the test's indices are taken");
    }
    let root = tree("node");
    let s = root.join("sysfs");
    // stat and open answer with /dev/null (char 1:3) for the uiw device...
    let (ok, out, err) = sh(Some(&s), "stat -c '%F %t:%T' /dev/infiniband/uverbs977 && echo x | dd of=/dev/infiniband/uverbs977 conv=nocreat,notrunc status=none && echo wrote");
    assert!(ok, "{err}");
    assert_eq!(out, "character special file 1:3\nwrote\n");
    // ...but not for a mirrored kernel device, an unpublished index, or without SYSFS_PATH.
    for (sysfs, node) in [(Some(s.as_path()), "uverbs978"), (Some(s.as_path()), "uverbs979"), (None, "uverbs977")] {
        let (ok, _, err) = sh(sysfs, &format!("stat /dev/infiniband/{node}"));
        assert!(!ok && err.contains("No such file or directory"), "{node} {sysfs:?}: {err}");
    }
    let _ = fs::remove_dir_all(&root);
}
