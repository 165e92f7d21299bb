//! Runs the built `uiw` binary against temporary directories.
//!
//! Most tests replace /dev/infiniband (UIW_DEV_DIR), the node registry and, where
//! the values must be known exactly, /sys (UIW_HOST_SYSFS: a fake `class/net/lo`
//! and a fake kernel RDMA device). The libibverbs tests at the end use the real
//! /dev/infiniband and need root and the provider.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Prints why a test cannot run here and returns early; under `UIW_TEST_REQUIRE_ALL=1` (CI,
/// `ci/test.sh` as root) a test that cannot run is a failure instead.
macro_rules! skip {
    ($($arg:tt)*) => {{
        let why = format!($($arg)*);
        if std::env::var_os("UIW_TEST_REQUIRE_ALL").is_some_and(|v| v == "1") {
            panic!("cannot run under UIW_TEST_REQUIRE_ALL=1: {why}");
        }
        eprintln!("skipping: {why}");
    }};
}

const UIW: &str = env!("CARGO_BIN_EXE_uiw");

struct Tmp(PathBuf);
impl Tmp {
    fn new(name: &str) -> Tmp {
        let p = std::env::temp_dir().join(format!("uiw-cli-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        Tmp(p)
    }
    fn p(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }
}
impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// An environment for one uiw invocation: state, dev dir, registry, install root,
/// optionally a fake host sysfs and lib dir.
struct Env {
    t: Tmp,
    host: Option<PathBuf>,
    libdir: Option<PathBuf>,
    real_dev: bool,
}

impl Env {
    fn new(name: &str) -> Env {
        Env { t: Tmp::new(name), host: None, libdir: None, real_dev: false }
    }
    fn state(&self) -> PathBuf {
        self.t.p("state")
    }
    fn dev(&self) -> PathBuf {
        self.t.p("dev")
    }
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(UIW);
        c.args(args)
            .env("UIW_STATE_DIR", self.state())
            .env("UIW_INSTALL_ROOT", self.t.p("root"))
            .env_remove("UIW_HOST_SYSFS")
            .env_remove("LD_PRELOAD")
            .env_remove("RDMAV_DRIVERS")
            .env_remove("SYSFS_PATH");
        if self.real_dev {
            c.env_remove("UIW_DEV_DIR").env_remove("UIW_NODE_REGISTRY");
        } else {
            c.env("UIW_DEV_DIR", self.dev()).env("UIW_NODE_REGISTRY", self.t.p("registry"));
        }
        if let Some(h) = &self.host {
            c.env("UIW_HOST_SYSFS", h);
        }
        match &self.libdir {
            Some(l) => c.env("UIW_LIBDIR", l),
            None => c.env("UIW_LIBDIR", self.t.p("nolibs")),
        };
        c
    }
    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }
    fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(o.status.success(), "uiw {args:?} failed: {}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    }
    /// A fake /sys: class/net/lo with known values, and optionally a kernel device
    /// mlx5_0 at uverbs0.
    fn fake_host(&mut self, kernel_dev: bool) {
        let h = self.t.p("host");
        let net = h.join("class/net/lo");
        fs::create_dir_all(&net).unwrap();
        for (f, v) in [("address", "02:00:00:aa:bb:cc"), ("mtu", "9000"), ("ifindex", "7"), ("flags", "0x1003"), ("carrier", "1"), ("speed", "10000")] {
            fs::write(net.join(f), format!("{v}\n")).unwrap();
        }
        if kernel_dev {
            let d = h.join("class/infiniband/mlx5_0/ports/1");
            fs::create_dir_all(d.join("gid_attrs/ndevs")).unwrap();
            fs::write(d.join("state"), "4: ACTIVE\n").unwrap();
            fs::write(d.join("phys_state"), "5: LinkUp\n").unwrap();
            fs::write(d.join("gid_attrs/ndevs/0"), "eth9\n").unwrap();
            let u = h.join("class/infiniband_verbs/uverbs0");
            fs::create_dir_all(&u).unwrap();
            fs::write(u.join("ibdev"), "mlx5_0\n").unwrap();
            fs::write(h.join("class/infiniband_verbs/abi_version"), "6\n").unwrap();
        }
        self.host = Some(h);
    }
}

/// path -> content (files) or "-> target" (symlinks), relative to root.
fn snapshot(root: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for e in fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let ft = e.file_type().unwrap();
            if ft.is_symlink() {
                out.insert(rel, format!("-> {}", fs::read_link(&p).unwrap().display()));
            } else if ft.is_dir() {
                walk(root, &p, out);
            } else {
                out.insert(rel, fs::read_to_string(&p).unwrap());
            }
        }
    }
    let mut m = BTreeMap::new();
    walk(root, root, &mut m);
    m
}

