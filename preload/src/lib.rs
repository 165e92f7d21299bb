//! `libuiw_preload.so`: the LD_PRELOAD shim `uiw run` starts programs with.
//!
//! It does four things, and nothing else:
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
//! 3. Completion-channel reads: the provider registers each completion channel's fd
//!    with [`uiw_preload_register_read_fd_v1`]; `read()` on it (what
//!    `ibv_get_cq_event` does) calls the provider's handler, which serves the channel's
//!    QPs in the reading thread while it waits for an event — one wake-up per message
//!    instead of the progress thread's and then the application's. Unregistered as in 2.
//! 4. Rootless mode ([`redirect`]): `/sys/class/infiniband{,_verbs}` read from the
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
/// `typedef ssize_t (*uiw_read_handler_v1)(void *ctx, int fd, void *buf, size_t len, int why,
/// int *wait_fd);` (see `uiw_preload.h`).
pub type UiwReadHandlerV1 =
    unsafe extern "C" fn(ctx: *mut c_void, fd: c_int, buf: *mut c_void, len: size_t, why: c_int, wait_fd: *mut c_int) -> ssize_t;

/// A read handler's answers besides read()'s own: sleep in poll() on `*wait_fd`, then call
/// again; or do the real read.
pub const UIW_READ_WAIT: ssize_t = -2;
pub const UIW_READ_PLAIN: ssize_t = -3;
/// Why a read handler is called: the first time, after the wait descriptor woke the reader,
/// after a signal interrupted its sleep.
pub const UIW_READ_FIRST: c_int = 0;
pub const UIW_READ_WOKEN: c_int = 1;
pub const UIW_READ_INTERRUPTED: c_int = 2;

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

/// Handlers by fd: function pointers (0 = not registered) and their contexts. One table for
/// write(2) (command fds), one for read(2) (completion channels).
struct Registry {
    handler: [AtomicUsize; DIRECT],
    ctx: [AtomicUsize; DIRECT],
    ov_fd: [AtomicI32; OVERFLOW],
    ov_handler: [AtomicUsize; OVERFLOW],
    ov_ctx: [AtomicUsize; OVERFLOW],
    /// Number of registered fds: while 0, the interposed call and close() go straight through.
    count: AtomicUsize,
}

impl Registry {
    const fn new() -> Registry {
        Registry {
            handler: [ZU; DIRECT],
            ctx: [ZU; DIRECT],
            ov_fd: [NEG; OVERFLOW],
            ov_handler: [ZU; OVERFLOW],
            ov_ctx: [ZU; OVERFLOW],
            count: ZU,
        }
    }

    /// Whether any fd is registered (one relaxed load: the hot path of every call).
    fn any(&self) -> bool {
        self.count.load(Ordering::Relaxed) != 0
    }

    /// The handler (as stored) and context of `fd`.
    fn lookup(&self, fd: c_int) -> Option<(usize, *mut c_void)> {
        if fd < 0 {
            return None;
        }
        let (h, c) = if (fd as usize) < DIRECT {
            let i = fd as usize;
            let h = self.handler[i].load(Ordering::Acquire);
            (h, self.ctx[i].load(Ordering::Acquire))
        } else {
            let mut found = (0, 0);
            for i in 0..OVERFLOW {
                if self.ov_fd[i].load(Ordering::Acquire) == fd {
                    found = (self.ov_handler[i].load(Ordering::Acquire), self.ov_ctx[i].load(Ordering::Acquire));
                    break;
                }
            }
            found
        };
        (h != 0).then_some((h, c as *mut c_void))
    }

    /// Registers handler `h` (a function pointer, non-zero) with `ctx` for `fd`; 0 or an errno
    /// value (see `uiw_preload_register_cmd_fd_v1`).
    fn register(&self, fd: c_int, h: usize, ctx: *mut c_void) -> c_int {
        if fd < 0 {
            return libc::EBADF;
        }
        let _g = RegGuard::lock();
        if self.lookup(fd).is_some() {
            return libc::EBUSY;
        }
        if (fd as usize) < DIRECT {
            let i = fd as usize;
            self.ctx[i].store(ctx as usize, Ordering::Release);
            self.handler[i].store(h, Ordering::Release);
        } else {
            let Some(i) = (0..OVERFLOW).find(|&i| self.ov_fd[i].load(Ordering::Relaxed) == -1) else {
                return libc::ENOSPC;
            };
            self.ov_handler[i].store(h, Ordering::Release);
            self.ov_ctx[i].store(ctx as usize, Ordering::Release);
            self.ov_fd[i].store(fd, Ordering::Release);
        }
        self.count.fetch_add(1, Ordering::AcqRel);
        0
    }

    /// Forgets `fd`'s handler (no-op if none). Lock-free and async-signal-safe (atomic swaps
    /// only): `close()` calls it, and close is on POSIX's list of functions a signal handler
    /// may call. Only registration takes `REG_LOCK`; a racing unregistration of the same fd is
    /// decided by the swap.
    fn unregister(&self, fd: c_int) {
        if fd < 0 || self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        if (fd as usize) < DIRECT {
            let i = fd as usize;
            if self.handler[i].swap(0, Ordering::AcqRel) != 0 {
                self.ctx[i].store(0, Ordering::Release);
                self.count.fetch_sub(1, Ordering::AcqRel);
            }
        } else {
            for i in 0..OVERFLOW {
                // -2 marks a slot being cleared: registration only takes slots at -1.
                if self.ov_fd[i].compare_exchange(fd, -2, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                    self.ov_handler[i].store(0, Ordering::Release);
                    self.ov_ctx[i].store(0, Ordering::Release);
                    self.ov_fd[i].store(-1, Ordering::Release);
                    self.count.fetch_sub(1, Ordering::AcqRel);
                }
            }
        }
    }

