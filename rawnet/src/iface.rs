//! What the stack needs to know about an interface, asked of the kernel with ioctls on a
//! socket of the calling thread's network namespace (so it is right after `netns::enter`,
//! where `/sys/class/net` would still show the process's original namespace).

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// An interface's identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Iface {
    pub name: String,
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

impl Iface {
    /// Look `name` up in the calling thread's network namespace. Fails if it has no IPv4
    /// address.
    pub fn lookup(name: &str) -> io::Result<Iface> {
        // SAFETY: plain socket(2); the result is checked before it is owned.
        let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
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
        Ok(Iface { name: name.to_string(), index, mac, ip, mtu })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_errors() {
        let lo = Iface::lookup("lo").unwrap();
        assert_eq!(lo.ip, Ipv4Addr::LOCALHOST);
        assert!(lo.index > 0 && lo.mtu >= 1500);
        let e = Iface::lookup("nonexistent0").unwrap_err();
        assert!(e.to_string().contains("nonexistent0"), "{e}");
        assert!(Iface::lookup("a-name-far-too-long").is_err());
    }
}