fn lo_has_only_127_0_0_1() -> bool {
    // `ip -4 -o addr show lo` would be nicer, but keep the test free of iproute2.
    let o = Command::new("ip").args(["-4", "-o", "addr", "show", "dev", "lo"]).output();
    match o {
        Ok(o) => {
            let s = String::from_utf8_lossy(&o.stdout);
            s.lines().count() == 1 && s.contains(" 127.0.0.1/")
        }
        Err(_) => true,
    }
}

#[test]
fn tree_is_byte_exact() {
    let mut e = Env::new("exact");
    e.fake_host(true);
    let out = e.ok(&["up"]);
    assert_eq!(out, "link uiw_lo/1 state ACTIVE physical_state LINK_UP netdev lo transport tcp\n");
    let snap = snapshot(&e.state().join("sysfs"));
    let host = e.host.clone().unwrap();
    let d = "class/infiniband/uiw_lo";
    let p = "class/infiniband/uiw_lo/ports/1";
    let mut want: BTreeMap<String, String> = [
        ("class/infiniband_verbs/abi_version", "6"),
        // the fake kernel device holds uverbs0, so ours is uverbs1
        ("class/infiniband_verbs/uverbs1/ibdev", "uiw_lo"),
        ("class/infiniband_verbs/uverbs1/dev", "1:3"),
        ("class/infiniband_verbs/uverbs1/abi_version", "1"),
        (&format!("{d}/node_type"), "4: RNIC"),
        (&format!("{d}/node_guid"), "0200:00aa:bbcc:0000"),
        (&format!("{d}/sys_image_guid"), "0200:00aa:bbcc:0000"),
        (&format!("{d}/node_desc"), "uiw lo"),
        (&format!("{d}/fw_ver"), env!("CARGO_PKG_VERSION")),
        (&format!("{d}/board_id"), "uiw"),
        (&format!("{d}/hca_type"), "uiw"),
        ("devices/virtual/uiw/uiw_lo/modalias", "uiw:lo"),
        (&format!("{p}/state"), "4: ACTIVE"),
        (&format!("{p}/phys_state"), "5: LinkUp"),
        (&format!("{p}/link_layer"), "Ethernet"),
        (&format!("{p}/rate"), "10 Gb/sec (1X FDR10)"),
        (&format!("{p}/lid"), "0x0"),
        (&format!("{p}/sm_lid"), "0x0"),
        (&format!("{p}/lid_mask_count"), "0"),
        (&format!("{p}/sm_sl"), "0"),
        (&format!("{p}/cap_mask"), "0x00090000"),
        (&format!("{p}/pkeys/0"), "0xffff"),
        (&format!("{p}/gids/0"), "0000:0000:0000:0000:0000:ffff:7f00:0001"),
        (&format!("{p}/gid_attrs/types/0"), "IB/RoCE v1"),
        (&format!("{p}/gid_attrs/ndevs/0"), "lo"),
        (&format!("{d}/uiw/format"), "1"),
        (&format!("{d}/uiw/netdev"), "lo"),
        (&format!("{d}/uiw/transport"), "tcp"),
        (&format!("{d}/uiw/mtu"), "9000"),
        (&format!("{d}/uiw/ifindex"), "7"),
        (&format!("{d}/uiw/mac"), "02:00:00:aa:bb:cc"),
        (&format!("{d}/uiw/gid_tbl_len"), "1"),
        (&format!("{d}/uiw/active_speed"), "8"),
        (&format!("{d}/uiw/active_width"), "1"),
        (&format!("{d}/uiw/uverbs"), "uverbs1"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), format!("{v}\n")))
    .collect();
    // mirrored kernel device
    want.insert("class/infiniband_verbs/uverbs0".into(), format!("-> {}", host.join("class/infiniband_verbs/uverbs0").display()));
    want.insert("class/infiniband/mlx5_0".into(), format!("-> {}", host.join("class/infiniband/mlx5_0").display()));
    // the parent device (virtual, as hwloc reads it) and its netdev, as the kernel lists a
    // parent device's netdevs (rdma-core's tests/base.py)
    want.insert(format!("{d}/device"), "-> ../../../devices/virtual/uiw/uiw_lo".into());
    want.insert("devices/virtual/uiw/uiw_lo/net/lo".into(), format!("-> {}", host.join("class/net/lo").display()));
    if lo_has_only_127_0_0_1() {
        assert_eq!(snap, want);
    } else {
        for (k, v) in &want {
            assert_eq!(snap.get(k), Some(v), "{k}");
        }
    }
    // the node and its ownership record
    let node = e.dev().join("uverbs1");
    let m = fs::symlink_metadata(&node).unwrap();
    assert!(m.file_type().is_char_device() || fs::read_link(&node).unwrap() == Path::new("/dev/null"));
    assert_eq!(fs::metadata(&node).unwrap().rdev(), libc_makedev(1, 3));
    assert!(!e.dev().join("uverbs0").exists(), "never create the kernel device's node");
    assert_eq!(fs::read_dir(e.t.p("registry/uverbs1")).unwrap().count(), 1);
    assert_eq!(fs::read_to_string(e.state().join("devices")).unwrap().lines().last().unwrap(), "uiw_lo lo uverbs1");
    // show lists ours and the mirrored kernel device
    assert_eq!(
        e.ok(&["show"]),
        "link uiw_lo/1 state ACTIVE physical_state LINK_UP netdev lo transport tcp\nlink mlx5_0/1 state ACTIVE physical_state LINK_UP netdev eth9 (kernel)\n"
    );
    e.ok(&["down"]);
}

