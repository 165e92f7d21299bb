//! Where things live. Every location has an environment override so tests can
//! run the real binary against temporary directories.

use std::fs;
use std::path::{Path, PathBuf};

pub const DEFAULT_STATE_DIR: &str = "/run/uiw";
pub const DEFAULT_DEV_DIR: &str = "/dev/infiniband";
pub const DEFAULT_REGISTRY: &str = "/run/uiw-nodes";
/// `<state>/lib/libuiw-rdmav34.so`: the first of the provider's names (see [`provider_links`]).
pub const PROVIDER_LINK: &str = "libuiw-rdmav34.so";

/// Every name libibverbs may load the provider under: `libuiw-rdmavN.so` for each private ABI
/// `N` of a supported rdma-core release (34 for v36–v56, 57, 59, 64, 65). One build serves them
/// all and picks the running libibverbs' layout when it is loaded.
pub fn provider_links() -> Vec<String> {
    uiw_kabi::version::PABIS.iter().map(|&p| uiw_kabi::version::provider_file_name("uiw", p)).collect()
}
pub const PRELOAD_NAME: &str = "libuiw_preload.so";
/// `<state>/lib/rdmacm/librdmacm.so.1`: the librdmacm drop-in, alone in its directory so
/// that `LD_LIBRARY_PATH` picks up nothing else.
pub const RDMACM_LINK: &str = "rdmacm/librdmacm.so.1";

#[derive(Debug, Clone)]
pub struct Paths {
    /// UIW_STATE_DIR / --state-dir, default /run/uiw
    pub state: PathBuf,
    /// UIW_DEV_DIR (testing only: libibverbs hard-codes /dev/infiniband)
    pub dev_dir: PathBuf,
    /// UIW_NODE_REGISTRY
    pub registry: PathBuf,
    /// UIW_HOST_SYSFS (testing only), default /sys: where kernel devices and netdevs are read
    pub host_sysfs: PathBuf,
    /// UIW_INSTALL_ROOT: a DESTDIR-like prefix for install/uninstall and install detection
    pub install_root: PathBuf,
}

fn env_path(var: &str) -> Option<PathBuf> {
    std::env::var_os(var).filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// Make a path absolute without resolving symlinks in it.
pub fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir().map(|c| c.join(p)).unwrap_or_else(|_| p.to_path_buf())
    }
}

/// The state directory of a user who is not root (rootless mode): `$XDG_RUNTIME_DIR/uiw`
/// (per-login tmpfs, like /run for root), else `$HOME/.local/state/uiw`, else
/// `/tmp/uiw-<uid>`.
pub fn user_state_dir() -> PathBuf {
    if let Some(d) = env_path("XDG_RUNTIME_DIR").filter(|d| d.is_absolute() && d.is_dir()) {
        return d.join("uiw");
    }
    if let Some(h) = env_path("HOME").filter(|h| h.is_absolute() && h.is_dir()) {
        return h.join(".local/state/uiw");
    }
    PathBuf::from(format!("/tmp/uiw-{}", uiw_kabi::sys::geteuid()))
}

/// The default state directory when neither `--state-dir` nor `UIW_STATE_DIR` names one:
/// /run/uiw for root; for other users their own [`user_state_dir`] — except that commands
/// which only use devices (`for_use`: show, env, run, stat) fall back to /run/uiw when the
/// user has published nothing and root has.
pub fn default_state_dir(for_use: bool) -> PathBuf {
    if uiw_kabi::sys::geteuid() == 0 {
        return DEFAULT_STATE_DIR.into();
    }
    let own = user_state_dir();
    if for_use && read_manifest(&own.join("devices")).is_empty() && !read_manifest(&Path::new(DEFAULT_STATE_DIR).join("devices")).is_empty() {
        return DEFAULT_STATE_DIR.into();
    }
    own
}

