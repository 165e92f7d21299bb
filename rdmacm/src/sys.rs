//! Safe wrappers for the libc calls the connection manager needs: TCP sockets that can be
//! bound before they listen or connect (std cannot), the event channel's socket pair,
//! `poll`, and `struct sockaddr` conversions. FFI surface: every `unsafe` block here has a
//! `// SAFETY:` line; the logic modules call only these safe functions.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Never hand out (or keep) fd 0, 1 or 2: if `fd` is one of them (the application closed its
/// stdio), move it to the lowest free fd ≥ 3.
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC on an fd we own; the new fd is returned to us only.
    let n = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) })?;
    // SAFETY: n is a fresh fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

fn owned(fd: libc::c_int) -> io::Result<OwnedFd> {
    let fd = cvt(fd)?;
    // SAFETY: fd was just returned by the kernel and is owned by nobody else.
    above_stdio(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A connected `AF_UNIX` stream pair, both ends close-on-exec, neither below fd 3.
pub fn socketpair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1 as libc::c_int; 2];
    // SAFETY: fds has room for the two fds socketpair writes.
    cvt(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    // SAFETY: both fds are fresh and ours.
    let (a, b) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((above_stdio(a)?, above_stdio(b)?))
}

/// A TCP socket for `v6` or IPv4, close-on-exec.
pub fn tcp_socket(v6: bool) -> io::Result<OwnedFd> {
    let af = if v6 { libc::AF_INET6 } else { libc::AF_INET };
    // SAFETY: socket(2) has no memory arguments.
    owned(unsafe { libc::socket(af, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })
}

fn setsockopt_int(
    fd: &OwnedFd,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: v lives across the call and its size is passed.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            &v as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(drop)
}

pub fn set_reuseaddr(fd: &OwnedFd, on: bool) -> io::Result<()> {
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, on as libc::c_int)
}

/// `IP_BIND_ADDRESS_NO_PORT`: a bind to port 0 takes only the address; the port is picked at
/// `connect`, knowing the destination, so it is never one whose connection to that same
/// destination is still in TIME_WAIT (a port picked at bind time can be, and `connect` then
/// fails with EADDRNOTAVAIL).
pub fn set_bind_address_no_port(fd: &OwnedFd) -> io::Result<()> {
    setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_BIND_ADDRESS_NO_PORT, 1)
}

pub fn set_v6only(fd: &OwnedFd, on: bool) -> io::Result<()> {
    setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, on as libc::c_int)
}

/// `sockaddr_storage` for a Rust address, and its length.
pub fn to_storage(a: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in, sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo().to_be(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in6.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in6, sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// A Rust address from a `sockaddr_storage` (None for families other than IPv4/IPv6).
pub fn from_storage(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in; storage is larger.
            let sin = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6; storage is larger.
            let sin6 = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                u32::from_be(sin6.sin6_flowinfo),
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

pub fn bind(fd: &OwnedFd, a: &SocketAddr) -> io::Result<()> {
    let (ss, len) = to_storage(a);
    // SAFETY: ss is a valid sockaddr of length len.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &ss as *const _ as *const libc::sockaddr,
            len,
        )
    })
    .map(drop)
}

pub fn listen(fd: &OwnedFd, backlog: i32) -> io::Result<()> {
    // SAFETY: listen(2) has no memory arguments.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), backlog) }).map(drop)
}

fn name(fd: RawFd, peer: bool) -> io::Result<SocketAddr> {
    // SAFETY: all-zero sockaddr_storage is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let p = &mut ss as *mut _ as *mut libc::sockaddr;
    // SAFETY: ss/len describe a writable buffer of the right size.
    cvt(unsafe {
        if peer {
            libc::getpeername(fd, p, &mut len)
        } else {
            libc::getsockname(fd, p, &mut len)
        }
    })?;
    from_storage(&ss).ok_or_else(|| io::Error::from_raw_os_error(libc::EAFNOSUPPORT))
}

pub fn local_addr(fd: &OwnedFd) -> io::Result<SocketAddr> {
    name(fd.as_raw_fd(), false)
}

pub fn peer_addr(fd: &OwnedFd) -> io::Result<SocketAddr> {
    name(fd.as_raw_fd(), true)
}

/// `accept4(CLOEXEC)`, blocking unless the listening socket is non-blocking.
pub fn accept(fd: &OwnedFd) -> io::Result<OwnedFd> {
    // SAFETY: null address arguments are allowed.
    owned(unsafe {
        libc::accept4(
            fd.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        )
    })
}

pub fn set_nonblocking(fd: &OwnedFd, on: bool) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on an fd we own.
    let fl = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    let nfl = if on {
        fl | libc::O_NONBLOCK
    } else {
        fl & !libc::O_NONBLOCK
    };
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, nfl) }).map(drop)
}

/// Start a connect; `Ok(true)` when already connected, `Ok(false)` when in progress.
pub fn connect_start(fd: &OwnedFd, a: &SocketAddr) -> io::Result<bool> {
    let (ss, len) = to_storage(a);
    // SAFETY: ss is a valid sockaddr of length len.
    match cvt(unsafe {
        libc::connect(
            fd.as_raw_fd(),
            &ss as *const _ as *const libc::sockaddr,
            len,
        )
    }) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `SO_ERROR`: the result of a non-blocking connect.
pub fn take_error(fd: &OwnedFd) -> io::Result<i32> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: v/len describe a writable int.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            &mut v as *mut _ as *mut libc::c_void,
            &mut len,
        )
    })?;
    Ok(v)
}

/// `poll` one fd for `events`; the returned revents (0 on timeout). EINTR counts as timeout.
pub fn poll1(fd: RawFd, events: i16, timeout_ms: i32) -> io::Result<i16> {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: p is one valid pollfd.
    match cvt(unsafe { libc::poll(&mut p, 1, timeout_ms) }) {
        Ok(_) => Ok(p.revents),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
        Err(e) => Err(e),
    }
}

pub fn shutdown(fd: &OwnedFd) {
    // SAFETY: shutdown(2) has no memory arguments; errors (ENOTCONN) do not matter.
    unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR) };
}

/// `read(2)`: honours the file's O_NONBLOCK flag, which the application may have set.
pub fn read(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is writable for its length.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// `recv(MSG_DONTWAIT)`: never blocks, whatever the file's flags.
pub fn recv_dontwait(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is writable for its length.
    let n = unsafe {
        libc::recv(
            fd,
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// `send(MSG_NOSIGNAL)`.
pub fn send(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: buf is readable for its length.
    let n = unsafe {
        libc::send(
            fd,
            buf.as_ptr() as *const libc::c_void,
            buf.len(),
            libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Give up ownership of a socket (to the provider, which then owns it).
pub fn into_raw(fd: OwnedFd) -> RawFd {
    fd.into_raw_fd()
}

/// The local address the kernel's routing table picks for talking to `dst`
/// (a connected UDP socket sends nothing).
pub fn route_source(dst: IpAddr) -> io::Result<IpAddr> {
    let any: SocketAddr = match dst {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let s = std::net::UdpSocket::bind(any)?;
    s.connect((dst, 9))?;
    Ok(s.local_addr()?.ip())
}

/// The calling thread's errno, set.
pub fn set_errno(e: i32) {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

pub fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}
