//! The C ABI surface of the provider: registration with libibverbs, the device and context
//! callbacks, and the verbs ops (in the submodules). Every `unsafe` block of the provider lives
//! under this module, each with a `// SAFETY:` line; the logic lives in `crate::engine`.
// Unit-test and `fuzzing` builds leave out the ELF constructor, and with it every path into
// this module.
#![cfg_attr(any(test, feature = "fuzzing"), allow(dead_code))]

use core::ffi::{c_char, c_int, c_void, CStr};
use core::mem::offset_of;
use core::ptr;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use uiw_kabi::ffi::PrivateFns;
use uiw_kabi::private::*;
use uiw_kabi::uverbs::{WriteCmd, CMD_CREATE_COMP_CHANNEL};
use uiw_kabi::verbs::*;
use uiw_kabi::version;

use crate::engine::context::Context;
use crate::engine::device::DeviceInfo;
use crate::engine::events::EventQueue;
use crate::engine::limits::DeviceLimits;

mod cm;
mod cq;
mod errno;
mod user_memory;
mod objects;
mod qp;
mod query;

/// Function slots of the running libibverbs' `ibv_qp_ex` (set once, before registration).
pub(crate) static QP_EX_SLOTS: AtomicUsize = AtomicUsize::new(0);

/// What the provider needs to know of the running libibverbs' private ABI: set once by
/// [`register`] before `verbs_register_driver_N`, so every callback libibverbs makes sees it.
struct RunningAbi {
    release: u32,
    fns: PrivateFns,
    /// `verbs_context_ops` in the running release's layout.
    ops: Vec<OpaqueOp>,
}

static ABI: OnceLock<RunningAbi> = OnceLock::new();

fn abi() -> &'static RunningAbi {
    // Callbacks only run after register() set it: libibverbs knows of us only from then.
    ABI.get().expect("uiw: libibverbs called a provider that did not register")
}

// ---------------------------------------------------------------------------------------------
// Registration

/// `VERBS_NAME_MATCH("uiw_", NULL)`: libibverbs matches `rdma_device:N<ibdev name>` with
/// fnmatch against this pattern.
static MATCH_TABLE: [VerbsMatchEnt; 2] = [
    VerbsMatchEnt {
        driver_data: ptr::null_mut(),
        u: VerbsMatchU { modalias: c"rdma_device:*Nuiw_*".as_ptr() },
        vendor: 0,
        device: 0,
        kind: VERBS_MATCH_MODALIAS,
    },
    VerbsMatchEnt { driver_data: ptr::null_mut(), u: VerbsMatchU { driver_id: 0 }, vendor: 0, device: 0, kind: VERBS_MATCH_SENTINEL },
];

static DEVICE_OPS: VerbsDeviceOps = VerbsDeviceOps {
    name: c"uiw".as_ptr(),
    match_min_abi_version: 0,
    match_max_abi_version: i32::MAX as u32,
    match_table: &MATCH_TABLE as *const [VerbsMatchEnt; 2] as *const VerbsMatchEnt,
    static_providers: ptr::null(),
    match_device: None,
    alloc_context: Some(alloc_context),
    import_context: None,
    alloc_device: Some(alloc_device),
    uninit_device: Some(uninit_device),
};

/// Runs when libibverbs `dlopen`s the provider (`PROVIDER_DRIVER` in C). Not in a build with
/// the `fuzzing` feature: a fuzz target links the engine, never libibverbs.
#[cfg(not(any(test, feature = "fuzzing")))]
#[used]
#[link_section = ".init_array"]
static REGISTER: extern "C" fn() = register;

extern "C" fn fork_prepare() {
    crate::engine::net::fork_prepare();
}

extern "C" fn fork_parent() {
    crate::engine::net::fork_parent();
}

extern "C" fn fork_child() {
    crate::engine::net::fork_child();
}