fn libc_makedev(ma: u64, mi: u64) -> u64 {
    // glibc's encoding (same as the kernel's new_encode_dev for small numbers)
    ((ma & 0xfffff000) << 32) | ((ma & 0xfff) << 8) | ((mi & 0xffffff00) << 12) | (mi & 0xff)
}

#[test]
fn down_link_state_and_second_netdev() {
    let mut e = Env::new("down_state");
    e.fake_host(false);
    let net = e.host.clone().unwrap().join("class/net/lo");
    fs::write(net.join("carrier"), "0\n").unwrap();
    let out = e.ok(&["up", "--netdev", "lo"]);
    assert_eq!(out, "link uiw_lo/1 state DOWN physical_state DISABLED netdev lo transport tcp\n");
    let p = e.state().join("sysfs/class/infiniband/uiw_lo/ports/1");
    assert_eq!(fs::read_to_string(p.join("state")).unwrap(), "1: DOWN\n");
    assert_eq!(fs::read_to_string(p.join("phys_state")).unwrap(), "3: Disabled\n");
    // an unknown netdev is an error and changes nothing
    let o = e.run(&["up", "--netdev", "nosuchdev0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no network device 'nosuchdev0'"));
    assert_eq!(fs::read_to_string(e.state().join("devices")).unwrap().lines().count(), 2);
    e.ok(&["down"]);
}

#[test]
fn up_down_idempotent() {
    let e = Env::new("idem");
    e.ok(&["up"]);
    let a = snapshot(&e.state());
    e.ok(&["up"]);
    e.ok(&["up", "--netdev", "lo"]);
    let b = snapshot(&e.state());
    assert_eq!(a, b, "repeating `up` changes nothing");
    assert!(e.dev().join("uverbs0").exists());
    e.ok(&["down"]);
    assert!(!e.state().exists(), "down removes the state it created");
    assert!(!e.dev().join("uverbs0").exists(), "down removes our node");
    assert!(!e.t.p("registry/uverbs0").exists());
    e.ok(&["down"]);
    let o = e.run(&["down", "--netdev", "lo"]);
    assert!(o.status.success());
}

