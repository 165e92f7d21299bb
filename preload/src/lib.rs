//! `libuiw_preload.so`: the LD_PRELOAD shim `uiw run` starts programs with.
//!
//! It does three things, and nothing else:
//!
//! 1. `socket(AF_NETLINK, *, NETLINK_RDMA)` fails with `EPROTONOSUPPORT` while
//!    `SYSFS_PATH` is set, so libibverbs falls back to the sysfs-shaped tree
//!    `uiw up` published even on hosts whose kernel answers RDMA netlink.
//! 2. Command-fd service: libibverbs writes some uverbs commands (notably
//!    `IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL`) straight to `context->cmd_fd`
//!    and trusts the kernel to answer. The provider registers its cmd_fd with
//!    [`uiw_preload_register_cmd_fd_v1`]; `write()` on a registered fd calls the
//!    provider's handler synchronously and returns its result. `close()`,
//!    `dup2()`, `dup3()` and `close_range()` over a registered fd unregister it.
//! 3. Rootless mode ([`redirect`]): `/sys/class/infiniband{,_verbs}` read from the
//!    published tree, and an absent `/dev/infiniband/uverbsN` of a uiw device answered
//!    by `/dev/null`, so no node (and no root) is needed.
//!
//! The C interface is in `include/uiw_preload.h`. Hot path cost for an
//! unregistered fd: one relaxed atomic load (no fd registered) or one more
//! atomic load of the fd's slot. Nothing here allocates or panics.

#![allow(clippy::missing_safety_doc, clippy::needless_range_loop, clippy::manual_c_str_literals)]

mod redirect;

use core::ffi::{c_char, c_int, c_uint, c_void};
use core::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use libc::{size_t, ssize_t};

/// `typedef ssize_t (*uiw_cmd_handler_v1)(void *ctx, int fd, const void *buf, size_t len);`
pub type UiwCmdHandlerV1 = unsafe extern "C" fn(ctx: *mut c_void, fd: c_int, buf: *const c_void, len: size_t) -> ssize_t;

const NETLINK_RDMA: c_int = 20;

/// fds below this index have a direct slot (2 × 8 bytes × 65536 = 1 MiB of .bss;
/// pages nobody touches are never backed by memory).
const DIRECT: usize = 65536;
/// Registrations for larger fds.
const OVERFLOW: usize = 64;

#[allow(clippy::declare_interior_mutable_const)]
const ZU: AtomicUsize = AtomicUsize::new(0);
#[allow(clippy::declare_interior_mutable_const)]
const NEG: AtomicI32 = AtomicI32::new(-1);

/// Handler function pointers (0 = not registered) and their contexts, by fd.
static HANDLER: [AtomicUsize; DIRECT] = [ZU; DIRECT];
static CTX: [AtomicUsize; DIRECT] = [ZU; DIRECT];
static OV_FD: [AtomicI32; OVERFLOW] = [NEG; OVERFLOW];
static OV_HANDLER: [AtomicUsize; OVERFLOW] = [ZU; OVERFLOW];
static OV_CTX: [AtomicUsize; OVERFLOW] = [ZU; OVERFLOW];
/// Number of registered fds: while 0, write() and close() go straight through.
static COUNT: AtomicUsize = AtomicUsize::new(0);
/// Serialises registrations (never taken on the write or close path).
static REG_LOCK: AtomicUsize = AtomicUsize::new(0);

struct RegGuard;
impl RegGuard {
    fn lock() -> RegGuard {
        while REG_LOCK.compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed).is_err() {
            core::hint::spin_loop();
        }
        RegGuard
    }
}
impl Drop for RegGuard {
    fn drop(&mut self) {
        REG_LOCK.store(0, Ordering::Release);
    }
}

// ---- the real functions, resolved once with dlsym(RTLD_NEXT) ----