extern "C" fn register() {
    // SAFETY: plain registration of three handlers that live as long as the process (the
    // provider is never unloaded while libibverbs is loaded).
    unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
    let found = version::detect().map_err(|e| e.to_string()).and_then(|(v, path)| {
        let pabi = v.pabi().expect("detect() returns supported releases only");
        PrivateFns::resolve(&path, pabi)
            .map(|fns| (v, fns))
            .map_err(|e| format!("{e}, though its file name says rdma-core v{}; will not guess", v.release))
    });
    let (v, fns) = match found {
        Ok(f) => f,
        Err(e) => return eprintln!("uiw: provider not registered: {e}"),
    };
    QP_EX_SLOTS.store(v.qp_ex_slots(), Ordering::Release);
    let ops = context_ops_slots(&CONTEXT_OPS, v.release);
    let abi = ABI.get_or_init(|| RunningAbi { release: v.release, fns, ops });
    if std::env::var_os("UIW_DEBUG").is_some() {
        eprintln!("uiw: registering with rdma-core v{} ({})", abi.release, abi.fns.node());
    }
    // SAFETY: the function is libibverbs' verbs_register_driver_N for the private ABI it was
    // found under; DEVICE_OPS is a static that outlives the process' use of it.
    unsafe { (abi.fns.register_driver)(&DEVICE_OPS) };
}

// ---------------------------------------------------------------------------------------------
// Small helpers shared by the ops

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// A refused verb: one `UIW_DEBUG` line saying what was wrong (and the limit), then the
/// errno to return (`crate::engine::debug`).
pub(crate) fn refuse(verb: &str, errno: c_int, why: core::fmt::Arguments<'_>) -> c_int {
    crate::engine::debug::refused(verb, why);
    errno
}

/// A `PostError` of one WR, explained with the queue's limits.
pub(crate) fn explain_post(verb: &str, qpn: u32, e: &crate::engine::wr::PostError, max_wr: u32, max_sge: u32, num_sge: i32, state: impl core::fmt::Debug) {
    use crate::engine::wr::PostError as P;
    let q = format!("QP 0x{qpn:06x}");
    match e {
        P::TooManySges => crate::engine::debug::refused(verb, format_args!("{q}: num_sge = {num_sge} exceeds the queue's max_sge = {max_sge}")),
        P::InlineTooLong => crate::engine::debug::refused(verb, format_args!("{q}: inline payload longer than the QP's max_inline_data")),
        P::QueueFull => crate::engine::debug::refused(verb, format_args!("{q}: the queue is full (max_wr = {max_wr}); poll completions first")),
        P::BadState => crate::engine::debug::refused(verb, format_args!("{q}: not accepted in state {state:?} (or by this queue: a QP with an SRQ takes no receives; Reads and atomics need a gather list, not inline data)")),
        P::Unsupported => crate::engine::debug::refused(verb, format_args!("{q}: opcode not implemented (memory windows) or not negotiated with this peer")),
        P::BadOpcode => crate::engine::debug::refused(verb, format_args!("{q}: opcode is not an ibv_wr_opcode")),
    }
}

/// Runs an op body, turning a panic into `on_panic` instead of unwinding into C.
pub(crate) fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
        set_errno(libc::EFAULT);
        on_panic
    })
}

/// An event queue for libibverbs to read (`async_fd`, a completion channel's fd): the
/// application's end is never fd 0, 1 or 2 (an application that closed stdin must not get its
/// events there) and is close-on-exec; the engine keeps its own end and a second descriptor of
/// the application's (see `EventQueue`).
fn event_queue(record: usize) -> std::io::Result<(OwnedFd, EventQueue)> {
    let (app, ours, unread) = event_pipe()?;
    Ok((app, EventQueue::new(ours, unread, record)))
}

/// A completion channel's event queue (see `EventQueue::channel`).
fn channel_queue() -> std::io::Result<(OwnedFd, EventQueue)> {
    let (app, ours, unread) = event_pipe()?;
    Ok((app, EventQueue::channel(ours, unread)))
}

/// The application's end (fd 3 or above), ours, and a second descriptor of the application's.
fn event_pipe() -> std::io::Result<(OwnedFd, std::os::unix::net::UnixStream, std::os::unix::net::UnixStream)> {
    let (app, ours) = std::os::unix::net::UnixStream::pair()?;
    let mut app = OwnedFd::from(app);
    if app.as_raw_fd() <= 2 {
        // try_clone is fcntl(F_DUPFD_CLOEXEC, 3): the copy is at 3 or above.
        app = app.try_clone()?;
    }
    let unread = std::os::unix::net::UnixStream::from(app.try_clone()?);
    Ok((app, ours, unread))
}

// ---------------------------------------------------------------------------------------------
// Device

