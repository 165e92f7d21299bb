//! What uiw knows about the device it serves: read once from the sysfs-shaped tree that
//! `uiw up` publishes (`$SYSFS_PATH/class/infiniband/<dev>/`), as a kernel driver would know
//! it from its netdev.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// `enum ibv_mtu` values.
pub const IBV_MTU_256: u32 = 1;
pub const IBV_MTU_4096: u32 = 5;
/// `IB_SPEED_SDR` (2.5 Gb/s per lane) and `IB_WIDTH_1X`.
pub const IB_SPEED_SDR: u8 = 1;
pub const IB_WIDTH_1X: u8 = 1;

/// What carries a device's streams (`uiw up --transport`, published as `uiw/transport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    /// The kernel's TCP sockets.
    Tcp,
    /// uiw's userspace TCP over AF_XDP on the netdev.
    Xdp,
    /// uiw's userspace TCP over AF_PACKET on the netdev.
    Packet,
}

impl TransportKind {
    /// The published name; an absent or unknown one reads as `tcp` (trees from before
    /// `--transport`).
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Tcp => "tcp",
            TransportKind::Xdp => "xdp",
            TransportKind::Packet => "packet",
        }
    }

    pub fn parse(s: &str) -> TransportKind {
        match s.trim() {
            "xdp" => TransportKind::Xdp,
            "packet" => TransportKind::Packet,
            _ => TransportKind::Tcp,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// `uiw_<netdev>`.
    pub name: String,
    /// The netdev the device is bound to (`lo`).
    pub netdev: String,
    /// Node GUID as the number sysfs prints (`xxxx:xxxx:xxxx:xxxx`).
    pub node_guid: u64,
    /// GID table: the netdev's IPv4 addresses as IPv4-mapped IPv6 addresses.
    pub gids: Vec<[u8; 16]>,
    /// The netdev's MTU in bytes.
    pub netdev_mtu: u32,
    /// Entries of the published GID table (`ports/1/gids/0..len`): libibverbs reads every one
    /// below the length the port reports.
    pub gid_tbl_len: u32,
    /// Where it is published (`…/class/infiniband/uiw_lo`).
    pub ibdev_path: PathBuf,
    /// `ibv_port_attr.active_speed` / `active_width` (IB enum values): what the kernel's
    /// `ib_get_eth_speed()` derives from the netdev's ethtool speed, as `uiw up` computed it
    /// (`uiw/active_speed`, `uiw/active_width`, matching `ports/1/rate`). A tree without them
    /// reads as 1X SDR, the kernel's answer for a netdev without a speed (lo).
    pub active_speed: u8,
    pub active_width: u8,
    /// What carries its QPs' streams (`uiw/transport`).
    pub transport: TransportKind,
}

impl DeviceInfo {
    /// Loads the device published at `ibdev_path` (`…/class/infiniband/uiw_lo`).
    pub fn load(ibdev_path: &Path) -> io::Result<DeviceInfo> {
        let read = |rel: &str| -> io::Result<String> {
            fs::read_to_string(ibdev_path.join(rel)).map(|s| s.trim().to_string())
        };
        let name = ibdev_path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let node_guid = parse_guid(&read("node_guid")?).ok_or_else(|| bad(ibdev_path, "node_guid"))?;
        let netdev = read("uiw/netdev").or_else(|_| read("ports/1/gid_attrs/ndevs/0"))?;
        let netdev_mtu = read("uiw/mtu")
            .ok()
            .and_then(|m| m.parse().ok())
            .or_else(|| fs::read_to_string(format!("/sys/class/net/{netdev}/mtu")).ok()?.trim().parse().ok())
            .unwrap_or(1500);
        let mut gids = Vec::new();
        let gid_dir: PathBuf = ibdev_path.join("ports/1/gids");
        for i in 0.. {
            match fs::read_to_string(gid_dir.join(i.to_string())) {
                Ok(s) => match parse_gid(s.trim()) {
                    Some(g) if g != [0; 16] => gids.push(g),
                    Some(_) => {}
                    None => return Err(bad(ibdev_path, "ports/1/gids")),
                },
                Err(_) => break,
            }
        }
        let published = (0..).take_while(|i| gid_dir.join(i.to_string()).exists()).count() as u32;
        let gid_tbl_len = read("uiw/gid_tbl_len").ok().and_then(|n| n.parse().ok()).unwrap_or(published).min(published);
        let enum_file = |rel: &str| read(rel).ok().and_then(|v| v.parse::<u8>().ok()).filter(|&v| v != 0);
        let active_speed = enum_file("uiw/active_speed").unwrap_or(IB_SPEED_SDR);
        let active_width = enum_file("uiw/active_width").unwrap_or(IB_WIDTH_1X);
        let transport = read("uiw/transport").map(|t| TransportKind::parse(&t)).unwrap_or(TransportKind::Tcp);
        Ok(DeviceInfo {
            name,
            netdev,
            node_guid,
            gids,
            netdev_mtu,
            gid_tbl_len,
            active_speed,
            active_width,
            transport,
            ibdev_path: ibdev_path.to_path_buf(),
        })
    }

    /// `ibv_port_attr.active_mtu`: the largest IB MTU that fits the netdev MTU, as siw reports.
    pub fn active_mtu(&self) -> u32 {
        mtu_enum(self.netdev_mtu)
    }
}

fn bad(p: &Path, what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("{}: malformed {what}", p.display()))
}

