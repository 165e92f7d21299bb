//! Safe wrappers for the few libc calls that publishing a device needs (what a kernel driver
//! would do for itself): the `uiw` command calls these and stays free of `unsafe`.

use std::ffi::{CStr, CString};
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

fn check(r: libc::c_long) -> io::Result<()> {
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The effective user id.
pub fn geteuid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// `access(path, W_OK)`: may this process write there (as the real user)?
pub fn is_writable(path: &Path) -> bool {
    // SAFETY: access(2) on a valid NUL-terminated path.
    cpath(path).map(|c| unsafe { libc::access(c.as_ptr(), libc::W_OK) } == 0).unwrap_or(false)
}

/// `flock(fd, LOCK_EX)`, retried on EINTR: blocks until the lock is the caller's.
pub fn lock_exclusive(f: &impl AsRawFd) -> io::Result<()> {
    // SAFETY: flock on an fd the caller owns for the duration of the call.
    while unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

/// `mknod(path, S_IFCHR | mode, makedev(major, minor))`.
pub fn mknod_char(path: &Path, mode: u32, major: u32, minor: u32) -> io::Result<()> {
    let c = cpath(path)?;
    // SAFETY: c is a valid NUL-terminated path.
    check(unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | mode, libc::makedev(major, minor)) }.into())
}

/// Atomically exchanges two paths (`renameat2(RENAME_EXCHANGE)`, Linux ≥ 3.15).
pub fn rename_exchange(a: &Path, b: &Path) -> io::Result<()> {
    let (ca, cb) = (cpath(a)?, cpath(b)?);
    const RENAME_EXCHANGE: libc::c_uint = 2;
    // SAFETY: both are valid NUL-terminated paths that outlive the call.
    check(unsafe { libc::syscall(libc::SYS_renameat2, libc::AT_FDCWD, ca.as_ptr(), libc::AT_FDCWD, cb.as_ptr(), RENAME_EXCHANGE) })
}