    fn unregister_range(&self, first: c_uint, last: c_uint) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let hi = core::cmp::min(last as usize, DIRECT - 1);
        let mut fd = first as usize;
        while fd <= hi {
            if self.handler[fd].load(Ordering::Relaxed) != 0 {
                self.unregister(fd as c_int);
            }
            fd += 1;
        }
        for i in 0..OVERFLOW {
            let f = self.ov_fd[i].load(Ordering::Relaxed);
            if f >= 0 && (f as c_uint) >= first && (f as c_uint) <= last {
                self.unregister(f);
            }
        }
    }
}

/// write(2) handlers (command fds).
static CMD: Registry = Registry::new();
/// read(2) handlers (completion channels).
static READ: Registry = Registry::new();
/// Serialises registrations (never taken on the write, read or close path).
static REG_LOCK: AtomicUsize = AtomicUsize::new(0);

/// A registered fd is closed or replaced: neither table keeps it.
fn unregister_everywhere(fd: c_int) {
    CMD.unregister(fd);
    READ.unregister(fd);
}

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
static REAL_READ: AtomicUsize = AtomicUsize::new(0);
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
    resolve(&REAL_READ, b"read\0");
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

/// Register `h(ctx, fd, buf, len)` as the handler for write(2) on `fd`.
/// Returns 0, EBADF (fd < 0), EINVAL (h is NULL), EBUSY (fd already registered)
/// or ENOSPC (too many registrations of fds ≥ 65536).
#[no_mangle]
pub extern "C" fn uiw_preload_register_cmd_fd_v1(fd: c_int, h: Option<UiwCmdHandlerV1>, ctx: *mut c_void) -> c_int {
    let Some(h) = h else { return libc::EINVAL };
    CMD.register(fd, h as usize, ctx)
}

/// Forget `fd`'s write(2) handler (no-op if none). Does not close the fd. Lock-free and
/// async-signal-safe.
#[no_mangle]
pub extern "C" fn uiw_preload_unregister_cmd_fd_v1(fd: c_int) {
    CMD.unregister(fd);
}

/// Register `h(ctx, fd, buf, len)` as the handler for read(2) on `fd` (a completion
/// channel: the provider serves its QPs in the reading thread while it waits). Returns as
/// [`uiw_preload_register_cmd_fd_v1`].
#[no_mangle]
pub extern "C" fn uiw_preload_register_read_fd_v1(fd: c_int, h: Option<UiwReadHandlerV1>, ctx: *mut c_void) -> c_int {
    let Some(h) = h else { return libc::EINVAL };
    READ.register(fd, h as usize, ctx)
}

/// Forget `fd`'s read(2) handler (no-op if none). Does not close the fd. Lock-free and
/// async-signal-safe.
#[no_mangle]
pub extern "C" fn uiw_preload_unregister_read_fd_v1(fd: c_int) {
    READ.unregister(fd);
}

// ---- interposed libc functions ----

/// write(2): registered fds go to their handler, all others to the real write.
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t {
    if CMD.any() {
        if let Some((h, ctx)) = CMD.lookup(fd) {
            // SAFETY: a CMD entry was stored from a valid UiwCmdHandlerV1.
            let h = unsafe { core::mem::transmute::<usize, UiwCmdHandlerV1>(h) };
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

/// read(2): registered fds (completion channels) go to their handler, all others to the
/// real read.
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t {
    if READ.any() {
        if let Some((h, ctx)) = READ.lookup(fd) {
            // SAFETY: a READ entry was stored from a valid UiwReadHandlerV1.
            let h = unsafe { core::mem::transmute::<usize, UiwReadHandlerV1>(h) };
            // The handler never blocks; the sleep is here, in poll() — a cancellation
            // point in a frame with nothing to unwind, as read(2) itself is.
            let mut why = UIW_READ_FIRST;
            loop {
                let mut wait_fd: c_int = -1;
                // SAFETY: the provider registered h for fd and guarantees it (and ctx) stay
                // valid until it unregisters; buf/count are the caller's read arguments.
                let r = unsafe { h(ctx, fd, buf, count, why, &mut wait_fd) };
                if r == UIW_READ_PLAIN {
                    break;
                }
                if r != UIW_READ_WAIT {
                    return r;
                }
                let mut p = libc::pollfd { fd: wait_fd, events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd.
                let n = unsafe { libc::poll(&mut p, 1, -1) };
                // SAFETY: __errno_location returns this thread's errno slot.
                why = if n < 0 && unsafe { *libc::__errno_location() } == libc::EINTR { UIW_READ_INTERRUPTED } else { UIW_READ_WOKEN };
            }
        }
    }
    let f = resolve(&REAL_READ, b"read\0");
    if f == usize::MAX {
        // SAFETY: raw read(2) with the caller's arguments.
        return unsafe { libc::syscall(libc::SYS_read, fd, buf, count) } as ssize_t;
    }
    // SAFETY: f is libc's read, resolved by dlsym(RTLD_NEXT, "read").
    let real: unsafe extern "C" fn(c_int, *mut c_void, size_t) -> ssize_t = unsafe { core::mem::transmute(f) };
    // SAFETY: forwarding the caller's arguments unchanged.
    unsafe { real(fd, buf, count) }
}

/// close(2): unregisters a registered fd, then closes it for real.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if CMD.any() || READ.any() {
        unregister_everywhere(fd);
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
    if r >= 0 && oldfd != newfd {
        unregister_everywhere(newfd);
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
    if r >= 0 {
        unregister_everywhere(newfd);
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
        CMD.unregister_range(first, last);
        READ.unregister_range(first, last);
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
