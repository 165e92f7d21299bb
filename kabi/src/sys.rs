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
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 64];
        // SAFETY: evs has room for the 64 entries we pass as maxevents.
        let n = unsafe { libc::epoll_wait(self.fd.as_raw_fd(), evs.as_mut_ptr(), evs.len() as i32, timeout_ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted { Ok(0) } else { Err(e) };
        }
        out.extend(evs[..n as usize].iter().map(|e| (e.u64, e.events)));
        Ok(n as usize)
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

#[cfg(test)]
mod epoll_tests {
    use super::*;
    use std::io::Write;

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
    fn maxseg_of_a_loopback_stream() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        assert!(tcp_maxseg(&c).unwrap() >= 536);
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