/// IPv4 addresses of netdev `name` (and of its alias labels `name:*`), via getifaddrs(3), in
/// the order the kernel lists them, without duplicates.
pub fn ipv4_addrs(name: &str) -> Vec<Ipv4Addr> {
    let mut out = Vec::new();
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into ifap; we free it with freeifaddrs below.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return out;
    }
    let mut cur = ifap;
    while !cur.is_null() {
        // SAFETY: cur is a node of the list getifaddrs returned and has not been freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let ifname = unsafe { CStr::from_ptr(ifa.ifa_name) }.to_string_lossy();
        if ifname.split(':').next().unwrap_or("") != name {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points to a sockaddr at least sa_family wide.
        if i32::from(unsafe { (*ifa.ifa_addr).sa_family }) != libc::AF_INET {
            continue;
        }
        // SAFETY: the family is AF_INET, so the sockaddr is a sockaddr_in.
        let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
        let a = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
        if !out.contains(&a) {
            out.push(a);
        }
    }
    // SAFETY: ifap came from a successful getifaddrs and is freed exactly once.
    unsafe { libc::freeifaddrs(ifap) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_has_127_0_0_1() {
        assert!(ipv4_addrs("lo").contains(&Ipv4Addr::LOCALHOST));
        assert!(ipv4_addrs("no-such-netdev").is_empty());
    }

    #[test]
    fn exchange_swaps_and_errors_say_why() {
        let d = std::env::temp_dir().join(format!("uiw-sys-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let (a, b) = (d.join("a"), d.join("b"));
        std::fs::write(&a, "a").unwrap();
        std::fs::write(&b, "b").unwrap();
        rename_exchange(&a, &b).unwrap();
        assert_eq!(std::fs::read_to_string(&a).unwrap(), "b");
        assert!(rename_exchange(&a, &d.join("missing")).is_err());
        assert!(is_writable(&d));
        std::fs::remove_dir_all(&d).unwrap();
    }
}

/// An epoll instance (`epoll_create1(EPOLL_CLOEXEC)`), for the provider's progress thread.
#[derive(Debug)]
pub struct Epoll {
    fd: std::os::fd::OwnedFd,
}

impl std::os::fd::AsRawFd for Epoll {
    /// The instance's descriptor: itself pollable (readable while events are ready), what a
    /// thread sleeps on where it must not sit in `epoll_wait` (see `uiw_preload`'s read()).
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

/// `EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET`: every readiness change of a socket, once.
pub const EPOLL_SOCKET_EDGE: u32 = (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32;
/// `EPOLLIN` (level-triggered), for listening sockets.
pub const EPOLL_IN: u32 = libc::EPOLLIN as u32;

impl Epoll {
    pub fn new() -> io::Result<Epoll> {
        use std::os::fd::FromRawFd;
        // SAFETY: epoll_create1 has no memory preconditions; a non-negative result is a new fd
        // that we own from here on.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just created and is owned by nobody else.
        Ok(Epoll { fd: unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) } })
    }

    fn ctl(&self, op: libc::c_int, fd: i32, token: u64, events: u32) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: ev is a valid epoll_event for the duration of the call.
        check(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut ev) }.into())
    }

    /// Watches `fd` for `events`, reporting `token`.
    pub fn add(&self, fd: i32, token: u64, events: u32) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, token, events)
    }

    /// Changes the token/events of a watched fd.
    pub fn modify(&self, fd: i32, token: u64, events: u32) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, token, events)
    }

    pub fn delete(&self, fd: i32) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_DEL, fd, 0, 0)
    }

    /// Waits up to `timeout_ms` (-1: forever) and appends `(token, events)` pairs to `out`.
    pub fn wait(&self, out: &mut Vec<(u64, u32)>, timeout_ms: i32) -> io::Result<usize> {
        let t = u64::try_from(timeout_ms).ok().map(std::time::Duration::from_millis);
        self.wait_for(out, t)
    }

    /// As [`Epoll::wait`], with a timeout of microsecond resolution (`epoll_pwait2`, Linux
    /// 5.11): `None` waits forever.
    pub fn wait_for(&self, out: &mut Vec<(u64, u32)>, timeout: Option<std::time::Duration>) -> io::Result<usize> {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 64];
        let ts = timeout.map(|d| libc::timespec {
            tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: libc::c_long::from(d.subsec_nanos() as i32),
        });
        let tsp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // A kernel before 5.11 (or valgrind, which does not know the call) has no
        // epoll_pwait2: millisecond resolution then, rounded up (never a busy loop).
        static NO_PWAIT2: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        let mut n = -1;
        if timeout == Some(std::time::Duration::ZERO) {
            // A poll (a spinning progress thread makes hundreds of thousands a second): plain
            // epoll_wait, which copies no timespec in and sets no timer.
            // SAFETY: evs has room for the 64 entries we pass as maxevents.
            n = unsafe { libc::epoll_wait(self.fd.as_raw_fd(), evs.as_mut_ptr(), evs.len() as i32, 0) };
        } else if !NO_PWAIT2.load(std::sync::atomic::Ordering::Relaxed) {
            // SAFETY: evs has room for the 64 entries we pass as maxevents; tsp is null or
            // points to `ts`, which outlives the call; a null sigmask leaves the mask alone.
            n = unsafe { libc::epoll_pwait2(self.fd.as_raw_fd(), evs.as_mut_ptr(), evs.len() as i32, tsp, std::ptr::null()) };
            if n < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
                NO_PWAIT2.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        if n < 0 && NO_PWAIT2.load(std::sync::atomic::Ordering::Relaxed) {
            let ms = timeout.map_or(-1, |d| d.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32);
            // SAFETY: evs has room for the 64 entries we pass as maxevents.
            n = unsafe { libc::epoll_wait(self.fd.as_raw_fd(), evs.as_mut_ptr(), evs.len() as i32, ms) };
        }
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted { Ok(0) } else { Err(e) };
        }
        out.extend(evs[..n as usize].iter().map(|e| (e.u64, e.events)));
        Ok(n as usize)
    }
}

/// Whether a blocking `read(2)` interrupted by a signal now would be restarted: `signal(7)`
/// restarts it after a handler installed with `SA_RESTART` and fails it with `EINTR` after
/// one without. Which signal it was is not known here, so one caught signal without
/// `SA_RESTART` makes the answer `false` (what a program that breaks out of a blocking read
/// with `alarm()` and a plain handler — qperf — relies on). The signals a faulting
/// instruction raises (Rust's runtime catches SIGSEGV and SIGBUS without `SA_RESTART`) never
/// interrupt a read and are not looked at.
pub fn interrupted_reads_restart() -> bool {
    const NEVER_INTERRUPT: [libc::c_int; 8] =
        [libc::SIGKILL, libc::SIGSTOP, libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE, libc::SIGTRAP, libc::SIGSYS];
    for sig in 1..=libc::SIGRTMAX() {
        if NEVER_INTERRUPT.contains(&sig) {
            continue;
        }
        // SAFETY: sigaction is plain data; all-zero is a valid value to be overwritten.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: a query only (no new action); `old` is a valid out pointer. Signals glibc
        // keeps for itself answer EINVAL and are skipped.
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0 {
            continue;
        }
        let caught = old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN;
        if caught && old.sa_flags & libc::SA_RESTART == 0 {
            return false;
        }
    }
    true
}