/// Our `verbs_device`: libibverbs' part first, then what the engine knows of the device.
#[repr(C)]
struct UiwDevice {
    vdev: VerbsDevice,
    info: Arc<DeviceInfo>,
}

/// Devices libibverbs holds (it links them through `verbs_device.entry` and keeps them until
/// the device goes away, usually for the process' lifetime). Tracked so that teardown and leak
/// checkers see who owns them.
static DEVICES: parking_lot::Mutex<Vec<usize>> = parking_lot::Mutex::new(Vec::new());

unsafe extern "C" fn alloc_device(sysfs: *mut VerbsSysfsDev) -> *mut VerbsDevice {
    guard(ptr::null_mut(), || {
        // SAFETY: libibverbs passes a valid sysfs device with NUL-terminated strings.
        let path = unsafe { CStr::from_ptr((*sysfs).ibdev_path.as_ptr()) }.to_string_lossy().into_owned();
        let info = match DeviceInfo::load(std::path::Path::new(&path)) {
            Ok(i) => i,
            Err(e) => {
                eprintln!("uiw: cannot read device {path}: {e} (publish it with `uiw up`)");
                return ptr::null_mut();
            }
        };
        // SAFETY: VerbsDevice is plain C data (pointers, integers, arrays); all-zero is its
        // initial state, as calloc gives C providers.
        let vdev: VerbsDevice = unsafe { core::mem::zeroed() };
        let dev = Box::into_raw(Box::new(UiwDevice { vdev, info: Arc::new(info) }));
        DEVICES.lock().push(dev as usize);
        dev as *mut VerbsDevice
    })
}

unsafe extern "C" fn uninit_device(vdev: *mut VerbsDevice) {
    DEVICES.lock().retain(|&d| d != vdev as usize);
    // SAFETY: vdev came from alloc_device's Box (vdev is the first field of UiwDevice).
    drop(unsafe { Box::from_raw(vdev as *mut UiwDevice) });
}

// ---------------------------------------------------------------------------------------------
// Context

/// Our driver context: libibverbs allocates it (calloc) in `_verbs_init_and_alloc_context`.
///
/// libibverbs' `struct verbs_context` ends with the `ibv_context` applications see, and grows
/// at its start from release to release (v59, v62, v64). So the `ibv_context` sits at a fixed
/// place here, with room before it for the largest known `verbs_context`, and the running
/// release's `verbs_context` starts [`verbs_context_head`] bytes before it, inside `head`.
#[repr(C)]
pub(crate) struct UiwContext {
    /// libibverbs' `verbs_context` members before `context` (the running release's use the
    /// last `verbs_context_head(release)` bytes).
    head: [u64; VERBS_CONTEXT_MAX_HEAD / 8],
    ctx: ibv_context,
    engine: *const Context,
    /// Whether the launcher's shim serves our cmd_fd (completion channels work).
    shim: bool,
}

const _: () = assert!(VERBS_CONTEXT_MAX_HEAD % 8 == 0);

impl UiwContext {
    /// Our context behind an `ibv_context` of ours.
    fn from_ctx(ctx: *mut ibv_context) -> *mut UiwContext {
        (ctx as *mut u8).wrapping_sub(offset_of!(UiwContext, ctx)) as *mut UiwContext
    }

    /// The running release's `verbs_context` inside `raw`.
    fn vctx(raw: *mut UiwContext) -> *mut verbs_context {
        let ctx = (raw as *mut u8).wrapping_add(offset_of!(UiwContext, ctx));
        ctx.wrapping_sub(verbs_context_head(abi().release)) as *mut verbs_context
    }
}

/// The engine context behind an `ibv_context` of ours.
///
/// # Safety
/// `ctx` must be an `ibv_context` created by [`alloc_context`] and not yet freed.
pub(crate) unsafe fn engine<'a>(ctx: *mut ibv_context) -> &'a Context {
    &*(*UiwContext::from_ctx(ctx)).engine
}

