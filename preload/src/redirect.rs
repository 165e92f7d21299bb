//! Rootless mode: the filesystem answers libibverbs and sysfs readers expect.
//!
//! While `SYSFS_PATH` names a published uiw tree (what `uiw run` sets), this module
//!
//! 1. redirects `/sys/class/infiniband` and `/sys/class/infiniband_verbs` (and
//!    everything below them) to `$SYSFS_PATH/class/...`, so programs that read sysfs
//!    themselves — rdma-core's `tests/base.py`, hwloc, Open MPI, UCX, `ls` — see the
//!    same devices libibverbs sees (kernel devices are mirrored there as symlinks);
//! 2. answers `/dev/infiniband/uverbsN` when that node does **not exist** and the
//!    published tree says `uverbsN` is a uiw device (a directory, not a mirrored
//!    kernel symlink): `stat` reports `/dev/null` (char 1:3, what `uverbsN/dev`
//!    says) and `open` opens `/dev/null` — the fd libibverbs asked for, which the
//!    provider takes as its `cmd_fd`. Existing nodes (kernel or uiw) are never
//!    touched: the real call is made first and only an `ENOENT` is answered.
//!
//! Interposed: `open`, `open64`, `openat`, `openat64`, `__open_2`, `__open64_2`,
//! `__openat_2`, `__openat64_2`, `stat`, `stat64`, `lstat`, `lstat64`, `fstatat`,
//! `fstatat64`, `__xstat`, `__xstat64`, `__lxstat`, `__lxstat64`, `__fxstatat`,
//! `__fxstatat64`, `statx`, `access`, `faccessat`, `readlink`, `readlinkat`,
//! `opendir`, `scandir`, `scandir64`, `fopen`, `fopen64`, `realpath`, `__realpath_chk`,
//! `canonicalize_file_name`, `getxattr`, `lgetxattr`, `listxattr`, `llistxattr`. A path relative to a directory fd (hwloc opens
//! `sys/class/infiniband` relative to its `/` fd) is resolved through
//! `/proc/self/fd` — only when it mentions `infiniband`.
//!
//! Not covered (documented limits): `chdir` into the class directory, `nftw`/`fts`
//! (glibc-internal calls), programs that issue system calls themselves, static binaries.
//!
//! Everything here is async-signal-safe: no allocation, no locks, stack buffers only — and
//! those only for a path that mentions `infiniband` (others cost one scan of the path).
//! `SYSFS_PATH` is read once, in the library constructor.

use core::cell::UnsafeCell;
use core::ffi::{c_char, c_int, c_uint, c_void};
use core::sync::atomic::{AtomicUsize, Ordering};

const PATH_MAX: usize = 4096;
const SYS_CLASS_IB: &[u8] = b"/sys/class/infiniband";
const DEV_UVERBS: &[u8] = b"/dev/infiniband/uverbs";
const DEV_NULL: &[u8] = b"/dev/null\0";

/// `$SYSFS_PATH` without trailing slashes (set once, in the constructor, before any
/// thread exists; read-only afterwards).
struct Root(UnsafeCell<[u8; 512]>);
// SAFETY: written only by `init` (the ELF constructor, single-threaded), read-only after.
unsafe impl Sync for Root {}
static ROOT: Root = Root(UnsafeCell::new([0; 512]));
/// Length of `ROOT`; 0 = no redirection.
static ROOT_LEN: AtomicUsize = AtomicUsize::new(0);

fn root() -> Option<&'static [u8]> {
    let n = ROOT_LEN.load(Ordering::Acquire);
    if n == 0 {
        return None;
    }
    // SAFETY: ROOT is not written after ROOT_LEN was published (Release in `init`).
    Some(unsafe { &(&*ROOT.0.get())[..n] })
}

/// Called from the library constructor.
pub fn init() {
    // SAFETY: getenv with a NUL-terminated name; the result is copied, not kept.
    let p = unsafe { libc::getenv(b"SYSFS_PATH\0".as_ptr() as *const c_char) };
    if p.is_null() {
        return;
    }
    // SAFETY: getenv returned a NUL-terminated string.
    let s = unsafe { core::ffi::CStr::from_ptr(p) }.to_bytes();
    let mut n = s.len();
    while n > 1 && s[n - 1] == b'/' {
        n -= 1;
    }
    let s = &s[..n];
    // Relative or the real /sys: nothing to redirect.
    if s.first() != Some(&b'/') || s == b"/sys" || n >= 512 - 64 {
        return;
    }
    // SAFETY: single-threaded constructor; nothing reads ROOT before ROOT_LEN is set.
    unsafe { (&mut *ROOT.0.get())[..n].copy_from_slice(s) };
    ROOT_LEN.store(n, Ordering::Release);
}