static REAL_WRITE: AtomicUsize = AtomicUsize::new(0);
static REAL_CLOSE: AtomicUsize = AtomicUsize::new(0);
static REAL_SOCKET: AtomicUsize = AtomicUsize::new(0);
static REAL_DUP2: AtomicUsize = AtomicUsize::new(0);
static REAL_DUP3: AtomicUsize = AtomicUsize::new(0);
static REAL_CLOSE_RANGE: AtomicUsize = AtomicUsize::new(0);

/// usize::MAX marks "looked up, not found" (then we use the raw system call).
fn resolve(cache: &AtomicUsize, name: &[u8]) -> usize {
    let v = cache.load(Ordering::Relaxed);
    if v != 0 {
        return v;
    }
    // SAFETY: name is a NUL-terminated byte string literal; RTLD_NEXT lookups have no
    // other preconditions. Racing resolutions store the same value.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr() as *const c_char) } as usize;
    let p = if p == 0 { usize::MAX } else { p };
    cache.store(p, Ordering::Relaxed);
    p
}

extern "C" fn init() {
    resolve(&REAL_WRITE, b"write\0");
    resolve(&REAL_CLOSE, b"close\0");
    resolve(&REAL_SOCKET, b"socket\0");
    resolve(&REAL_DUP2, b"dup2\0");
    resolve(&REAL_DUP3, b"dup3\0");
    resolve(&REAL_CLOSE_RANGE, b"close_range\0");
    redirect::resolve_all();
    redirect::init();
}

/// Resolve the real functions at load time, before the program can call them from
/// a context where dlsym would be unwelcome.
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

// ---- registration ----

fn lookup(fd: c_int) -> Option<(UiwCmdHandlerV1, *mut c_void)> {
    if fd < 0 {
        return None;
    }
    let (h, c) = if (fd as usize) < DIRECT {
        let i = fd as usize;
        let h = HANDLER[i].load(Ordering::Acquire);
        (h, CTX[i].load(Ordering::Acquire))
    } else {
        let mut found = (0, 0);
        for i in 0..OVERFLOW {
            if OV_FD[i].load(Ordering::Acquire) == fd {
                found = (OV_HANDLER[i].load(Ordering::Acquire), OV_CTX[i].load(Ordering::Acquire));
                break;
            }
        }
        found
    };
    if h == 0 {
        return None;
    }
    // SAFETY: a non-zero HANDLER value was stored from a valid UiwCmdHandlerV1.
    Some((unsafe { core::mem::transmute::<usize, UiwCmdHandlerV1>(h) }, c as *mut c_void))
}

/// Register `h(ctx, fd, buf, len)` as the handler for write(2) on `fd`.
/// Returns 0, EBADF (fd < 0), EINVAL (h is NULL), EBUSY (fd already registered)
/// or ENOSPC (too many registrations of fds ≥ 65536).
#[no_mangle]
pub extern "C" fn uiw_preload_register_cmd_fd_v1(fd: c_int, h: Option<UiwCmdHandlerV1>, ctx: *mut c_void) -> c_int {
    let Some(h) = h else { return libc::EINVAL };
    if fd < 0 {
        return libc::EBADF;
    }
    let _g = RegGuard::lock();
    if lookup(fd).is_some() {
        return libc::EBUSY;
    }
    if (fd as usize) < DIRECT {
        let i = fd as usize;
        CTX[i].store(ctx as usize, Ordering::Release);
        HANDLER[i].store(h as usize, Ordering::Release);
    } else {
        let Some(i) = (0..OVERFLOW).find(|&i| OV_FD[i].load(Ordering::Relaxed) == -1) else {
            return libc::ENOSPC;
        };
        OV_HANDLER[i].store(h as usize, Ordering::Release);
        OV_CTX[i].store(ctx as usize, Ordering::Release);
        OV_FD[i].store(fd, Ordering::Release);
    }
    COUNT.fetch_add(1, Ordering::AcqRel);
    0
}