#[test]
fn partial_down_keeps_the_rest() {
    // lo twice under different state dirs would share; here: one state dir, two devices
    // (eth-like netdev faked through UIW_HOST_SYSFS).
    let mut e = Env::new("partial");
    e.fake_host(false);
    let h = e.host.clone().unwrap();
    // a second netdev known to the fake sysfs; getifaddrs has no addresses for it
    let n2 = h.join("class/net/dummy9");
    fs::create_dir_all(&n2).unwrap();
    for (f, v) in [("address", "02:00:00:00:00:09"), ("mtu", "1500"), ("ifindex", "99"), ("flags", "0x1003"), ("carrier", "1")] {
        fs::write(n2.join(f), format!("{v}\n")).unwrap();
    }
    e.ok(&["up", "--netdev", "lo", "--netdev", "dummy9"]);
    let s = e.state().join("sysfs/class/infiniband");
    assert_eq!(fs::read_to_string(e.state().join("sysfs/class/infiniband_verbs/uverbs1/ibdev")).unwrap(), "uiw_dummy9\n");
    // no IPv4 address: one zero GID, no ndev for it
    assert_eq!(fs::read_to_string(s.join("uiw_dummy9/ports/1/gids/0")).unwrap(), "0000:0000:0000:0000:0000:0000:0000:0000\n");
    assert!(!s.join("uiw_dummy9/ports/1/gid_attrs/ndevs/0").exists());
    assert_eq!(fs::read_to_string(s.join("uiw_dummy9/ports/1/gid_attrs/types/0")).unwrap(), "IB/RoCE v1\n");
    assert_eq!(fs::read_to_string(s.join("uiw_dummy9/node_guid")).unwrap(), "0200:0000:0009:0000\n");
    e.ok(&["down", "--netdev", "lo"]);
    assert!(!s.join("uiw_lo").exists());
    assert!(s.join("uiw_dummy9").exists());
    assert!(!e.dev().join("uverbs0").exists());
    assert!(e.dev().join("uverbs1").exists(), "dummy9 keeps its node number");
    assert_eq!(e.ok(&["show"]), "link uiw_dummy9/1 state ACTIVE physical_state LINK_UP netdev dummy9 transport tcp\n");
    e.ok(&["down"]);
    assert!(!e.dev().join("uverbs1").exists());
}

#[test]
fn state_dirs_share_nodes_safely() {
    let a = Env::new("share_a");
    // b uses a's dev dir and registry, with its own state dir
    let b_state = a.t.p("state_b");
    let b = |args: &[&str]| {
        let o = a.cmd(args).env("UIW_STATE_DIR", &b_state).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    a.ok(&["up"]);
    b(&["up"]);
    assert_eq!(fs::read_to_string(b_state.join("sysfs/class/infiniband_verbs/uverbs0/ibdev")).unwrap(), "uiw_lo\n");
    assert_eq!(fs::read_dir(a.t.p("registry/uverbs0")).unwrap().count(), 2);
    a.ok(&["down"]);
    assert!(a.dev().join("uverbs0").exists(), "b still uses the node");
    b(&["down"]);
    assert!(!a.dev().join("uverbs0").exists(), "last user removes it");
}

#[test]
fn stale_owner_is_ignored() {
    let a = Env::new("stale");
    a.ok(&["up"]);
    // a crashed run left a registration whose state dir is gone
    fs::write(a.t.p("registry/uverbs0/0000000000000000"), "/nonexistent/uiw-state\n").unwrap();
    a.ok(&["down"]);
    assert!(!a.dev().join("uverbs0").exists());
}

#[test]
fn foreign_node_is_never_touched() {
    let e = Env::new("foreign");
    fs::create_dir_all(e.dev()).unwrap();
    fs::write(e.dev().join("uverbs0"), "not ours").unwrap();
    e.ok(&["up"]);
    assert_eq!(fs::read_to_string(e.state().join("sysfs/class/infiniband/uiw_lo/uiw/uverbs")).unwrap(), "uverbs1\n");
    e.ok(&["down"]);
    assert_eq!(fs::read_to_string(e.dev().join("uverbs0")).unwrap(), "not ours");
    assert!(!e.dev().join("uverbs1").exists());
}

fn fake_libs(dir: &Path) {
    fs::create_dir_all(dir.join("rdmacm")).unwrap();
    fs::write(dir.join("libuiw_rdmav34.so"), "provider").unwrap();
    fs::write(dir.join("libuiw_preload.so"), "shim").unwrap();
}

/// Without a `rdmacm` directory next to the provider, `up` links the built librdmacm
/// drop-in as <state>/lib/rdmacm/librdmacm.so.1 and `env` puts that directory first.
#[test]
fn rdmacm_drop_in_is_linked() {
    let mut e = Env::new("rdmacm");
    let libs = e.t.p("libs");
    fs::create_dir_all(&libs).unwrap();
    fs::write(libs.join("libuiw_rdmav34.so"), "provider").unwrap();
    fs::write(libs.join("libuiw_preload.so"), "shim").unwrap();
    fs::write(libs.join("libuiw_rdmacm.so"), "rdmacm").unwrap();
    e.libdir = Some(libs.clone());
    e.ok(&["up"]);
    let s = e.state();
    assert_eq!(fs::read_link(s.join("lib/rdmacm/librdmacm.so.1")).unwrap(), libs.join("libuiw_rdmacm.so"));
    let env = e.ok(&["env"]);
    assert!(
        env.contains(&format!("export LD_LIBRARY_PATH='{}/lib/rdmacm'", s.display())),
        "{env}"
    );
    e.ok(&["down"]);
    assert!(!s.join("lib").exists());
}

#[test]
fn env_output() {
    let mut e = Env::new("env");
    let libs = e.t.p("libs");
    fake_libs(&libs);
    e.libdir = Some(libs.clone());
    e.ok(&["up"]);
    let s = e.state();
    let st = s.display();
    assert_eq!(
        e.ok(&["env"]),
        format!(
            "export SYSFS_PATH='{st}/sysfs'\n\
             export RDMAV_DRIVERS=\"${{RDMAV_DRIVERS:+$RDMAV_DRIVERS:}}\"'{st}/lib/libuiw'\n\
             export LD_PRELOAD=\"${{LD_PRELOAD:+$LD_PRELOAD }}\"'{st}/lib/libuiw_preload.so'\n\
             export LD_LIBRARY_PATH='{}/rdmacm'\"${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}\"\n\
             [ -n \"${{FI_OFI_RXM_SAR_LIMIT+set}}\" ] || export FI_OFI_RXM_SAR_LIMIT='16384'\n",
            libs.display()
        )
    );
    // One link per private ABI name libibverbs may append to RDMAV_DRIVERS (rdma-core v36–v65).
    for pabi in [34, 57, 59, 64, 65] {
        assert_eq!(fs::read_link(s.join(format!("lib/libuiw-rdmav{pabi}.so"))).unwrap(), libs.join("libuiw_rdmav34.so"));
    }
    assert_eq!(fs::read_link(s.join("lib/libuiw_preload.so")).unwrap(), libs.join("libuiw_preload.so"));
    // The lines work in a POSIX shell, keeping what was there.
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "LD_PRELOAD=/x/a.so; eval \"$('{UIW}' env)\"; echo \"$LD_PRELOAD|$SYSFS_PATH|$RDMAV_DRIVERS|$FI_OFI_RXM_SAR_LIMIT\"; \
             FI_OFI_RXM_SAR_LIMIT=0; eval \"$('{UIW}' env)\"; echo \"$FI_OFI_RXM_SAR_LIMIT\""
        ))
        .env("UIW_STATE_DIR", &s)
        .env("UIW_LIBDIR", &libs)
        .env("UIW_INSTALL_ROOT", e.t.p("root"))
        .env_remove("RDMAV_DRIVERS")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        format!("/x/a.so {st}/lib/libuiw_preload.so|{st}/sysfs|{st}/lib/libuiw|16384\n0\n"),
        "a value the user set is kept"
    );
    e.ok(&["down"]);
}