/// A one-shot `timerfd` on `CLOCK_MONOTONIC` (non-blocking, close-on-exec): readable once
/// the time it was armed for has come, until [`TimerFd::drain`]. What a thread that sleeps in
/// epoll is woken by when a deadline is set by another thread, without that thread waking it.
#[derive(Debug)]
pub struct TimerFd {
    fd: std::os::fd::OwnedFd,
}

impl TimerFd {
    pub fn new() -> io::Result<TimerFd> {
        use std::os::fd::FromRawFd;
        // SAFETY: timerfd_create has no memory preconditions; a non-negative result is a new
        // fd that we own from here on.
        let fd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just created and is owned by nobody else.
        Ok(TimerFd { fd: unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) } })
    }

    /// Fires once, `after` from now (a zero duration fires at once); replaces any earlier arming.
    pub fn arm(&self, after: std::time::Duration) -> io::Result<()> {
        // A zero it_value would disarm: the shortest arming is 1 ns.
        let after = after.max(std::time::Duration::from_nanos(1));
        let v = libc::itimerspec {
            it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
            it_value: libc::timespec { tv_sec: after.as_secs().min(i64::MAX as u64) as libc::time_t, tv_nsec: after.subsec_nanos() as libc::c_long },
        };
        // SAFETY: v is a valid itimerspec for the call; the old value is not asked for (null).
        check(unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &v, std::ptr::null_mut()) }.into())
    }

    /// Cancels the arming and any expiry not yet read: unreadable until armed again.
    pub fn disarm(&self) -> io::Result<()> {
        let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        let v = libc::itimerspec { it_interval: zero, it_value: zero };
        // SAFETY: v is a valid itimerspec for the call; the old value is not asked for (null).
        check(unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &v, std::ptr::null_mut()) }.into())
    }

    pub fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

/// `getsockopt(fd, IPPROTO_TCP, TCP_MAXSEG)`: the connection's MSS (MPA sizes FPDUs by it).
pub fn tcp_maxseg(s: &impl AsRawFd) -> io::Result<u32> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: v and len are valid out-parameters of the sizes given.
    let r =
        unsafe { libc::getsockopt(s.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_MAXSEG, &mut v as *mut _ as *mut libc::c_void, &mut len) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v as u32)
}

fn setsockopt_int(fd: libc::c_int, level: libc::c_int, name: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: v is a valid c_int whose size is passed along.
    let r = unsafe {
        libc::setsockopt(fd, level, name, &v as *const _ as *const libc::c_void, std::mem::size_of::<libc::c_int>() as libc::socklen_t)
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Dead-peer detection on a TCP stream, as an RNIC's retry timer gives it: unacknowledged data
/// fails the connection after `timeout_ms` (`TCP_USER_TIMEOUT`), and an idle connection is
/// probed by keep-alives (first after a third of the timeout, then every sixth, three probes),
/// so a peer that vanished is noticed within about `timeout_ms` whether or not data is flowing.
/// `SO_RCVLOWAT`: readiness (`epoll`, `poll`) reports the socket readable only once `bytes`
/// wait in it; a non-blocking receive still returns what is there.
pub fn set_rcvlowat(s: &impl AsRawFd, bytes: usize) -> io::Result<()> {
    setsockopt_int(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVLOWAT, bytes.clamp(1, i32::MAX as usize) as libc::c_int)
}

pub fn set_peer_timeout(s: &impl AsRawFd, timeout_ms: u32) -> io::Result<()> {
    let fd = s.as_raw_fd();
    let secs = |ms: u32| ((ms / 1000).max(1)) as libc::c_int;
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    setsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, secs(timeout_ms / 3))?;
    setsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, secs(timeout_ms / 6))?;
    setsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3)?;
    setsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, timeout_ms.min(i32::MAX as u32) as libc::c_int)
}