/// Forget `fd`'s handler (no-op if none). Does not close the fd.
///
/// Lock-free and async-signal-safe (atomic swaps only): `close()` calls it, and close is
/// on POSIX's list of functions a signal handler may call. Only registration takes
/// `REG_LOCK`; a racing unregistration of the same fd is decided by the swap.
#[no_mangle]
pub extern "C" fn uiw_preload_unregister_cmd_fd_v1(fd: c_int) {
    if fd < 0 || COUNT.load(Ordering::Acquire) == 0 {
        return;
    }
    if (fd as usize) < DIRECT {
        let i = fd as usize;
        if HANDLER[i].swap(0, Ordering::AcqRel) != 0 {
            CTX[i].store(0, Ordering::Release);
            COUNT.fetch_sub(1, Ordering::AcqRel);
        }
    } else {
        for i in 0..OVERFLOW {
            // -2 marks a slot being cleared: registration only takes slots at -1.
            if OV_FD[i].compare_exchange(fd, -2, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                OV_HANDLER[i].store(0, Ordering::Release);
                OV_CTX[i].store(0, Ordering::Release);
                OV_FD[i].store(-1, Ordering::Release);
                COUNT.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

fn unregister_range(first: c_uint, last: c_uint) {
    if COUNT.load(Ordering::Acquire) == 0 {
        return;
    }
    let hi = core::cmp::min(last as usize, DIRECT - 1);
    let mut fd = first as usize;
    while fd <= hi {
        if HANDLER[fd].load(Ordering::Relaxed) != 0 {
            uiw_preload_unregister_cmd_fd_v1(fd as c_int);
        }
        fd += 1;
    }
    for i in 0..OVERFLOW {
        let f = OV_FD[i].load(Ordering::Relaxed);
        if f >= 0 && (f as c_uint) >= first && (f as c_uint) <= last {
            uiw_preload_unregister_cmd_fd_v1(f);
        }
    }
}

// ---- interposed libc functions ----

/// write(2): registered fds go to their handler, all others to the real write.
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t {
    if COUNT.load(Ordering::Relaxed) != 0 {
        if let Some((h, ctx)) = lookup(fd) {
            // SAFETY: the provider registered h for fd and guarantees it (and ctx) stay
            // valid until it unregisters; buf/count are the caller's write arguments.
            return unsafe { h(ctx, fd, buf, count) };
        }
    }
    let f = resolve(&REAL_WRITE, b"write\0");
    if f == usize::MAX {
        // SAFETY: raw write(2) with the caller's arguments.
        return unsafe { libc::syscall(libc::SYS_write, fd, buf, count) } as ssize_t;
    }
    // SAFETY: f is libc's write, resolved by dlsym(RTLD_NEXT, "write").
    let real: unsafe extern "C" fn(c_int, *const c_void, size_t) -> ssize_t = unsafe { core::mem::transmute(f) };
    // SAFETY: forwarding the caller's arguments unchanged.
    unsafe { real(fd, buf, count) }
}

/// close(2): unregisters a registered fd, then closes it for real.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if COUNT.load(Ordering::Relaxed) != 0 {
        uiw_preload_unregister_cmd_fd_v1(fd);
    }
    let f = resolve(&REAL_CLOSE, b"close\0");
    if f == usize::MAX {
        // SAFETY: raw close(2).
        return unsafe { libc::syscall(libc::SYS_close, fd) } as c_int;
    }
    // SAFETY: f is libc's close.
    let real: unsafe extern "C" fn(c_int) -> c_int = unsafe { core::mem::transmute(f) };
    // SAFETY: forwarding the caller's argument.
    unsafe { real(fd) }
}

/// dup2(2) closes `newfd` first: a registration on it must not survive.
#[no_mangle]
pub unsafe extern "C" fn dup2(oldfd: c_int, newfd: c_int) -> c_int {
    let f = resolve(&REAL_DUP2, b"dup2\0");
    let r = if f == usize::MAX {
        // SAFETY: raw system calls with the caller's arguments: dup3 with flags 0 is dup2
        // for oldfd != newfd; for oldfd == newfd dup2 only checks that oldfd is open.
        let r = unsafe {
            if oldfd == newfd {
                if libc::syscall(libc::SYS_fcntl, oldfd, libc::F_GETFD) < 0 { -1 } else { newfd as libc::c_long }
            } else {
                libc::syscall(libc::SYS_dup3, oldfd, newfd, 0)
            }
        };
        r as c_int
    } else {
        // SAFETY: f is libc's dup2.
        let real: unsafe extern "C" fn(c_int, c_int) -> c_int = unsafe { core::mem::transmute(f) };
        // SAFETY: forwarding the caller's arguments.
        unsafe { real(oldfd, newfd) }
    };
    if r >= 0 && oldfd != newfd && COUNT.load(Ordering::Relaxed) != 0 {
        uiw_preload_unregister_cmd_fd_v1(newfd);
    }
    r
}

/// dup3(2): like dup2.
#[no_mangle]
pub unsafe extern "C" fn dup3(oldfd: c_int, newfd: c_int, flags: c_int) -> c_int {
    let f = resolve(&REAL_DUP3, b"dup3\0");
    let r = if f == usize::MAX {
        // SAFETY: raw dup3(2) with the caller's arguments.
        unsafe { libc::syscall(libc::SYS_dup3, oldfd, newfd, flags) as c_int }
    } else {
        // SAFETY: f is libc's dup3.
        let real: unsafe extern "C" fn(c_int, c_int, c_int) -> c_int = unsafe { core::mem::transmute(f) };
        // SAFETY: forwarding the caller's arguments.
        unsafe { real(oldfd, newfd, flags) }
    };
    if r >= 0 && COUNT.load(Ordering::Relaxed) != 0 {
        uiw_preload_unregister_cmd_fd_v1(newfd);
    }
    r
}

/// close_range(2) (glibc ≥ 2.34): unregister what it closes.
#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    let f = resolve(&REAL_CLOSE_RANGE, b"close_range\0");
    let r = if f == usize::MAX {
        // SAFETY: raw close_range(2) (Linux ≥ 5.9; ENOSYS before).
        unsafe { libc::syscall(libc::SYS_close_range, first, last, flags) as c_int }
    } else {
        // SAFETY: f is libc's close_range.
        let real: unsafe extern "C" fn(c_uint, c_uint, c_int) -> c_int = unsafe { core::mem::transmute(f) };
        // SAFETY: forwarding the caller's arguments.
        unsafe { real(first, last, flags) }
    };
    const CLOSE_RANGE_CLOEXEC: c_int = 1 << 2;
    if r == 0 && flags & CLOSE_RANGE_CLOEXEC == 0 {
        unregister_range(first, last);
    }
    r
}

/// socket(2): refuse NETLINK_RDMA while SYSFS_PATH is set, exactly as a kernel
/// without RDMA support does, so libibverbs reads devices from $SYSFS_PATH.
#[no_mangle]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    if domain == libc::AF_NETLINK && protocol == NETLINK_RDMA {
        // SAFETY: getenv with a NUL-terminated name; we only test the result for NULL.
        let set = !unsafe { libc::getenv(b"SYSFS_PATH\0".as_ptr() as *const c_char) }.is_null();
        if set {
            set_errno(libc::EPROTONOSUPPORT);
            return -1;
        }
    }
    let f = resolve(&REAL_SOCKET, b"socket\0");
    if f == usize::MAX {
        // SAFETY: raw socket(2) with the caller's arguments.
        return unsafe { libc::syscall(libc::SYS_socket, domain, ty, protocol) } as c_int;
    }
    // SAFETY: f is libc's socket.
    let real: unsafe extern "C" fn(c_int, c_int, c_int) -> c_int = unsafe { core::mem::transmute(f) };
    // SAFETY: forwarding the caller's arguments.
    unsafe { real(domain, ty, protocol) }
}