static CONTEXT_OPS: VerbsContextOps = VerbsContextOps {
    alloc_pd: Some(objects::alloc_pd),
    dealloc_pd: Some(objects::dealloc_pd),
    reg_mr: Some(objects::reg_mr),
    dereg_mr: Some(objects::dereg_mr),
    create_cq: Some(cq::create_cq),
    create_cq_ex: Some(cq::create_cq_ex),
    destroy_cq: Some(cq::destroy_cq),
    poll_cq: Some(cq::poll_cq),
    req_notify_cq: Some(cq::req_notify_cq),
    resize_cq: Some(cq::resize_cq),
    create_qp: Some(qp::create_qp),
    create_qp_ex: Some(qp::create_qp_ex),
    modify_qp: Some(qp::modify_qp),
    query_qp: Some(qp::query_qp),
    destroy_qp: Some(qp::destroy_qp),
    post_send: Some(qp::post_send),
    post_recv: Some(qp::post_recv),
    create_srq: Some(objects::create_srq),
    modify_srq: Some(objects::modify_srq),
    query_srq: Some(objects::query_srq),
    destroy_srq: Some(objects::destroy_srq),
    post_srq_recv: Some(objects::post_srq_recv),
    query_device_ex: Some(query::query_device_ex),
    query_port: Some(query::query_port),
    free_context: Some(free_context),
    // SAFETY: an all-NULL ops table is valid: libibverbs fills NULL slots with EOPNOTSUPP stubs.
    ..unsafe { core::mem::zeroed() }
};

unsafe extern "C" fn alloc_context(ibdev: *mut ibv_device, cmd_fd: c_int, _private: *mut c_void) -> *mut verbs_context {
    guard(ptr::null_mut(), || {
        let abi = abi();
        let vctx_offset = offset_of!(UiwContext, ctx) - verbs_context_head(abi.release);
        // SAFETY: libibverbs hands us ownership of cmd_fd; on failure the call closes it. The
        // running release's verbs_context, vctx_offset bytes in, ends at `ctx` and fits in
        // the allocation.
        let raw = unsafe {
            (abi.fns.init_and_alloc_context)(
                ibdev,
                cmd_fd,
                core::mem::size_of::<UiwContext>(),
                vctx_offset as *mut verbs_context,
                0,
            )
        } as *mut UiwContext;
        if raw.is_null() {
            return ptr::null_mut();
        }
        // SAFETY: raw is a zeroed UiwContext whose vctx libibverbs just initialised; ibdev is
        // the UiwDevice alloc_device returned.
        unsafe {
            let vctx = UiwContext::vctx(raw);
            let fail = |e: c_int| {
                (abi.fns.uninit_context)(vctx);
                libc::free(raw as *mut c_void);
                set_errno(e);
                ptr::null_mut()
            };
            let (async_r, sink) = match event_queue(16) {
                Ok(p) => p,
                Err(e) => return fail(e.raw_os_error().unwrap_or(libc::EMFILE)),
            };
            (abi.fns.set_ops)(vctx, abi.ops.as_ptr() as *const c_void);
            let ctx = &mut (*raw).ctx;
            ctx.async_fd = async_r.into_raw_fd();
            ctx.num_comp_vectors = 1;
            let info = (*(ibdev as *mut UiwDevice)).info.clone();
            let engine = Box::new(Context::new(info, DeviceLimits::UIW, sink, &user_memory::USER_MEMORY));
            (*raw).engine = Box::into_raw(engine);
            (*raw).shim = serve_cmd_fd(ctx.cmd_fd, (*raw).engine);
            vctx
        }
    })
}

unsafe extern "C" fn free_context(ibctx: *mut ibv_context) {
    // SAFETY: ibctx is one of ours (libibverbs calls free_context once, from ibv_close_device).
    unsafe {
        let raw = UiwContext::from_ctx(ibctx);
        if (*raw).shim {
            if let Some(unregister) = shim_symbol::<UnregisterFn>(c"uiw_preload_unregister_cmd_fd_v1") {
                unregister((*ibctx).cmd_fd);
            }
            // Channels the application did not destroy: their reads must not reach a freed
            // engine.
            if let Some(unregister) = shim_symbol::<UnregisterFn>(c"uiw_preload_unregister_read_fd_v1") {
                for fd in (*((*raw).engine as *const Context)).channel_fds() {
                    unregister(fd);
                }
            }
        }
        drop(Box::from_raw((*raw).engine as *mut Context));
        (abi().fns.uninit_context)(UiwContext::vctx(raw));
        libc::free(raw as *mut c_void);
    }
}