/// Starts a TCP connection to `addr` without waiting for it: a non-blocking, close-on-exec
/// socket whose `connect` is under way (`EINPROGRESS`); readiness (or the error, through the
/// socket's later reads and writes) comes from epoll.
pub fn tcp_connect_start(addr: std::net::SocketAddrV4) -> io::Result<std::net::TcpStream> {
    use std::os::fd::FromRawFd;
    // SAFETY: plain socket(2); the descriptor is owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh socket nobody else owns; the TcpStream closes it.
    let stream = unsafe { std::net::TcpStream::from_raw_fd(fd) };
    let sa = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: addr.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(*addr.ip()).to_be() },
        sin_zero: [0; 8],
    };
    // SAFETY: sa is a valid sockaddr_in of the size passed.
    let r = unsafe { libc::connect(fd, &sa as *const _ as *const libc::sockaddr, std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t) };
    if r != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(e);
        }
    }
    Ok(stream)
}

#[cfg(test)]
mod epoll_tests {
    use super::*;
    use std::io::Write;

    extern "C" fn ignore(_: libc::c_int) {}

    fn catch_usr2(flags: libc::c_int) {
        // SAFETY: sigaction is plain data; the handler is a valid extern "C" fn.
        unsafe {
            let mut a: libc::sigaction = std::mem::zeroed();
            a.sa_sigaction = ignore as *const () as usize;
            a.sa_flags = flags;
            assert_eq!(libc::sigaction(libc::SIGUSR2, &a, std::ptr::null_mut()), 0);
        }
    }

    /// A handler with SA_RESTART restarts a read it interrupts; one without makes it fail with
    /// EINTR (signal(7)), so one such handler decides for all.
    #[test]
    fn reads_restart_unless_a_handler_lacks_sa_restart() {
        catch_usr2(libc::SA_RESTART);
        assert!(interrupted_reads_restart(), "only restarting handlers (and the runtime's fault handlers)");
        catch_usr2(0);
        assert!(!interrupted_reads_restart(), "SIGUSR2's handler does not restart");
        // SAFETY: back to the default action.
        unsafe { libc::signal(libc::SIGUSR2, libc::SIG_DFL) };
        assert!(interrupted_reads_restart());
    }