impl Paths {
    /// `for_use`: see [`default_state_dir`].
    pub fn from_env_for(state_override: Option<PathBuf>, for_use: bool) -> Paths {
        let state = absolute(&state_override.or_else(|| env_path("UIW_STATE_DIR")).unwrap_or_else(|| default_state_dir(for_use)));
        let dev_dir = absolute(&env_path("UIW_DEV_DIR").unwrap_or_else(|| DEFAULT_DEV_DIR.into()));
        let registry = env_path("UIW_NODE_REGISTRY").map(|p| absolute(&p)).unwrap_or_else(|| {
            if dev_dir == Path::new(DEFAULT_DEV_DIR) {
                DEFAULT_REGISTRY.into()
            } else {
                let mut s = dev_dir.as_os_str().to_owned();
                s.push(".uiw-nodes");
                PathBuf::from(s)
            }
        });
        Paths {
            state,
            dev_dir,
            registry,
            host_sysfs: env_path("UIW_HOST_SYSFS").unwrap_or_else(|| "/sys".into()),
            install_root: env_path("UIW_INSTALL_ROOT").unwrap_or_else(|| "/".into()),
        }
    }
    pub fn sysfs(&self) -> PathBuf {
        self.state.join("sysfs")
    }
    /// Statistics files of the processes using the devices (`uiw stat`).
    pub fn stats(&self) -> PathBuf {
        self.state.join("stats")
    }
    pub fn lib(&self) -> PathBuf {
        self.state.join("lib")
    }
    pub fn manifest(&self) -> PathBuf {
        self.state.join("devices")
    }
    pub fn node(&self, n: u32) -> PathBuf {
        self.dev_dir.join(format!("uverbs{n}"))
    }
    /// A path under the install root.
    pub fn rooted(&self, p: &str) -> PathBuf {
        self.install_root.join(p.trim_start_matches('/'))
    }
}

/// One published device, as recorded in `<state>/devices`:
/// `<ibdev> <netdev> uverbs<N> [rootless]` per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub ibdev: String,
    pub netdev: String,
    pub uverbs: u32,
    /// Published without a /dev/infiniband node (rootless mode): the shim answers for it,
    /// and the node registry does not know this state directory.
    pub rootless: bool,
    /// What carries its QPs' streams (`uiw up --transport`): `tcp`, `xdp` or `packet`.
    pub transport: String,
}

pub fn read_manifest(path: &Path) -> Vec<Entry> {
    let Ok(s) = fs::read_to_string(path) else { return Vec::new() };
    s.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let ibdev = it.next()?.to_string();
            let netdev = it.next()?.to_string();
            let uverbs = it.next()?.strip_prefix("uverbs")?.parse().ok()?;
            let mut rootless = false;
            let mut transport = "tcp".to_string();
            for w in it {
                match w {
                    "rootless" => rootless = true,
                    _ => {
                        if let Some(t) = w.strip_prefix("transport=") {
                            transport = t.to_string();
                        }
                    }
                }
            }
            Some(Entry { ibdev, netdev, uverbs, rootless, transport })
        })
        .collect()
}

pub fn write_manifest(path: &Path, entries: &[Entry]) -> std::io::Result<()> {
    let mut s = String::from("# uiw devices published from this state dir: <ibdev> <netdev> <uverbs node> [rootless] [transport=T]\n");
    for e in entries {
        let transport = if e.transport == "tcp" { String::new() } else { format!(" transport={}", e.transport) };
        s.push_str(&format!("{} {} uverbs{}{}{transport}\n", e.ibdev, e.netdev, e.uverbs, if e.rootless { " rootless" } else { "" }));
    }
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, s)?;
    fs::rename(&tmp, path)
}

/// Does the state dir at `state` currently use node `node` ("uverbsN")?
pub fn manifest_lists(state: &Path, node: &str) -> bool {
    read_manifest(&state.join("devices")).iter().any(|e| !e.rootless && format!("uverbs{}", e.uverbs) == node)
}