// ---------------------------------------------------------------------------------------------
// The command fd: completion channels
//
// `ibv_create_comp_channel` never reaches a provider: it writes IB_USER_VERBS_CMD_CREATE_COMP_
// CHANNEL to `cmd_fd` and trusts the fd a kernel writes back. Under `uiw run` the launcher's
// LD_PRELOAD shim (libuiw_preload.so) routes writes to our cmd_fd to `serve_cmd` below, which
// creates the channel. Without the shim, cmd_fd is replaced by a descriptor that refuses
// writes, so the call fails cleanly (NULL, errno EBADF) instead of yielding fd 0.

type Handler = unsafe extern "C" fn(*mut c_void, c_int, *const c_void, usize) -> isize;
type RegisterFn = unsafe extern "C" fn(c_int, Handler, *mut c_void) -> c_int;
type ReadHandler = unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, usize, c_int, *mut c_int) -> isize;
type RegisterReadFn = unsafe extern "C" fn(c_int, ReadHandler, *mut c_void) -> c_int;
type UnregisterFn = unsafe extern "C" fn(c_int);

fn shim_symbol<T: Copy>(name: &CStr) -> Option<T> {
    // SAFETY: dlsym only looks the name up; T is the function type the shim exports it as.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!p.is_null()).then(|| unsafe { core::mem::transmute_copy::<*mut c_void, T>(&p) })
}

static WARNED_NO_SHIM: AtomicBool = AtomicBool::new(false);

fn serve_cmd_fd(cmd_fd: c_int, engine: *const Context) -> bool {
    if let Some(register) = shim_symbol::<RegisterFn>(c"uiw_preload_register_cmd_fd_v1") {
        // SAFETY: the engine outlives the registration (free_context unregisters first).
        if unsafe { register(cmd_fd, serve_cmd, engine as *mut c_void) } == 0 {
            return true;
        }
    }
    // SAFETY: plain fd syscalls on descriptors we own.
    unsafe {
        let refuse = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if refuse >= 0 {
            libc::dup3(refuse, cmd_fd, libc::O_CLOEXEC);
            libc::close(refuse);
        }
    }
    if crate::engine::log::enabled(crate::engine::log::Level::Warn) && !WARNED_NO_SHIM.swap(true, Ordering::Relaxed) {
        crate::uiw_log!(Warn, "completion channels need the uiw launcher (`uiw run -- CMD`); ibv_create_comp_channel will fail with EBADF");
    }
    false
}

/// The shim calls this for every `write()` to our cmd_fd.
unsafe extern "C" fn serve_cmd(engine: *mut c_void, _fd: c_int, buf: *const c_void, len: usize) -> isize {
    guard(-1, || {
        // SAFETY: the shim passes the caller's buffer and length unchanged.
        let bytes = unsafe { core::slice::from_raw_parts(buf as *const u8, len) };
        // SAFETY: `engine` is the pointer serve_cmd_fd registered.
        let engine = unsafe { &*(engine as *const Context) };
        let cmd = match WriteCmd::parse(bytes) {
            Some(c) => c,
            None => {
                set_errno(libc::EINVAL);
                return -1;
            }
        };
        if cmd.command != CMD_CREATE_COMP_CHANNEL {
            set_errno(libc::EOPNOTSUPP);
            return -1;
        }
        if cmd.out_words < 1 || cmd.response == 0 {
            set_errno(libc::EINVAL);
            return -1;
        }
        let (r, w) = match channel_queue() {
            Ok(p) => p,
            Err(e) => {
                set_errno(e.raw_os_error().unwrap_or(libc::EMFILE));
                return -1;
            }
        };
        let fd = r.into_raw_fd();
        engine.add_channel(fd, w);
        // ibv_get_cq_event's read() of the channel comes to `read_channel` (this handler is
        // running, so the shim is there; without the read hook, reads are plain reads).
        if let Some(register) = shim_symbol::<RegisterReadFn>(c"uiw_preload_register_read_fd_v1") {
            // SAFETY: the engine outlives the registration (free_context unregisters first;
            // close() of the fd unregisters it too).
            let _ = unsafe { register(fd, read_channel, engine as *const Context as *mut c_void) };
        }
        // SAFETY: `response` points at libibverbs' `struct ib_uverbs_create_comp_channel_resp`
        // (out_words ≥ 1 checked above), exactly where a kernel would write.
        unsafe { ptr::write_unaligned(cmd.response as *mut u32, fd as u32) };
        len as isize
    })
}

