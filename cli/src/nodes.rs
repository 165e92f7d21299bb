//! `/dev/infiniband/uverbsN` nodes and who uses them.
//!
//! A uiw node is stateless: a character device with /dev/null's numbers (1:3),
//! or a symlink to /dev/null where mknod is refused (containers). libibverbs
//! only needs it to exist, open O_RDWR, be S_ISCHR and match `uverbsN/dev`.
//! Several state dirs (the default /run/uiw, test dirs) may share one node, so
//! ownership is kept in a registry (default /run/uiw-nodes):
//! `<registry>/uverbsN/<key>` holds the path of each state dir using the node,
//! and the node is removed only when the last user lets go. Every up/down holds
//! an exclusive flock on `<registry>/.lock` for its whole duration.

use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub struct Registry {
    pub dir: PathBuf,
    _lock: fs::File,
}

impl Registry {
    /// Create (mode 1777, like /tmp: any user may register a node it uses) and lock.
    pub fn open_locked(dir: &Path) -> io::Result<Registry> {
        if !dir.exists() {
            fs::create_dir_all(dir)?;
            let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o1777));
        }
        let lockp = dir.join(".lock");
        let f = fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&lockp)
            .or_else(|_| fs::File::open(&lockp))?;
        let _ = fs::set_permissions(&lockp, fs::Permissions::from_mode(0o666));
        uiw_kabi::sys::lock_exclusive(&f)?;
        Ok(Registry { dir: dir.to_path_buf(), _lock: f })
    }

    fn users_dir(&self, node: &str) -> PathBuf {
        self.dir.join(node)
    }

    pub fn register(&self, node: &str, state: &Path) -> io::Result<()> {
        let d = self.users_dir(node);
        fs::create_dir_all(&d)?;
        let _ = fs::set_permissions(&d, fs::Permissions::from_mode(0o1777));
        fs::write(d.join(key(state)), format!("{}\n", state.display()))
    }

    pub fn unregister(&self, node: &str, state: &Path) {
        let _ = fs::remove_file(self.users_dir(node).join(key(state)));
    }

    /// State dirs registered for `node`, after dropping entries whose state dir no longer
    /// lists the node in its manifest (crashed runs, deleted temp dirs).
    pub fn users(&self, node: &str) -> Vec<PathBuf> {
        let d = self.users_dir(node);
        let mut out = Vec::new();
        let Ok(rd) = fs::read_dir(&d) else { return out };
        for e in rd.flatten() {
            let Ok(s) = fs::read_to_string(e.path()) else { continue };
            let state = PathBuf::from(s.trim_end());
            if crate::state::manifest_lists(&state, node) {
                out.push(state);
            } else {
                let _ = fs::remove_file(e.path());
            }
        }
        if out.is_empty() {
            let _ = fs::remove_dir(&d);
        }
        out
    }
}

/// Registry file name for a state dir.
pub fn key(state: &Path) -> String {
    format!("{:016x}", crate::tree::fnv1a64(state.as_os_str().as_bytes()))
}

#[derive(Debug, PartialEq, Eq)]
pub enum Shape {
    Absent,
    /// char device 1:3 or a symlink to /dev/null
    Uiw,
    /// anything else (a real kernel node, a user's file): never touch
    Foreign,
}

pub fn shape(p: &Path) -> Shape {
    match fs::symlink_metadata(p) {
        Err(_) => Shape::Absent,
        Ok(m) => {
            if m.file_type().is_symlink() {
                match fs::read_link(p) {
                    Ok(t) if t == Path::new("/dev/null") => Shape::Uiw,
                    _ => Shape::Foreign,
                }
            } else if m.file_type().is_char_device() && m.rdev() == libc::makedev(1, 3) {
                Shape::Uiw
            } else {
                Shape::Foreign
            }
        }
    }
}

#[derive(Debug)]
pub enum NodeError {
    NeedRoot(PathBuf),
    Io(PathBuf, io::Error),
}

fn is_perm(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS))
}

/// Make sure a uiw node exists at `p`; returns its (major, minor) as stat(2) sees it.
pub fn ensure(p: &Path) -> Result<(u32, u32), NodeError> {
    let dir = p.parent().unwrap_or(Path::new("/"));
    if !dir.exists() {
        if let Err(e) = fs::create_dir_all(dir) {
            return Err(if is_perm(&e) { NodeError::NeedRoot(p.into()) } else { NodeError::Io(dir.into(), e) });
        }
        let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o755));
    }
    match shape(p) {
        Shape::Uiw => {}
        Shape::Foreign => {
            return Err(NodeError::Io(p.into(), io::Error::new(io::ErrorKind::AlreadyExists, "exists and is not a uiw node")))
        }
        Shape::Absent => create(p)?,
    }
    let m = fs::metadata(p).map_err(|e| NodeError::Io(p.into(), e))?;
    let rdev = m.rdev();
    Ok((libc::major(rdev), libc::minor(rdev)))
}

fn create(p: &Path) -> Result<(), NodeError> {
    if uiw_kabi::sys::mknod_char(p, 0o666, 1, 3).is_ok() {
        let _ = fs::set_permissions(p, fs::Permissions::from_mode(0o666));
        // On a nodev mount the node exists but cannot be opened: use a symlink there.
        if fs::OpenOptions::new().read(true).write(true).open(p).is_ok() {
            return Ok(());
        }
        let _ = fs::remove_file(p);
    } else {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EEXIST) && shape(p) == Shape::Uiw {
            return Ok(());
        }
        if e.raw_os_error() == Some(libc::EACCES) {
            return Err(NodeError::NeedRoot(p.into()));
        }
        // EPERM: no CAP_MKNOD (containers, non-root). Fall through to the symlink.
    }
    match std::os::unix::fs::symlink("/dev/null", p) {
        Ok(()) => Ok(()),
        Err(e) if is_perm(&e) => Err(NodeError::NeedRoot(p.into())),
        Err(e) => Err(NodeError::Io(p.into(), e)),
    }
}

/// Remove `p` if (and only if) it is a uiw node; then the directory, if empty.
pub fn remove(p: &Path) {
    if shape(p) == Shape::Uiw {
        let _ = fs::remove_file(p);
    }
    if let Some(dir) = p.parent() {
        let _ = fs::remove_dir(dir); // only succeeds when empty
    }
}
