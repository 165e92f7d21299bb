//! An `AF_PACKET`/`SOCK_RAW` socket bound to one interface, receiving only what a classic
//! BPF filter passes (the filter is attached before `bind`, so nothing else is ever
//! queued), not its own transmissions (`PACKET_IGNORE_OUTGOING`), transmitting past the
//! qdisc layer where the kernel allows it, with deep socket buffers. Non-blocking.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use super::{cvt, socket};

/// One classic BPF instruction (`struct sock_filter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct SockFilter {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

/// A packet socket on one interface.
#[derive(Debug)]
pub struct PacketFd {
    fd: OwnedFd,
}

fn setopt_int(fd: &OwnedFd, level: libc::c_int, name: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: an int option: pointer and length match, `v` outlives the call.
    cvt(unsafe {
        libc::setsockopt(fd.as_raw_fd(), level, name, &v as *const libc::c_int as *const libc::c_void, std::mem::size_of::<libc::c_int>() as libc::socklen_t)
    })
    .map(|_| ())
}

/// Attaches (or atomically replaces) the socket's classic BPF filter.
fn attach_filter(fd: &OwnedFd, filter: &[SockFilter]) -> io::Result<()> {
    let fprog = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr() as *mut libc::sock_filter };
    // SAFETY: fprog points at `filter`, which outlives the call; the kernel copies it.
    // SockFilter is repr(C) with sock_filter's layout.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            &fprog as *const libc::sock_fprog as *const libc::c_void,
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

impl PacketFd {
    /// Opens on interface `ifindex` for IPv4 frames that `filter` passes. Needs CAP_NET_RAW.
    pub fn open(ifindex: u32, filter: &[SockFilter]) -> io::Result<PacketFd> {
        // Protocol 0: receive nothing until bound, i.e. until the filter is in place.
        let fd = socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_NONBLOCK, 0)
            .map_err(|e| io::Error::new(e.kind(), format!("AF_PACKET socket (needs CAP_NET_RAW): {e}")))?;
        attach_filter(&fd, filter)?;
        setopt_int(&fd, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, 1)?;
        // Transmit straight to the driver, past the qdisc layer (uiw paces itself with its
        // congestion window). Best effort: older kernels lack it.
        let _ = setopt_int(&fd, libc::SOL_PACKET, libc::PACKET_QDISC_BYPASS, 1);
        // A deep receive queue: a burst from a kernel peer must not overflow it between two
        // polls (each overflow is a loss the peer must repair). FORCE (root) may exceed
        // rmem_max; otherwise the plain option, capped by the kernel.
        let bytes: libc::c_int = 8 << 20;
        for (opt, alt) in [(libc::SO_RCVBUFFORCE, libc::SO_RCVBUF), (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF)] {
            for o in [opt, alt] {
                if setopt_int(&fd, libc::SOL_SOCKET, o, bytes).is_ok() {
                    break;
                }
            }
        }
        // SAFETY: sockaddr_ll is plain old data; all-zero is valid before we fill it.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_IP as u16).to_be();
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: sll is a valid sockaddr_ll and the length says so.
        cvt(unsafe {
            libc::bind(fd.as_raw_fd(), &sll as *const libc::sockaddr_ll as *const libc::sockaddr, std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t)
        })?;
        Ok(PacketFd { fd })
    }

    /// Replaces the filter (`SO_ATTACH_FILTER` swaps it atomically: no frame sees neither).
    pub fn set_filter(&self, filter: &[SockFilter]) -> io::Result<()> {
        attach_filter(&self.fd, filter)
    }

    /// The next frame into `buf`, without waiting: `Ok(None)` when none is queued. The length
    /// is the frame's (`MSG_TRUNC`): larger than `buf` when it did not fit.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            // SAFETY: `buf` is ours and writable for its whole length.
            let r = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, buf.len(), libc::MSG_DONTWAIT | libc::MSG_TRUNC) };
            if r >= 0 {
                return Ok(Some(r as usize));
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock => return Ok(None),
                io::ErrorKind::Interrupted => continue,
                _ => return Err(e),
            }
        }
    }

    /// Transmits one frame without waiting: `Ok(false)` when the socket has no room.
    pub fn send(&self, frame: &[u8]) -> io::Result<bool> {
        loop {
            // SAFETY: `frame` is a readable slice for the call's duration.
            let r = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr() as *const libc::c_void, frame.len(), libc::MSG_DONTWAIT) };
            if r >= 0 {
                return Ok(true);
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) | Some(libc::ENOBUFS) => return Ok(false),
                _ => return Err(e),
            }
        }
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sock_filter_layout() {
        assert_eq!(std::mem::size_of::<SockFilter>(), std::mem::size_of::<libc::sock_filter>());
        assert_eq!(std::mem::align_of::<SockFilter>(), std::mem::align_of::<libc::sock_filter>());
    }
}