/// `read_channel`'s answers besides read()'s own (`uiw_preload.h`): the shim sleeps in
/// poll() on `*wait_fd` and calls again (with why = woken or interrupted), or does the real
/// read.
const READ_WAIT: isize = -2;
const READ_PLAIN: isize = -3;
const WHY_WOKEN: c_int = 1;
const WHY_INTERRUPTED: c_int = 2;

/// The shim calls this for every `read()` of a completion channel's fd (`ibv_get_cq_event`):
/// an event already queued is returned as the kernel's read would; otherwise the reader
/// sleeps on the channel's wait descriptor (`EventQueue::wait_fd`) — in the shim, not here:
/// `pthread_cancel` of a thread blocked in `ibv_get_cq_event` (GASNet's progress threads,
/// for one) unwinds its stack, which must find no Rust frame that catches or cleans up — and
/// on waking, serves the channel's QPs whose streams woke it, in this thread
/// (`Context::serve_channel_ready`), before it looks for the event again.
unsafe extern "C" fn read_channel(engine: *mut c_void, fd: c_int, buf: *mut c_void, len: usize, why: c_int, wait_fd: *mut c_int) -> isize {
    guard(-1, || {
        // SAFETY: `engine` is the pointer serve_cmd registered with this fd.
        let engine = unsafe { &*(engine as *const Context) };
        // Not a channel of this context (any more): a plain read.
        let Some(ch) = engine.channel(fd) else { return READ_PLAIN };
        // Called again after a sleep on the wait fd: this thread holds the channel's QPs
        // (see `engine::lease`) until it returns anything but READ_WAIT.
        let slept = why == WHY_WOKEN || why == WHY_INTERRUPTED;
        let r = read_or_wait(engine, &ch, fd, buf, len, why, wait_fd);
        match (slept, r == Ok(READ_WAIT)) {
            (false, true) => engine.channel_reader_sleeps(&ch),
            (true, false) => engine.channel_reader_woke(&ch),
            _ => {}
        }
        // errno last: handing the channel's QPs back (epoll_ctl) may set it on success
        // (`EEXIST` from an add answered by a modify), and qperf, at the end of a timed test,
        // tells the alarm's EINTR from a failure by errno alone.
        r.unwrap_or_else(|errno| {
            set_errno(errno);
            -1
        })
    })
}

/// `read_channel`'s work: an event read, `READ_PLAIN`, `READ_WAIT` with `*wait_fd` set, or
/// the errno of a failed read.
fn read_or_wait(engine: &Context, ch: &EventQueue, fd: c_int, buf: *mut c_void, len: usize, why: c_int, wait_fd: *mut c_int) -> Result<isize, c_int> {
    match why {
        WHY_WOKEN => {
            if let Some(rec) = engine.serve_channel_ready(ch) {
                if len >= rec.len() {
                    // SAFETY: the caller's buffer, of `len` bytes (read()'s arguments).
                    unsafe { ptr::copy_nonoverlapping(rec.as_ptr(), buf as *mut u8, rec.len()) };
                    return Ok(rec.len() as isize);
                }
                ch.requeue(&rec);
            }
        }
        // As a read(2) would: restarted after SA_RESTART handlers, EINTR otherwise.
        WHY_INTERRUPTED if !uiw_kabi::sys::interrupted_reads_restart() => return Err(libc::EINTR),
        _ => {}
    }
    loop {
        // SAFETY: the caller's buffer and length, as read() was given them.
        let n = unsafe { libc::recv(fd, buf, len, libc::MSG_DONTWAIT) };
        if n >= 0 {
            return Ok(n as isize);
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) => break,
            // Not our socket any more (replaced behind the shim's back): a plain read.
            _ => return Ok(READ_PLAIN),
        }
    }
    // SAFETY: F_GETFL on the caller's fd has no memory arguments.
    if unsafe { libc::fcntl(fd, libc::F_GETFL) } & libc::O_NONBLOCK != 0 {
        return Err(libc::EAGAIN);
    }
    match ch.wait_fd() {
        Some(w) => {
            // SAFETY: the shim passes a valid out pointer.
            unsafe { *wait_fd = w };
            Ok(READ_WAIT)
        }
        None => Ok(READ_PLAIN),
    }
}

/// Reads a C string field into a `String` (for messages).
#[allow(dead_code)]
pub(crate) fn c_str(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: callers pass NUL-terminated strings from libibverbs.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}