/// A NUL-terminated path in a stack buffer of `N` bytes.
pub struct PathBuf<const N: usize = PATH_MAX> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> PathBuf<N> {
    fn new() -> PathBuf<N> {
        PathBuf { buf: [0; N], len: 0 }
    }
    fn push(&mut self, b: &[u8]) -> bool {
        if self.len + b.len() + 1 > N {
            return false;
        }
        self.buf[self.len..self.len + b.len()].copy_from_slice(b);
        self.len += b.len();
        self.buf[self.len] = 0;
        true
    }
    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
    pub fn as_ptr(&self) -> *const c_char {
        self.buf.as_ptr() as *const c_char
    }
}

/// The bytes of a C string (without its NUL), at most PATH_MAX.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn cbytes<'a>(p: *const c_char) -> Option<&'a [u8]> {
    if p.is_null() {
        return None;
    }
    let mut n = 0;
    // SAFETY: the caller promises a NUL-terminated string; we stop at the NUL.
    while n < PATH_MAX && unsafe { *p.add(n) } != 0 {
        n += 1;
    }
    // SAFETY: the n bytes before the NUL are readable.
    Some(unsafe { core::slice::from_raw_parts(p as *const u8, n) })
}

fn contains(h: &[u8], n: &[u8]) -> bool {
    h.windows(n.len()).any(|w| w == n)
}

/// `/sys/class/infiniband{,_verbs}[/...]` → `$SYSFS_PATH/class/infiniband{,_verbs}[/...]`.
fn rewrite_abs(path: &[u8], out: &mut PathBuf) -> bool {
    let Some(root) = root() else { return false };
    let Some(rest) = path.strip_prefix(SYS_CLASS_IB) else { return false };
    let tail = rest.strip_prefix(b"_verbs").unwrap_or(rest);
    if !(tail.is_empty() || tail[0] == b'/') {
        return false; // infiniband_mad, infiniband_cm, ...: not published
    }
    out.len = 0;
    out.push(root) && out.push(b"/class/infiniband") && out.push(rest)
}