    /// What the engine's ownership lease relies on: an edge-triggered socket modified to no
    /// interest reports nothing while data arrives, and modified back it reports the data
    /// that is already there (the modification itself raises the event).
    #[test]
    fn disarmed_edge_socket_reports_pending_data_when_rearmed() {
        let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let ep = Epoll::new().unwrap();
        ep.add(b.as_raw_fd(), 9, EPOLL_SOCKET_EDGE).unwrap();
        let mut out = Vec::new();
        ep.wait_for(&mut out, Some(std::time::Duration::from_micros(200))).unwrap();
        out.clear();
        ep.modify(b.as_raw_fd(), 9, libc::EPOLLET as u32).unwrap();
        a.write_all(b"x").unwrap();
        assert_eq!(ep.wait_for(&mut out, Some(std::time::Duration::from_micros(500))).unwrap(), 0);
        ep.modify(b.as_raw_fd(), 9, EPOLL_SOCKET_EDGE).unwrap();
        ep.wait_for(&mut out, Some(std::time::Duration::from_secs(5))).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, 9);
        assert_ne!(out[0].1 & libc::EPOLLIN as u32, 0);
    }

    #[test]
    fn epoll_reports_readiness_with_the_token() {
        let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let ep = Epoll::new().unwrap();
        ep.add(b.as_raw_fd(), 42, EPOLL_IN).unwrap();
        let mut out = Vec::new();
        assert_eq!(ep.wait(&mut out, 0).unwrap(), 0);
        a.write_all(b"x").unwrap();
        ep.wait(&mut out, 1000).unwrap();
        assert_eq!(out[0].0, 42);
        ep.modify(b.as_raw_fd(), 7, EPOLL_IN).unwrap();
        out.clear();
        ep.wait(&mut out, 1000).unwrap();
        assert_eq!(out[0].0, 7);
        ep.delete(b.as_raw_fd()).unwrap();
        out.clear();
        assert_eq!(ep.wait(&mut out, 0).unwrap(), 0);
    }

    #[test]
    fn connect_start_and_peer_timeout() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let std::net::SocketAddr::V4(a) = l.local_addr().unwrap() else { panic!() };
        let c = tcp_connect_start(a).unwrap();
        set_peer_timeout(&c, 5000).unwrap();
        let (s, _) = l.accept().unwrap();
        drop(s);
        // A port nobody listens on: the start succeeds, the error comes later.
        drop(l);
        let c = tcp_connect_start(a).unwrap();
        let mut out = Vec::new();
        let ep = Epoll::new().unwrap();
        ep.add(c.as_raw_fd(), 1, EPOLL_SOCKET_EDGE).unwrap();
        ep.wait(&mut out, 5000).unwrap();
        assert!(c.take_error().unwrap().is_some());
    }

    #[test]
    fn maxseg_of_a_loopback_stream() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        assert!(tcp_maxseg(&c).unwrap() >= 536);
    }

    #[test]
    fn poll_quiet_tells_the_sockets_with_input_or_a_hang_up() {
        use std::io::Write;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let pair = || {
            let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (s, _) = l.accept().unwrap();
            (c, s)
        };
        let (a, mut a_peer) = pair();
        let (b, _b_peer) = pair();
        let (c, c_peer) = pair();
        a_peer.write_all(b"x").unwrap();
        drop(c_peer);
        let fds = [a.as_raw_fd(), b.as_raw_fd(), c.as_raw_fd(), -1];
        let mut quiet = [true; 4];
        // The byte and the FIN cross loopback at once, but give them a moment.
        for _ in 0..100 {
            poll_quiet(&fds, &mut quiet);
            if !quiet[0] && !quiet[2] {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(quiet, [false, true, false, true], "input, nothing, a FIN, no descriptor at all (fd -1 is skipped by poll)");
        let mut short = [true; 2];
        poll_quiet(&fds, &mut short);
        assert_eq!(short, [false, true], "as many answers as room for them");
    }
}

/// `recv(fd, buf, MSG_DONTWAIT)` on a socket, whatever the socket's blocking mode (which its
/// other descriptors may share): `Ok(0)` when nothing is queued or the peer closed.
pub fn recv_dontwait(s: &impl AsRawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is a valid writable buffer of the length given.
    let n = unsafe { libc::recv(s.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, buf.len(), libc::MSG_DONTWAIT) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::WouldBlock { Ok(0) } else { Err(e) };
    }
    Ok(n as usize)
}

/// Which of `fds` have something to report now: one `poll(2)` with a zero timeout; `quiet[i]`
/// is set when descriptor `i` reported nothing (no input, hang-up or error). At most
/// [`POLL_QUIET_MAX`] descriptors are looked at; the rest are reported as not quiet. On any
/// failure of the call every descriptor is reported as not quiet (the caller then reads
/// them all, as without the look).
pub fn poll_quiet(fds: &[i32], quiet: &mut [bool]) {
    let n = fds.len().min(quiet.len()).min(POLL_QUIET_MAX);
    quiet.iter_mut().for_each(|q| *q = false);
    let mut p = [libc::pollfd { fd: -1, events: 0, revents: 0 }; POLL_QUIET_MAX];
    for (slot, &fd) in p.iter_mut().zip(&fds[..n]) {
        *slot = libc::pollfd { fd, events: libc::POLLIN | libc::POLLRDHUP, revents: 0 };
    }
    // SAFETY: p holds n initialized pollfd entries; a zero timeout never blocks.
    let r = unsafe { libc::poll(p.as_mut_ptr(), n as libc::nfds_t, 0) };
    if r < 0 {
        return;
    }
    for (q, e) in quiet.iter_mut().zip(&p[..n]) {
        *q = e.revents == 0;
    }
}

/// The most descriptors one [`poll_quiet`] looks at.
pub const POLL_QUIET_MAX: usize = 64;

/// The mask of `sched_{get,set}affinity`: one bit per CPU, in `unsigned long` words (the
/// kernel's `cpumask` layout, as glibc's `CPU_SET` writes it).
const MASK_WORD_BITS: usize = libc::c_ulong::BITS as usize;

/// The CPUs thread `tid` may run on (`sched_getaffinity`; `tid` 0: the calling thread), in
/// ascending order. The mask grows until it holds every CPU the kernel knows of (`EINVAL`
/// means too small), so machines past glibc's fixed 1024-CPU `cpu_set_t` are read whole.
pub fn thread_affinity(tid: i32) -> io::Result<Vec<usize>> {
    let mut words = 1024 / MASK_WORD_BITS;
    loop {
        let mut mask: Vec<libc::c_ulong> = vec![0; words];
        let bytes = words * std::mem::size_of::<libc::c_ulong>();
        // SAFETY: `mask` is a writable buffer of `bytes` bytes; the call writes at most that
        // many and reads nothing from it.
        let r = unsafe { libc::sched_getaffinity(tid, bytes, mask.as_mut_ptr().cast::<libc::cpu_set_t>()) };
        if r == 0 {
            return Ok((0..words * MASK_WORD_BITS).filter(|&c| mask[c / MASK_WORD_BITS] >> (c % MASK_WORD_BITS) & 1 == 1).collect());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINVAL) || words >= 1 << 16 {
            return Err(e);
        }
        words *= 2;
    }
}

/// The CPU the calling thread runs on now (`sched_getcpu`: glibc reads it from the thread's
/// rseq area, no system call), or `None` where the kernel cannot say.
pub fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu takes no arguments and touches no caller memory.
    let c = unsafe { libc::sched_getcpu() };
    usize::try_from(c).ok()
}