#[test]
fn run_sets_environment() {
    let mut e = Env::new("run");
    let libs = e.t.p("libs");
    fake_libs(&libs);
    e.libdir = Some(libs);
    e.ok(&["up"]);
    let st = e.state();
    // LD_PRELOAD would be applied to sh itself: use a path that does not exist for the
    // "existing" one and check the value only (ld.so warns and carries on).
    let o = e
        .cmd(&["run", "--", "sh", "-c", "printf '%s|%s|%s' \"$SYSFS_PATH\" \"$LD_PRELOAD\" \"$RDMAV_DRIVERS\"; exit 3"])
        .env("LD_PRELOAD", "/nonexistent/a.so")
        .env("RDMAV_DRIVERS", "rxe")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "run returns the program's status");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        format!(
            "{0}/sysfs|/nonexistent/a.so {0}/lib/libuiw_preload.so|rxe:{0}/lib/libuiw",
            st.display()
        )
    );
    // rxm's SAR limit: uiw's default where none is set, the user's own kept.
    let sar = |set: Option<&str>| {
        let mut c = e.cmd(&["run", "--", "sh", "-c", "printf '%s' \"${FI_OFI_RXM_SAR_LIMIT-unset}\""]);
        match set {
            Some(v) => c.env("FI_OFI_RXM_SAR_LIMIT", v),
            None => c.env_remove("FI_OFI_RXM_SAR_LIMIT"),
        };
        String::from_utf8_lossy(&c.output().unwrap().stdout).into_owned()
    };
    assert_eq!(sar(None), "16384");
    assert_eq!(sar(Some("131072")), "131072");
    assert_eq!(sar(Some("")), "", "a variable set empty is the user's too");
    let o = e.run(&["run", "--", "/nonexistent/program"]);
    assert_eq!(o.status.code(), Some(127));
    let o = e.run(&["run"]);
    assert_eq!(o.status.code(), Some(2));
    e.ok(&["down"]);
}