/// The absolute form of `path` relative to `dirfd` (AT_FDCWD: the working directory),
/// when it might name something under /sys/class/infiniband.
fn absolute_at(dirfd: c_int, path: &[u8], out: &mut PathBuf) -> bool {
    out.len = 0;
    if path.first() == Some(&b'/') {
        return out.push(path);
    }
    if !contains(path, b"infiniband") {
        return false;
    }
    let n = if dirfd == libc::AT_FDCWD {
        // SAFETY: raw getcwd(2) into our buffer.
        let r = unsafe { libc::syscall(libc::SYS_getcwd, out.buf.as_mut_ptr(), PATH_MAX) };
        if r <= 0 {
            return false;
        }
        // the kernel's getcwd returns the length including the NUL
        (r as usize).saturating_sub(1)
    } else {
        let mut link = PathBuf::<32>::new();
        let mut num = [0u8; 12];
        let mut i = num.len();
        let mut v = dirfd as u32;
        loop {
            i -= 1;
            num[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        if dirfd < 0 || !(link.push(b"/proc/self/fd/") && link.push(&num[i..])) {
            return false;
        }
        // SAFETY: raw readlinkat(2) of a NUL-terminated path into our buffer.
        let r = unsafe {
            libc::syscall(libc::SYS_readlinkat, libc::AT_FDCWD, link.as_ptr(), out.buf.as_mut_ptr(), PATH_MAX - 1)
        };
        if r <= 0 {
            return false;
        }
        r as usize
    };
    if n == 0 || n >= PATH_MAX || out.buf[0] != b'/' {
        return false;
    }
    out.len = n;
    out.buf[n] = 0;
    if n > 1 && !out.push(b"/") {
        return false;
    }
    out.push(path)
}

/// The path to use instead of (`dirfd`, `p`), if it is to be redirected to the tree.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
pub unsafe fn redirect_at(dirfd: c_int, p: *const c_char, out: &mut PathBuf) -> bool {
    if root().is_none() {
        return false;
    }
    // SAFETY: forwarded caller promise.
    let Some(path) = (unsafe { cbytes(p) }) else { return false };
    if !contains(path, b"infiniband") {
        return false;
    }
    let mut abs = PathBuf::new();
    absolute_at(dirfd, path, &mut abs) && rewrite_abs(abs.bytes(), out)
}

/// Is (`dirfd`, `p`) `/dev/infiniband/uverbsN` of a device the published tree calls a uiw
/// device? (Asked only after the real call failed with ENOENT.)
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
pub unsafe fn is_uiw_node(dirfd: c_int, p: *const c_char) -> bool {
    let Some(root) = root() else { return false };
    // SAFETY: forwarded caller promise.
    let Some(path) = (unsafe { cbytes(p) }) else { return false };
    let mut abs = PathBuf::new();
    if !absolute_at(dirfd, path, &mut abs) {
        return false;
    }
    let Some(num) = abs.bytes().strip_prefix(DEV_UVERBS) else { return false };
    if num.is_empty() || num.len() > 6 || !num.iter().all(u8::is_ascii_digit) {
        return false;
    }
    let mut dir = PathBuf::<576>::new();
    if !(dir.push(root) && dir.push(b"/class/infiniband_verbs/uverbs") && dir.push(num)) {
        return false;
    }
    // SAFETY: an all-zero stat is a valid out-buffer; raw fstatat(2) without following a
    // final symlink: mirrored kernel devices are symlinks, uiw devices directories.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    let r = unsafe {
        libc::syscall(libc::SYS_newfstatat, libc::AT_FDCWD, dir.as_ptr(), &mut st as *mut libc::stat, libc::AT_SYMLINK_NOFOLLOW)
    };
    r == 0 && st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

pub fn dev_null() -> *const c_char {
    DEV_NULL.as_ptr() as *const c_char
}

fn errno() -> c_int {
    // SAFETY: this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Runs `call(path)` with the redirected path, or with the original one; if that fails with
/// ENOENT on an absent uiw node, runs it again on /dev/null.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string; `call` is safe to call with either path.
#[inline]
pub unsafe fn with_path<R: Copy + PartialEq>(dirfd: c_int, p: *const c_char, fail: R, call: impl Fn(*const c_char) -> R) -> R {
    // The common case costs one scan of the path and no stack: nothing to redirect, or a path
    // that cannot name /sys/class/infiniband* or /dev/infiniband/*.
    // SAFETY: forwarded caller promise.
    if root().is_none() || !unsafe { cbytes(p) }.is_some_and(|b| contains(b, b"infiniband")) {
        return call(p);
    }
    // SAFETY: forwarded caller promise.
    unsafe { with_path_slow(dirfd, p, fail, call) }
}

/// [`with_path`] for a path that mentions `infiniband` (about 12 KiB of stack).
#[inline(never)]
unsafe fn with_path_slow<R: Copy + PartialEq>(dirfd: c_int, p: *const c_char, fail: R, call: impl Fn(*const c_char) -> R) -> R {
    let mut buf = PathBuf::new();
    // SAFETY: forwarded caller promise.
    if unsafe { redirect_at(dirfd, p, &mut buf) } {
        return call(buf.as_ptr());
    }
    let r = call(p);
    // SAFETY: forwarded caller promise.
    if r == fail && errno() == libc::ENOENT && unsafe { is_uiw_node(dirfd, p) } {
        return call(dev_null());
    }
    r
}

// ---- the real functions ----

static R_OPEN: AtomicUsize = AtomicUsize::new(0);
static R_OPEN64: AtomicUsize = AtomicUsize::new(0);
static R_OPENAT: AtomicUsize = AtomicUsize::new(0);
static R_OPENAT64: AtomicUsize = AtomicUsize::new(0);
static R_ACCESS: AtomicUsize = AtomicUsize::new(0);
static R_FACCESSAT: AtomicUsize = AtomicUsize::new(0);
static R_OPENDIR: AtomicUsize = AtomicUsize::new(0);
static R_FOPEN: AtomicUsize = AtomicUsize::new(0);
static R_FOPEN64: AtomicUsize = AtomicUsize::new(0);
static R_REALPATH: AtomicUsize = AtomicUsize::new(0);
static R_REALPATH_CHK: AtomicUsize = AtomicUsize::new(0);
static R_CANONICALIZE: AtomicUsize = AtomicUsize::new(0);
static R_SCANDIR: AtomicUsize = AtomicUsize::new(0);
static R_SCANDIR64: AtomicUsize = AtomicUsize::new(0);

/// Resolves every real function at load time (dlsym is not async-signal-safe).
pub fn resolve_all() {
    for (c, n) in [
        (&R_OPEN, &b"open\0"[..]),
        (&R_OPEN64, b"open64\0"),
        (&R_OPENAT, b"openat\0"),
        (&R_OPENAT64, b"openat64\0"),
        (&R_ACCESS, b"access\0"),
        (&R_FACCESSAT, b"faccessat\0"),
        (&R_OPENDIR, b"opendir\0"),
        (&R_FOPEN, b"fopen\0"),
        (&R_FOPEN64, b"fopen64\0"),
        (&R_REALPATH, b"realpath\0"),
        (&R_REALPATH_CHK, b"__realpath_chk\0"),
        (&R_CANONICALIZE, b"canonicalize_file_name\0"),
        (&R_SCANDIR, b"scandir\0"),
        (&R_SCANDIR64, b"scandir64\0"),
    ] {
        crate::resolve(c, n);
    }
}

macro_rules! real {
    ($cache:ident, $name:literal, $ty:ty) => {{
        let f = crate::resolve(&$cache, concat!($name, "\0").as_bytes());
        if f == usize::MAX {
            None
        } else {
            // SAFETY: f is the next definition of this libc function, of this type.
            Some(unsafe { core::mem::transmute::<usize, $ty>(f) })
        }
    }};
}

fn enosys<R>(v: R) -> R {
    // SAFETY: this thread's errno slot.
    unsafe { *libc::__errno_location() = libc::ENOSYS };
    v
}

type OpenFn = unsafe extern "C" fn(*const c_char, c_int, c_uint) -> c_int;
type OpenatFn = unsafe extern "C" fn(c_int, *const c_char, c_int, c_uint) -> c_int;

/// open(2). The mode is read as the third argument: callers of the variadic `open` pass
/// it in the same register (x86_64 and aarch64 Linux calling conventions).
#[no_mangle]
pub unsafe extern "C" fn open(p: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    let real = real!(R_OPEN, "open", OpenFn);
    // SAFETY: forwarding the caller's arguments to libc's open.
    unsafe { with_path(libc::AT_FDCWD, p, -1, |q| real.map_or_else(|| enosys(-1), |f| f(q, flags, mode))) }
}

#[no_mangle]
pub unsafe extern "C" fn open64(p: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    let real = real!(R_OPEN64, "open64", OpenFn);
    // SAFETY: as open.
    unsafe { with_path(libc::AT_FDCWD, p, -1, |q| real.map_or_else(|| enosys(-1), |f| f(q, flags, mode))) }
}

#[no_mangle]
pub unsafe extern "C" fn openat(dirfd: c_int, p: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    let real = real!(R_OPENAT, "openat", OpenatFn);
    // SAFETY: as open; a redirected path is absolute, so dirfd no longer matters.
    unsafe { with_path(dirfd, p, -1, |q| real.map_or_else(|| enosys(-1), |f| f(dirfd, q, flags, mode))) }
}

#[no_mangle]
pub unsafe extern "C" fn openat64(dirfd: c_int, p: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    let real = real!(R_OPENAT64, "openat64", OpenatFn);
    // SAFETY: as openat.
    unsafe { with_path(dirfd, p, -1, |q| real.map_or_else(|| enosys(-1), |f| f(dirfd, q, flags, mode))) }
}

/// `_FORTIFY_SOURCE` forms (no O_CREAT, so no mode).
#[no_mangle]
pub unsafe extern "C" fn __open_2(p: *const c_char, flags: c_int) -> c_int {
    // SAFETY: as open.
    unsafe { open(p, flags, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn __open64_2(p: *const c_char, flags: c_int) -> c_int {
    // SAFETY: as open64.
    unsafe { open64(p, flags, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn __openat_2(dirfd: c_int, p: *const c_char, flags: c_int) -> c_int {
    // SAFETY: as openat.
    unsafe { openat(dirfd, p, flags, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn __openat64_2(dirfd: c_int, p: *const c_char, flags: c_int) -> c_int {
    // SAFETY: as openat64.
    unsafe { openat64(dirfd, p, flags, 0) }
}

/// The stat family, all as the raw `newfstatat` system call (which is what glibc ≥ 2.33
/// does on 64-bit Linux; `struct stat` and `struct stat64` are the kernel's there).
unsafe fn fstatat_raw(dirfd: c_int, p: *const c_char, buf: *mut c_void, flags: c_int) -> c_int {
    // SAFETY: forwarding the caller's arguments to the system call.
    unsafe {
        with_path(dirfd, p, -1, |q| {
            let r = libc::syscall(libc::SYS_newfstatat, dirfd, q, buf, flags);
            if r < 0 {
                -1
            } else {
                0
            }
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn stat(p: *const c_char, buf: *mut c_void) -> c_int {
    // SAFETY: caller's arguments.
    unsafe { fstatat_raw(libc::AT_FDCWD, p, buf, 0) }
}
#[no_mangle]
pub unsafe extern "C" fn stat64(p: *const c_char, buf: *mut c_void) -> c_int {
    // SAFETY: caller's arguments.
    unsafe { fstatat_raw(libc::AT_FDCWD, p, buf, 0) }
}
#[no_mangle]
pub unsafe extern "C" fn lstat(p: *const c_char, buf: *mut c_void) -> c_int {
    // SAFETY: caller's arguments.
    unsafe { fstatat_raw(libc::AT_FDCWD, p, buf, libc::AT_SYMLINK_NOFOLLOW) }
}
#[no_mangle]
pub unsafe extern "C" fn lstat64(p: *const c_char, buf: *mut c_void) -> c_int {
    // SAFETY: caller's arguments.
    unsafe { fstatat_raw(libc::AT_FDCWD, p, buf, libc::AT_SYMLINK_NOFOLLOW) }
}
#[no_mangle]
pub unsafe extern "C" fn fstatat(dirfd: c_int, p: *const c_char, buf: *mut c_void, flags: c_int) -> c_int {
    // SAFETY: caller's arguments.
    unsafe { fstatat_raw(dirfd, p, buf, flags) }
}
#[no_mangle]
pub unsafe extern "C" fn fstatat64(dirfd: c_int, p: *const c_char, buf: *mut c_void, flags: c_int) -> c_int {
    // SAFETY: caller's arguments.
    unsafe { fstatat_raw(dirfd, p, buf, flags) }
}
/// Pre-2.33 glibc binaries call these (`ver` is _STAT_VER, the kernel layout on 64-bit).
#[no_mangle]
pub unsafe extern "C" fn __xstat(_ver: c_int, p: *const c_char, buf: *mut c_void) -> c_int {
    // SAFETY: caller's arguments.
    unsafe { fstatat_raw(libc::AT_FDCWD, p, buf, 0) }
}
#[no_mangle]
pub unsafe extern "C" fn __xstat64(_ver: c_int, p: *const c_char, buf: *mut c_void) -> c_int {
    // SAFETY: caller's arguments.
    unsafe { fstatat_raw(libc::AT_FDCWD, p, buf, 0) }
}
#[no_mangle]
pub unsafe extern "C" fn __lxstat(_ver: c_int, p: *const c_char, buf: *mut c_void) -> c_int {
    // SAFETY: caller's arguments.
    unsafe { fstatat_raw(libc::AT_FDCWD, p, buf, libc::AT_SYMLINK_NOFOLLOW) }
}
#[no_mangle]
pub unsafe extern "C" fn __lxstat64(_ver: c_int, p: *const c_char, buf: *mut c_void) -> c_int {
    // SAFETY: caller's arguments.
    unsafe { fstatat_raw(libc::AT_FDCWD, p, buf, libc::AT_SYMLINK_NOFOLLOW) }
}
#[no_mangle]
pub unsafe extern "C" fn __fxstatat(_ver: c_int, dirfd: c_int, p: *const c_char, buf: *mut c_void, flags: c_int) -> c_int {
    // SAFETY: caller's arguments.
    unsafe { fstatat_raw(dirfd, p, buf, flags) }
}
#[no_mangle]
pub unsafe extern "C" fn __fxstatat64(_ver: c_int, dirfd: c_int, p: *const c_char, buf: *mut c_void, flags: c_int) -> c_int {
    // SAFETY: caller's arguments.
    unsafe { fstatat_raw(dirfd, p, buf, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn statx(dirfd: c_int, p: *const c_char, flags: c_int, mask: c_uint, buf: *mut c_void) -> c_int {
    // SAFETY: forwarding the caller's arguments to the system call.
    unsafe {
        with_path(dirfd, p, -1, |q| {
            if libc::syscall(libc::SYS_statx, dirfd, q, flags, mask, buf) < 0 {
                -1
            } else {
                0
            }
        })
    }
}

type AccessFn = unsafe extern "C" fn(*const c_char, c_int) -> c_int;
type FaccessatFn = unsafe extern "C" fn(c_int, *const c_char, c_int, c_int) -> c_int;

#[no_mangle]
pub unsafe extern "C" fn access(p: *const c_char, mode: c_int) -> c_int {
    let real = real!(R_ACCESS, "access", AccessFn);
    // SAFETY: forwarding the caller's arguments to libc's access.
    unsafe { with_path(libc::AT_FDCWD, p, -1, |q| real.map_or_else(|| enosys(-1), |f| f(q, mode))) }
}

#[no_mangle]
pub unsafe extern "C" fn faccessat(dirfd: c_int, p: *const c_char, mode: c_int, flags: c_int) -> c_int {
    let real = real!(R_FACCESSAT, "faccessat", FaccessatFn);
    // SAFETY: forwarding the caller's arguments to libc's faccessat.
    unsafe { with_path(dirfd, p, -1, |q| real.map_or_else(|| enosys(-1), |f| f(dirfd, q, mode, flags))) }
}

#[no_mangle]
pub unsafe extern "C" fn readlink(p: *const c_char, buf: *mut c_char, len: usize) -> isize {
    // SAFETY: forwarding the caller's arguments to the system call.
    unsafe { readlinkat(libc::AT_FDCWD, p, buf, len) }
}

#[no_mangle]
pub unsafe extern "C" fn readlinkat(dirfd: c_int, p: *const c_char, buf: *mut c_char, len: usize) -> isize {
    // SAFETY: forwarding the caller's arguments to the system call.
    unsafe { with_path(dirfd, p, -1, |q| libc::syscall(libc::SYS_readlinkat, dirfd, q, buf, len) as isize) }
}

type OpendirFn = unsafe extern "C" fn(*const c_char) -> *mut c_void;
type FopenFn = unsafe extern "C" fn(*const c_char, *const c_char) -> *mut c_void;

/// opendir(3) opens its directory inside glibc (not through `open`): redirect it here.
#[no_mangle]
pub unsafe extern "C" fn opendir(p: *const c_char) -> *mut c_void {
    let real = real!(R_OPENDIR, "opendir", OpendirFn);
    // SAFETY: forwarding the caller's arguments to libc's opendir.
    unsafe {
        with_path(libc::AT_FDCWD, p, core::ptr::null_mut(), |q| real.map_or_else(|| enosys(core::ptr::null_mut()), |f| f(q)))
    }
}

/// fopen(3) (C stdio, C++ streams) also opens inside glibc.
#[no_mangle]
pub unsafe extern "C" fn fopen(p: *const c_char, mode: *const c_char) -> *mut c_void {
    let real = real!(R_FOPEN, "fopen", FopenFn);
    // SAFETY: forwarding the caller's arguments to libc's fopen.
    unsafe {
        with_path(libc::AT_FDCWD, p, core::ptr::null_mut(), |q| real.map_or_else(|| enosys(core::ptr::null_mut()), |f| f(q, mode)))
    }
}

#[no_mangle]
pub unsafe extern "C" fn fopen64(p: *const c_char, mode: *const c_char) -> *mut c_void {
    let real = real!(R_FOPEN64, "fopen64", FopenFn);
    // SAFETY: forwarding the caller's arguments to libc's fopen64.
    unsafe {
        with_path(libc::AT_FDCWD, p, core::ptr::null_mut(), |q| real.map_or_else(|| enosys(core::ptr::null_mut()), |f| f(q, mode)))
    }
}

/// Extended attributes (`ls -l` asks for security labels and ACLs).
#[no_mangle]
pub unsafe extern "C" fn getxattr(p: *const c_char, name: *const c_char, v: *mut c_void, n: usize) -> isize {
    // SAFETY: forwarding the caller's arguments to the system call.
    unsafe { with_path(libc::AT_FDCWD, p, -1, |q| libc::syscall(libc::SYS_getxattr, q, name, v, n) as isize) }
}
#[no_mangle]
pub unsafe extern "C" fn lgetxattr(p: *const c_char, name: *const c_char, v: *mut c_void, n: usize) -> isize {
    // SAFETY: forwarding the caller's arguments to the system call.
    unsafe { with_path(libc::AT_FDCWD, p, -1, |q| libc::syscall(libc::SYS_lgetxattr, q, name, v, n) as isize) }
}
#[no_mangle]
pub unsafe extern "C" fn listxattr(p: *const c_char, list: *mut c_char, n: usize) -> isize {
    // SAFETY: forwarding the caller's arguments to the system call.
    unsafe { with_path(libc::AT_FDCWD, p, -1, |q| libc::syscall(libc::SYS_listxattr, q, list, n) as isize) }
}
#[no_mangle]
pub unsafe extern "C" fn llistxattr(p: *const c_char, list: *mut c_char, n: usize) -> isize {
    // SAFETY: forwarding the caller's arguments to the system call.
    unsafe { with_path(libc::AT_FDCWD, p, -1, |q| libc::syscall(libc::SYS_llistxattr, q, list, n) as isize) }
}

type RealpathFn = unsafe extern "C" fn(*const c_char, *mut c_char) -> *mut c_char;
type RealpathChkFn = unsafe extern "C" fn(*const c_char, *mut c_char, usize) -> *mut c_char;
type CanonicalizeFn = unsafe extern "C" fn(*const c_char) -> *mut c_char;
type ScandirFn = unsafe extern "C" fn(*const c_char, *mut c_void, *const c_void, *const c_void) -> c_int;

/// realpath(3) resolves inside glibc (UCX resolves `/sys/class/infiniband/<dev>` with it): the
/// answer is the path in the published tree.
#[no_mangle]
pub unsafe extern "C" fn realpath(p: *const c_char, resolved: *mut c_char) -> *mut c_char {
    let real = real!(R_REALPATH, "realpath", RealpathFn);
    // SAFETY: forwarding the caller's arguments to libc's realpath.
    unsafe {
        with_path(libc::AT_FDCWD, p, core::ptr::null_mut(), |q| real.map_or_else(|| enosys(core::ptr::null_mut()), |f| f(q, resolved)))
    }
}

#[no_mangle]
pub unsafe extern "C" fn __realpath_chk(p: *const c_char, resolved: *mut c_char, len: usize) -> *mut c_char {
    let real = real!(R_REALPATH_CHK, "__realpath_chk", RealpathChkFn);
    // SAFETY: forwarding the caller's arguments to libc's __realpath_chk.
    unsafe {
        with_path(libc::AT_FDCWD, p, core::ptr::null_mut(), |q| real.map_or_else(|| enosys(core::ptr::null_mut()), |f| f(q, resolved, len)))
    }
}

#[no_mangle]
pub unsafe extern "C" fn canonicalize_file_name(p: *const c_char) -> *mut c_char {
    let real = real!(R_CANONICALIZE, "canonicalize_file_name", CanonicalizeFn);
    // SAFETY: forwarding the caller's argument to libc's canonicalize_file_name.
    unsafe {
        with_path(libc::AT_FDCWD, p, core::ptr::null_mut(), |q| real.map_or_else(|| enosys(core::ptr::null_mut()), |f| f(q)))
    }
}

/// scandir(3) opens its directory inside glibc, like opendir.
#[no_mangle]
pub unsafe extern "C" fn scandir(p: *const c_char, list: *mut c_void, filter: *const c_void, compar: *const c_void) -> c_int {
    let real = real!(R_SCANDIR, "scandir", ScandirFn);
    // SAFETY: forwarding the caller's arguments to libc's scandir.
    unsafe { with_path(libc::AT_FDCWD, p, -1, |q| real.map_or_else(|| enosys(-1), |f| f(q, list, filter, compar))) }
}

#[no_mangle]
pub unsafe extern "C" fn scandir64(p: *const c_char, list: *mut c_void, filter: *const c_void, compar: *const c_void) -> c_int {
    let real = real!(R_SCANDIR64, "scandir64", ScandirFn);
    // SAFETY: forwarding the caller's arguments to libc's scandir64.
    unsafe { with_path(libc::AT_FDCWD, p, -1, |q| real.map_or_else(|| enosys(-1), |f| f(q, list, filter, compar))) }
}
