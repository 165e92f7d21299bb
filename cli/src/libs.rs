//! Finding the provider (`libuiw_rdmav34.so`, installed as `libuiw-rdmavN.so` for every
//! private ABI N it serves), the preload shim (`libuiw_preload.so`) and libibverbs' provider
//! directory.

use crate::state::Paths;
use std::path::{Path, PathBuf};

pub const PROVIDER_FILES: &[&str] = &["libuiw_rdmav34.so", "libuiw-rdmav34.so"];
pub const PRELOAD_FILES: &[&str] = &["libuiw_preload.so"];
/// The librdmacm drop-in as cargo names it (its SONAME is librdmacm.so.1), then as
/// installed (`uiw install`, the Debian package): `<libdir>/uiw/rdmacm/librdmacm.so.1`.
pub const RDMACM_FILES: &[&str] = &["libuiw_rdmacm.so", "rdmacm/librdmacm.so.1"];

/// Directories searched, in order:
/// 1. each entry of `UIW_LIBDIR` (colon-separated),
/// 2. the directory of the running `uiw` binary (cargo puts all artefacts of a
///    profile side by side), then `<bindir>/../lib/uiw` (an installed layout),
/// 3. libibverbs' provider directories and their `../uiw` (after `uiw install`),
/// 4. this source tree's `target/release` and `target/debug`, newest first.
pub fn search_dirs(paths: &Paths) -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(l) = std::env::var_os("UIW_LIBDIR") {
        v.extend(std::env::split_paths(&l).filter(|p| !p.as_os_str().is_empty()));
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(d) = exe.parent() {
            v.push(d.to_path_buf());
            v.push(d.join("../lib/uiw"));
        }
    }
    for d in provider_dir_candidates(paths) {
        v.push(d.join("../uiw"));
        v.push(d);
    }
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut t: Vec<PathBuf> = vec![ws.join("target/release"), ws.join("target/debug")];
    let mtime = |p: &PathBuf| {
        PROVIDER_FILES
            .iter()
            .filter_map(|f| std::fs::metadata(p.join(f)).and_then(|m| m.modified()).ok())
            .max()
    };
    t.sort_by_key(|p| std::cmp::Reverse(mtime(p)));
    v.extend(t);
    v
}

pub fn find(paths: &Paths, names: &[&str]) -> Option<PathBuf> {
    for d in search_dirs(paths) {
        for n in names {
            let p = d.join(n);
            if p.is_file() {
                return Some(std::fs::canonicalize(&p).unwrap_or(p));
            }
        }
    }
    None
}

/// Where libibverbs may look for `lib<name>-rdmavN.so` (under the install root).
pub fn provider_dir_candidates(paths: &Paths) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = Vec::new();
    if let Ok(out) = std::process::Command::new("pkg-config")
        .args(["--variable=libdir", "libibverbs"])
        .stderr(std::process::Stdio::null())
        .output()
    {
        let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if out.status.success() && s.starts_with('/') {
            v.push(paths.rooted(&format!("{s}/libibverbs")));
        }
    }
    let triple = format!("{}-linux-gnu", std::env::consts::ARCH);
    for d in [
        format!("/usr/lib/{triple}/libibverbs"),
        "/usr/lib64/libibverbs".into(),
        "/usr/lib/libibverbs".into(),
        "/usr/local/lib/libibverbs".into(),
    ] {
        let p = paths.rooted(&d);
        if !v.contains(&p) {
            v.push(p);
        }
    }
    v
}

/// Whether `name` is a provider file name, `lib<name>-rdmav<N>.so` (N: 34 for rdma-core
/// v36–v56, 57, 59, 64, 65 after it, and whatever later releases use).
pub fn is_provider_file_name(name: &str) -> bool {
    name.starts_with("lib")
        && name
            .strip_suffix(".so")
            .and_then(|s| s.rsplit_once("-rdmav"))
            .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The directory holding libibverbs' providers: the first candidate containing a
/// `lib*-rdmavN.so`, else the first that exists.
pub fn provider_dir(paths: &Paths) -> Option<PathBuf> {
    let c = provider_dir_candidates(paths);
    let has_provider = |d: &PathBuf| {
        std::fs::read_dir(d)
            .map(|rd| rd.flatten().any(|e| is_provider_file_name(&e.file_name().to_string_lossy())))
            .unwrap_or(false)
    };
    c.iter().find(|d| has_provider(d)).or_else(|| c.iter().find(|d| d.is_dir())).cloned()
}

/// Installed system-wide: `/etc/libibverbs.d/uiw.driver` exists and a provider
/// directory holds the provider under every name (`libuiw-rdmavN.so`), so that the running
/// libibverbs, whatever its release, finds it.
pub fn installed(paths: &Paths) -> Option<PathBuf> {
    if !paths.rooted("/etc/libibverbs.d/uiw.driver").is_file() {
        return None;
    }
    let links = crate::state::provider_links();
    provider_dir_candidates(paths)
        .into_iter()
        .find(|d| links.iter().all(|n| d.join(n).is_file()))
        .map(|d| d.join(crate::state::PROVIDER_LINK))
}

#[cfg(test)]
mod tests {
    use super::is_provider_file_name;

    #[test]
    fn provider_file_names_of_every_private_abi() {
        for n in ["librxe-rdmav34.so", "libmlx5-rdmav65.so", "libuiw-rdmav57.so", "libsiw-rdmav100.so"] {
            assert!(is_provider_file_name(n), "{n}");
        }
        for n in ["librxe-rdmav.so", "libuiw_rdmav34.so", "librxe-rdmav34.so.1", "rxe-rdmav34.so", "libx-rdmavX.so"] {
            assert!(!is_provider_file_name(n), "{n}");
        }
    }
}