fn is_root() -> bool {
    // The effective uid, from /proc (no libc dependency in the tests).
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0")))
        .unwrap_or(false)
}

#[test]
fn run_without_device() {
    let e = Env::new("run_auto");
    // root or not (rootless then): publishes uiw_lo first
    let o = e.run(&["run", "--", "true"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("publishing uiw_lo"));
    assert!(e.state().join("sysfs/class/infiniband/uiw_lo").exists());
    e.ok(&["down"]);
}

/// A user who cannot create /dev/infiniband nodes publishes in rootless mode: the tree
/// (with `uverbsN/dev` = /dev/null's 1:3, what the shim opens), no node, no registry entry,
/// a manifest marked `rootless`, and a message that says what that means.
#[test]
fn non_root_up_is_rootless() {
    if !is_root() || Command::new("setpriv").arg("--version").output().is_err() {
        skip!("needs root (to drop it) and setpriv");
        return;
    }
    let e = Env::new("nonroot");
    // a root-owned, non-writable place for the node, a writable state dir
    fs::create_dir_all(e.t.p("rootonly")).unwrap();
    fs::create_dir_all(e.state()).unwrap();
    for p in [e.state(), e.t.0.clone()] {
        Command::new("chmod").arg("0777").arg(&p).status().unwrap();
    }
    let as_nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", UIW])
            .args(args)
            .env("UIW_STATE_DIR", e.state())
            .env("UIW_DEV_DIR", e.t.p("rootonly/infiniband"))
            .env("UIW_NODE_REGISTRY", e.t.p("registry"))
            .env("UIW_LIBDIR", e.t.p("nolibs"))
            .env("UIW_INSTALL_ROOT", e.t.p("root"))
            .output()
            .unwrap()
    };
    let o = as_nobody(&["up"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("rootless mode (/dev/infiniband cannot be written here)") && err.contains("uiw run"), "{err}");
    assert!(!e.t.p("rootonly/infiniband").exists());
    assert!(!e.t.p("registry").exists());
    assert_eq!(fs::read_to_string(e.state().join("sysfs/class/infiniband_verbs/uverbs0/dev")).unwrap(), "1:3\n");
    assert!(fs::read_to_string(e.state().join("devices")).unwrap().contains("uiw_lo lo uverbs0 rootless\n"));
    let o = as_nobody(&["down"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!e.state().join("devices").exists());
    Command::new("chmod").arg("0755").arg(e.t.p("rootonly")).status().unwrap();
}

#[test]
fn install_uninstall() {
    let mut e = Env::new("install");
    let libs = e.t.p("libs");
    fake_libs(&libs);
    e.libdir = Some(libs);
    let pdir = e.t.p(&format!("root/usr/lib/{}-linux-gnu/libibverbs", std::env::consts::ARCH));
    fs::create_dir_all(&pdir).unwrap();
    // Another provider, named as rdma-core v65 names them: it stays.
    fs::write(pdir.join("librxe-rdmav65.so"), "rxe").unwrap();
    let out = e.ok(&["install"]);
    assert_eq!(fs::read_to_string(pdir.join("libuiw-rdmav34.so")).unwrap(), "provider", "{out}");
    for pabi in [57, 59, 64, 65] {
        let link = pdir.join(format!("libuiw-rdmav{pabi}.so"));
        assert_eq!(fs::read_link(&link).unwrap(), Path::new("libuiw-rdmav34.so"));
        assert_eq!(fs::read_to_string(&link).unwrap(), "provider");
    }
    assert_eq!(fs::read_to_string(pdir.join("../uiw/libuiw_preload.so")).unwrap(), "shim");
    assert_eq!(fs::read_to_string(e.t.p("root/etc/libibverbs.d/uiw.driver")).unwrap(), "driver uiw\n");
    // installed: no RDMAV_DRIVERS
    e.ok(&["up"]);
    assert!(!e.ok(&["env"]).contains("RDMAV_DRIVERS"));
    e.ok(&["down"]);
    e.ok(&["uninstall"]);
    for pabi in [34, 57, 59, 64, 65] {
        assert!(pdir.join(format!("libuiw-rdmav{pabi}.so")).symlink_metadata().is_err(), "{pabi}");
    }
    assert!(!pdir.join("../uiw").exists());
    assert!(!e.t.p("root/etc/libibverbs.d/uiw.driver").exists());
    assert!(pdir.join("librxe-rdmav65.so").exists());
    e.ok(&["uninstall"]);
}

#[test]
fn help_and_usage() {
    let e = Env::new("help");
    let h = e.ok(&["--help"]);
    assert!(h.contains("SYNOPSIS") && h.contains("uiw run [--] CMD"));
    for c in ["up", "down", "show", "env", "run", "install", "uninstall"] {
        let h = e.ok(&[c, "--help"]);
        assert!(h.starts_with("NAME\n    uiw ") && h.contains("SYNOPSIS"), "{c}");
    }
    assert!(e.ok(&["--version"]).starts_with("uiw "));
    assert_eq!(e.run(&["frobnicate"]).status.code(), Some(2));
    assert_eq!(e.run(&[]).status.code(), Some(2));
    assert_eq!(e.run(&["up", "--bogus"]).status.code(), Some(2));
    assert!(!e.state().exists(), "usage errors publish nothing");
}

/// `uiw up --transport xdp|packet`: bad values and missing --netdev are usage errors; without
/// the privileges the transport needs it says which and suggests tcp (nothing is published
/// either way). With them the device is published with its transport in `uiw/transport`
/// (what the provider reads), kept by a refreshing `up`, shown by `show`, and a later `up`
/// naming the device without --transport puts it back on tcp.
#[test]
fn raw_transports_are_checked_and_recorded() {
    let mut e = Env::new("transport");
    let o = e.run(&["up", "--transport", "rdma"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("say tcp, packet or xdp"));
    for args in [&["up", "--transport", "xdp"][..], &["up", "--transport=packet", "--netdev", "lo"]] {
        let o = e.run(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains("needs --netdev NAME, an Ethernet interface"), "{args:?}");
    }
    assert!(!e.state().exists(), "refusals publish nothing");
    if !is_root() || Command::new("setpriv").arg("--version").output().is_err() {
        skip!("needs root (to have the privileges, and to drop them) and setpriv");
        return;
    }
    for t in ["xdp", "packet"] {
        let o = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", UIW, "up", "--transport", t, "--netdev", "eth9"])
            .env("UIW_STATE_DIR", e.state())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains(&format!("--transport {t}: needs CAP_NET_RAW")) && err.contains("use --transport tcp"), "{err}");
    }
    assert!(!e.state().exists(), "refusals publish nothing");
    // An Ethernet-like netdev faked through UIW_HOST_SYSFS.
    e.fake_host(false);
    let n = e.host.clone().unwrap().join("class/net/dummy9");
    fs::create_dir_all(&n).unwrap();
    for (f, v) in [("address", "02:00:00:00:00:09"), ("mtu", "1500"), ("ifindex", "99"), ("flags", "0x1003"), ("carrier", "1")] {
        fs::write(n.join(f), format!("{v}\n")).unwrap();
    }
    let transport = |e: &Env| fs::read_to_string(e.state().join("sysfs/class/infiniband/uiw_dummy9/uiw/transport")).unwrap();
    for t in ["xdp", "packet"] {
        e.ok(&["up", "--transport", t, "--netdev", "dummy9"]);
        assert_eq!(transport(&e), format!("{t}\n"));
        assert_eq!(e.ok(&["show"]), format!("link uiw_dummy9/1 state ACTIVE physical_state LINK_UP netdev dummy9 transport {t}\n"));
        e.ok(&["up"]);
        assert_eq!(transport(&e), format!("{t}\n"), "a refreshing up keeps the transport");
    }
    e.ok(&["up", "--netdev", "dummy9"]);
    assert_eq!(transport(&e), "tcp\n");
    e.ok(&["down"]);
}

// ---------------------------------------------------------------------------
// Against the real libibverbs and /dev/infiniband (root, provider built).

/// The built provider, if it registers with libibverbs (looks up verbs_register_driver_N).
fn real_provider() -> Option<PathBuf> {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut dirs: Vec<PathBuf> = std::env::var_os("UIW_LIBDIR").map(|l| std::env::split_paths(&l).collect()).unwrap_or_default();
    if let Ok(exe) = std::env::current_exe() {
        if let Some(p) = exe.parent().and_then(|d| d.parent()) {
            dirs.push(p.to_path_buf());
        }
    }
    dirs.push(ws.join("target/release"));
    dirs.push(ws.join("target/debug"));
    dirs.into_iter().map(|d| d.join("libuiw_rdmav34.so")).find(|p| {
        fs::read(p).map(|b| b.windows(22).any(|w| w == b"verbs_register_driver_")).unwrap_or(false)
    })
}

/// (Env using the real /dev/infiniband, lib dir) or None with the reason printed.
fn real_env(name: &str, tool: &str) -> Option<Env> {
    if !is_root() {
        skip!("needs root to create /dev/infiniband/uverbsN");
        return None;
    }
    if Command::new(tool).arg("--help").output().is_err() {
        skip!("{tool} not installed (apt install ibverbs-utils)");
        return None;
    }
    let Some(prov) = real_provider() else {
        skip!("provider libuiw_rdmav34.so registering with verbs_register_driver_N not built yet (cargo build -p uiw-provider)");
        return None;
    };
    let mut e = Env::new(name);
    e.real_dev = true;
    let dir = prov.parent().unwrap().to_path_buf();
    // the provider's dir first; the shim from wherever it was built
    let mut l = vec![dir.clone()];
    if let Ok(exe) = std::env::current_exe() {
        l.push(exe.parent().unwrap().parent().unwrap().to_path_buf());
    }
    e.libdir = Some(std::env::join_paths(l).unwrap().into());
    Some(e)
}

#[test]
fn ibv_devices_lists_uiw_lo() {
    let Some(e) = real_env("ibv_devices", "ibv_devices") else { return };
    e.ok(&["up"]);
    let o = e.run(&["run", "--", "ibv_devices"]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    e.ok(&["down"]);
    assert!(o.status.success(), "{out}\n{err}");
    let line = out.lines().find(|l| l.contains("uiw_lo")).unwrap_or_else(|| panic!("uiw_lo not listed:\n{out}\n{err}"));
    assert!(line.contains("7569775f6c6f0000"), "node GUID: {line}");
}

#[test]
fn ibv_devinfo_shows_uiw_lo() {
    let Some(e) = real_env("ibv_devinfo", "ibv_devinfo") else { return };
    e.ok(&["up"]);
    let o = e.run(&["run", "--", "ibv_devinfo", "-v", "-d", "uiw_lo"]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    e.ok(&["down"]);
    assert!(o.status.success(), "{out}\n{err}");
    for want in ["hca_id:\tuiw_lo", "transport:\t\t\tiWARP (1)", "node_guid:\t\t\t7569:775f:6c6f:0000", "board_id:\t\t\tuiw", "link_layer:\t\tEthernet", "GID[  0]:\t\t0000:0000:0000:0000:0000:ffff:7f00:0001"] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}\n{err}");
    }
}

/// libibverbs itself (with a do-nothing provider, tests/stub_provider.c) discovers the
/// tree and node `uiw up` makes: needs root, cc, libibverbs-dev and ibv_devices.
#[test]
fn libibverbs_discovers_the_tree() {
    if !is_root() {
        skip!("needs root to create /dev/infiniband/uverbsN");
        return;
    }
    if Command::new("ibv_devices").arg("--help").output().is_err() {
        skip!("ibv_devices not installed (apt install ibverbs-utils)");
        return;
    }
    let mut e = Env::new("stub");
    e.real_dev = true;
    let stub_dir = e.t.p("stub");
    fs::create_dir_all(&stub_dir).unwrap();
    let so = stub_dir.join("libuiwstub-rdmav34.so");
    let cc = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-shared", "-fPIC", "-Wall", "-Werror", "-o"])
        .arg(&so)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/stub_provider.c"))
        .arg("-libverbs")
        .output();
    match cc {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            skip!("cannot build the stub provider (libibverbs-dev?): {}", String::from_utf8_lossy(&o.stderr));
            return;
        }
        Err(_) => {
            skip!("no C compiler");
            return;
        }
    }
    e.ok(&["up"]);
    let st = e.state();
    let o = Command::new("ibv_devices")
        .env("SYSFS_PATH", st.join("sysfs"))
        .env("RDMAV_DRIVERS", stub_dir.join("libuiwstub"))
        .env("IBV_SHOW_WARNINGS", "1")
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    e.ok(&["down"]);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(
        out.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["uiw_lo", "7569775f6c6f0000"]),
        "ibv_devices did not list uiw_lo with its GUID:\n{out}\n{err}"
    );
}