/// The largest `enum ibv_mtu` not above `bytes` (256 … 4096).
pub fn mtu_enum(bytes: u32) -> u32 {
    let mut e = IBV_MTU_256;
    while e < IBV_MTU_4096 && (128u32 << (e + 1)) <= bytes {
        e += 1;
    }
    e
}

/// Parses a GUID as sysfs prints it: four groups of four hex digits joined by `:`.
pub fn parse_guid(s: &str) -> Option<u64> {
    let groups: Vec<&str> = s.split(':').collect();
    if groups.len() != 4 || groups.iter().any(|g| g.len() != 4) {
        return None;
    }
    groups.iter().try_fold(0u64, |acc, g| Some(acc << 16 | u64::from(u16::from_str_radix(g, 16).ok()?)))
}

/// Parses a GID as sysfs prints it: eight groups of four hex digits joined by `:`.
pub fn parse_gid(s: &str) -> Option<[u8; 16]> {
    let groups: Vec<&str> = s.split(':').collect();
    if groups.len() != 8 || groups.iter().any(|g| g.len() != 4) {
        return None;
    }
    let mut gid = [0u8; 16];
    for (i, g) in groups.iter().enumerate() {
        let v = u16::from_str_radix(g, 16).ok()?;
        gid[2 * i..2 * i + 2].copy_from_slice(&v.to_be_bytes());
    }
    Some(gid)
}

/// The IPv4 address inside an IPv4-mapped GID (`::ffff:a.b.c.d`), if it is one.
pub fn gid_ipv4(gid: &[u8; 16]) -> Option<std::net::Ipv4Addr> {
    if gid[..10] == [0; 10] && gid[10..12] == [0xff, 0xff] {
        Some(std::net::Ipv4Addr::new(gid[12], gid[13], gid[14], gid[15]))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sysfs_formats() {
        assert_eq!(parse_guid("0211:22ff:fe33:4455"), Some(0x021122fffe334455));
        assert_eq!(parse_guid("0211:22ff:fe33"), None);
        assert_eq!(parse_guid("zz11:22ff:fe33:4455"), None);
        let g = parse_gid("0000:0000:0000:0000:0000:ffff:7f00:0001").unwrap();
        assert_eq!(gid_ipv4(&g), Some(std::net::Ipv4Addr::LOCALHOST));
        assert_eq!(gid_ipv4(&[0xfe; 16]), None);
    }

    #[test]
    fn mtu_enum_follows_siw() {
        assert_eq!(mtu_enum(65536), IBV_MTU_4096);
        assert_eq!(mtu_enum(1500), 3); // 1024
        assert_eq!(mtu_enum(9000), IBV_MTU_4096);
        assert_eq!(mtu_enum(2048), 4);
        assert_eq!(mtu_enum(100), IBV_MTU_256);
    }

    #[test]
    fn loads_a_published_tree() {
        let dir = std::env::temp_dir().join(format!("uiw-devinfo-{}", std::process::id()));
        let dev = dir.join("uiw_lo");
        fs::create_dir_all(dev.join("ports/1/gids")).unwrap();
        fs::create_dir_all(dev.join("uiw")).unwrap();
        fs::write(dev.join("node_guid"), "7569:775f:6c6f:0001\n").unwrap();
        fs::write(dev.join("uiw/netdev"), "lo\n").unwrap();
        fs::write(dev.join("uiw/mtu"), "65536\n").unwrap();
        fs::write(dev.join("ports/1/gids/0"), "0000:0000:0000:0000:0000:ffff:7f00:0001\n").unwrap();
        fs::write(dev.join("ports/1/gids/1"), "0000:0000:0000:0000:0000:0000:0000:0000\n").unwrap();
        let info = DeviceInfo::load(&dev).unwrap();
        assert_eq!(info.name, "uiw_lo");
        assert_eq!(info.netdev, "lo");
        assert_eq!(info.node_guid, 0x7569_775f_6c6f_0001);
        assert_eq!(info.gids.len(), 1);
        assert_eq!(info.gid_tbl_len, 2, "every published entry, empty ones included");
        assert_eq!(info.active_mtu(), IBV_MTU_4096);
        assert_eq!((info.active_speed, info.active_width), (IB_SPEED_SDR, IB_WIDTH_1X), "no speed files: 1X SDR");
        fs::write(dev.join("uiw/active_speed"), "32\n").unwrap();
        fs::write(dev.join("uiw/active_width"), "2\n").unwrap();
        let info = DeviceInfo::load(&dev).unwrap();
        assert_eq!((info.active_speed, info.active_width), (32, 2), "4X EDR as published");
        fs::remove_dir_all(&dir).unwrap();
    }
}
