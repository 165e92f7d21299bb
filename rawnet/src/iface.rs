//! What the stack needs to know about an interface, asked of the kernel with ioctls on a
//! socket of the calling thread's network namespace (so it is right after `netns::enter`,
//! where `/sys/class/net` would still show the process's original namespace).

use std::io;
use std::net::Ipv4Addr;

/// An interface's identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Iface {
    pub name: String,
    pub index: u32,
    pub mac: [u8; 6],
    pub ip: Ipv4Addr,
    pub mtu: usize,
}

impl Iface {
    /// Look `name` up in the calling thread's network namespace. Fails if it has no IPv4
    /// address.
    pub fn lookup(name: &str) -> io::Result<Iface> {
        let i = uiw_kabi::raw::iface(name)?;
        Ok(Iface { name: name.to_string(), index: i.index, mac: i.mac, ip: i.ip, mtu: i.mtu })
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