/// Restricts the calling thread to `cpus` (`sched_setaffinity(0, …)`). `EINVAL` when none of
/// them is one the thread may use (its cpuset, the online CPUs).
pub fn set_thread_affinity(cpus: &[usize]) -> io::Result<()> {
    let words = cpus.iter().max().map_or(1, |&m| m / MASK_WORD_BITS + 1);
    let mut mask: Vec<libc::c_ulong> = vec![0; words];
    for &c in cpus {
        mask[c / MASK_WORD_BITS] |= 1 << (c % MASK_WORD_BITS);
    }
    let bytes = words * std::mem::size_of::<libc::c_ulong>();
    // SAFETY: `mask` is a readable buffer of `bytes` bytes; the call only reads it.
    check(unsafe { libc::sched_setaffinity(0, bytes, mask.as_ptr().cast::<libc::cpu_set_t>()) }.into())
}

/// Restricts thread `t` (spawned by Rust, not joined yet) to `cpus`
/// (`pthread_setaffinity_np`). `EINVAL` when none of them is one the thread may use.
pub fn set_affinity_of<T>(t: &std::thread::JoinHandle<T>, cpus: &[usize]) -> io::Result<()> {
    use std::os::unix::thread::JoinHandleExt;
    let words = cpus.iter().max().map_or(1, |&m| m / MASK_WORD_BITS + 1);
    let mut mask: Vec<libc::c_ulong> = vec![0; words];
    for &c in cpus {
        mask[c / MASK_WORD_BITS] |= 1 << (c % MASK_WORD_BITS);
    }
    let bytes = words * std::mem::size_of::<libc::c_ulong>();
    // SAFETY: the handle's thread is neither joined nor detached while `t` is borrowed, so its
    // pthread_t is valid; `mask` is a readable buffer of `bytes` bytes, only read.
    match unsafe { libc::pthread_setaffinity_np(t.as_pthread_t(), bytes, mask.as_ptr().cast::<libc::cpu_set_t>()) } {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

#[cfg(test)]
mod affinity_tests {
    use super::*;

    /// A thread narrowed to one CPU reads back exactly that CPU, and the process's main
    /// thread (tid = pid) keeps its own mask.
    #[test]
    fn set_then_get_round_trips() {
        let all = thread_affinity(0).unwrap();
        assert!(!all.is_empty());
        let last = *all.last().unwrap();
        let pid = std::process::id() as i32;
        let main_before = thread_affinity(pid).unwrap();
        let got = std::thread::spawn(move || {
            set_thread_affinity(&[last]).unwrap();
            thread_affinity(0).unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(got, vec![last]);
        // Another thread's, through its handle.
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            wait.recv().unwrap();
            thread_affinity(0).unwrap()
        });
        set_affinity_of(&t, &[last]).unwrap();
        go.send(()).unwrap();
        assert_eq!(t.join().unwrap(), vec![last]);
        assert_eq!(thread_affinity(pid).unwrap(), main_before);
        // A CPU no machine has: nothing allowed is left.
        assert!(std::thread::spawn(|| set_thread_affinity(&[1 << 20])).join().unwrap().is_err());
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds (the clock `std::time::Instant` reads, without the
/// `Duration` arithmetic around it).
pub fn monotonic_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: t is a valid timespec the call writes; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    (t.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(t.tv_nsec as u64)
}

/// The calling thread's id (`gettid`).
pub fn current_tid() -> i32 {
    // SAFETY: gettid takes no arguments and touches no caller memory.
    unsafe { libc::gettid() }
}

/// Whether thread `tid` of this process still exists (`tgkill(getpid(), tid, 0)`: no signal
/// is sent). A thread that was cancelled or exited is gone; its id may be reused later.
pub fn thread_alive(tid: i32) -> bool {
    // SAFETY: signal 0 only checks that the thread exists; no memory is passed.
    let r = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}
