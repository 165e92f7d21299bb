//! The system calls and shared memory behind uiw's raw-frame transport (`uiw-rawnet`, issue
//! 12), with safe interfaces: what `rawnet` needs of the kernel that cannot be said without
//! `unsafe` lives here, at the FFI edge, so that `rawnet` itself forbids `unsafe`.
//!
//! - [`xsk`]: an `AF_XDP` socket, its UMEM and its four rings (`mmap`ed memory the kernel
//!   writes concurrently): frames are handed out as slices only while this side owns them.
//! - [`bpf`]: `bpf(2)`: an XSK map, loading an XDP program, attaching it with a link.
//! - [`packet`]: an `AF_PACKET` socket with a classic BPF filter.
//! - here: a socket of any family (the privilege probe), entering a network namespace, an
//!   interface's index/MAC/IPv4 address/MTU (ioctls), waiting for a descriptor, and the
//!   eventfd that tells an epoll loop a stream has news.

pub mod bpf;
pub mod packet;
pub mod xsk;

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

pub(crate) fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// `socket(family, ty | SOCK_CLOEXEC, protocol)`, owned.
pub fn socket(family: libc::c_int, ty: libc::c_int, protocol: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the result is checked before it is owned.
    let raw = cvt(unsafe { libc::socket(family, ty | libc::SOCK_CLOEXEC, protocol) })?;
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// `setns(f, CLONE_NEWNET)`: moves the calling thread (only) into the network namespace `f`
/// refers to (`/run/netns/NAME`).
pub fn enter_netns(f: &File) -> io::Result<()> {
    // SAFETY: setns(2) on a descriptor we hold open; it changes only this thread's namespace.
    cvt(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) }).map(|_| ())
}

/// An interface as the calling thread's network namespace sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IfInfo {
    pub index: u32,
    pub mac: [u8; 6],
    pub ip: Ipv4Addr,
    pub mtu: usize,
}

fn ifreq(name: &str) -> io::Result<libc::ifreq> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("bad interface name {name:?}")));
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut r: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in r.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    Ok(r)
}

fn ioctl(fd: &OwnedFd, req: libc::Ioctl, r: &mut libc::ifreq) -> io::Result<()> {
    // SAFETY: `r` is a valid, writable ifreq for the duration of the call; these SIOCGIF*
    // requests read and write only an ifreq.
    if unsafe { libc::ioctl(fd.as_raw_fd(), req, r as *mut libc::ifreq) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Interface `name`'s index, MAC, IPv4 address and MTU, asked with ioctls on a socket of the
/// calling thread's namespace (right after [`enter_netns`], where `/sys/class/net` would
/// still show the process's original namespace). Fails if it has no IPv4 address.
pub fn iface(name: &str) -> io::Result<IfInfo> {
    let fd = socket(libc::AF_INET, libc::SOCK_DGRAM, 0)?;
    let ctx = |e: io::Error, what: &str| io::Error::new(e.kind(), format!("{name}: {what}: {e}"));
    let mut r = ifreq(name)?;
    ioctl(&fd, libc::SIOCGIFINDEX, &mut r).map_err(|e| ctx(e, "no such interface"))?;
    // SAFETY: SIOCGIFINDEX filled the ifindex member of the union.
    let index = unsafe { r.ifr_ifru.ifru_ifindex } as u32;
    let mut r = ifreq(name)?;
    ioctl(&fd, libc::SIOCGIFHWADDR, &mut r).map_err(|e| ctx(e, "hardware address"))?;
    // SAFETY: SIOCGIFHWADDR filled the hwaddr member.
    let hw = unsafe { r.ifr_ifru.ifru_hwaddr };
    let mut mac = [0u8; 6];
    for (d, s) in mac.iter_mut().zip(hw.sa_data.iter()) {
        *d = *s as u8;
    }
    let mut r = ifreq(name)?;
    ioctl(&fd, libc::SIOCGIFMTU, &mut r).map_err(|e| ctx(e, "MTU"))?;
    // SAFETY: SIOCGIFMTU filled the mtu member.
    let mtu = unsafe { r.ifr_ifru.ifru_mtu } as usize;
    let mut r = ifreq(name)?;
    ioctl(&fd, libc::SIOCGIFADDR, &mut r).map_err(|e| ctx(e, "no IPv4 address"))?;
    // SAFETY: SIOCGIFADDR filled the addr member with a sockaddr_in (AF_INET socket).
    let sa = unsafe { r.ifr_ifru.ifru_addr };
    let ip = Ipv4Addr::new(sa.sa_data[2] as u8, sa.sa_data[3] as u8, sa.sa_data[4] as u8, sa.sa_data[5] as u8);
    Ok(IfInfo { index, mac, ip, mtu })
}

/// Registers `f` to run when the process exits normally (`atexit(3)`); fails when the C
/// library's table is full.
pub fn at_exit(f: extern "C" fn()) -> io::Result<()> {
    // SAFETY: `f` is a plain `extern "C" fn()` with no arguments, as atexit(3) wants; it
    // lives for the whole program.
    if unsafe { libc::atexit(f) } == 0 {
        Ok(())
    } else {
        Err(io::Error::new(io::ErrorKind::OutOfMemory, "atexit: no room for another handler"))
    }
}

/// Waits until `fd` is readable or `timeout` has passed (`poll(2)`, millisecond resolution,
/// rounded up); an interruption counts as a timeout.
pub fn poll_readable(fd: RawFd, timeout: Duration) -> io::Result<bool> {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd for the duration of the call (an invalid fd is reported in
    // revents, not undefined).
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted { Ok(false) } else { Err(e) };
    }
    Ok(r > 0)
}

/// A non-blocking `eventfd(2)`: how the raw-frame transport tells an epoll loop (the
/// provider's progress thread) that a stream or a listener it serves has news, as a kernel
/// socket's readiness would.
#[derive(Debug)]
pub struct EventFd(File);

impl EventFd {
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: plain eventfd(2) with flags only; checked before it is owned.
        let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
        // SAFETY: fd is a fresh descriptor nothing else owns.
        Ok(EventFd(File::from(unsafe { OwnedFd::from_raw_fd(fd) })))
    }

    /// Makes the descriptor readable (and raises an edge for an edge-triggered epoll).
    pub fn signal(&self) {
        let _ = (&self.0).write(&1u64.to_ne_bytes());
    }

    /// Makes it unreadable again (for a level-triggered waiter).
    pub fn drain(&self) {
        let mut b = [0u8; 8];
        let _ = (&self.0).read(&mut b);
    }

    pub fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_errors() {
        let lo = iface("lo").unwrap();
        assert_eq!(lo.ip, Ipv4Addr::LOCALHOST);
        assert!(lo.index > 0 && lo.mtu >= 1500);
        let e = iface("nonexistent0").unwrap_err();
        assert!(e.to_string().contains("nonexistent0"), "{e}");
        assert!(iface("a-name-far-too-long").is_err());
    }

    #[test]
    fn eventfd_signals_and_drains() {
        let e = EventFd::new().unwrap();
        assert!(!poll_readable(e.fd(), Duration::ZERO).unwrap());
        e.signal();
        assert!(poll_readable(e.fd(), Duration::ZERO).unwrap());
        e.drain();
        assert!(!poll_readable(e.fd(), Duration::ZERO).unwrap());
    }
}
