//! What `uiw up` needs to know about a network device: MAC, MTU, ifindex,
//! link state, speed and IPv4 addresses. Read from `/sys/class/net/<dev>`
//! (overridable with `UIW_HOST_SYSFS` for tests) and `getifaddrs(3)`.

use std::fs;
use std::net::Ipv4Addr;
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Netdev {
    pub name: String,
    pub mac: [u8; 6],
    pub mtu: u32,
    pub ifindex: u32,
    /// IFF_UP and IFF_RUNNING (carrier) — what siw calls "netif_running && carrier_ok".
    pub running: bool,
    /// Mbit/s from `/sys/class/net/<dev>/speed`, `None` when unknown (lo, virtual devices).
    pub speed_mbps: Option<u32>,
    /// IPv4 addresses in the kernel's order (primary first), aliases (`eth0:1`) included.
    pub ipv4: Vec<Ipv4Addr>,
}

fn read_trim(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut out = [0u8; 6];
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return None;
    }
    for (i, p) in parts.iter().enumerate() {
        out[i] = u8::from_str_radix(p, 16).ok()?;
    }
    Some(out)
}

pub fn lookup(host_sysfs: &Path, name: &str) -> Result<Netdev, String> {
    if name.is_empty() || name.len() > 15 || name.contains('/') || name.starts_with('.') {
        return Err(format!("'{name}' is not a valid network device name"));
    }
    let dir = host_sysfs.join("class/net").join(name);
    if !dir.exists() {
        return Err(format!(
            "no network device '{name}' (not in {}); see `ip link`",
            dir.parent().unwrap().display()
        ));
    }
    let mac = read_trim(&dir.join("address")).and_then(|s| parse_mac(&s)).unwrap_or([0; 6]);
    let mtu = read_trim(&dir.join("mtu")).and_then(|s| s.parse().ok()).unwrap_or(1500);
    let ifindex = read_trim(&dir.join("ifindex")).and_then(|s| s.parse().ok()).unwrap_or(0);
    let flags = read_trim(&dir.join("flags"))
        .and_then(|s| u32::from_str_radix(s.trim_start_matches("0x"), 16).ok())
        .unwrap_or(0);
    // carrier reads EINVAL when the device is down; treat "unreadable" as no carrier.
    let carrier = read_trim(&dir.join("carrier")).map(|s| s == "1").unwrap_or(false);
    let running = flags & (libc::IFF_UP as u32) != 0 && carrier;
    let speed_mbps = read_trim(&dir.join("speed"))
        .and_then(|s| s.parse::<i64>().ok())
        .filter(|&v| v > 0 && v < u32::MAX as i64)
        .map(|v| v as u32);
    Ok(Netdev { name: name.to_string(), mac, mtu, ifindex, running, speed_mbps, ipv4: ipv4_addrs(name) })
}

pub use uiw_kabi::sys::ipv4_addrs;

/// The IB (speed, width) pair the kernel's `ib_get_eth_speed()` reports for an
/// Ethernet netdev of this speed: an unknown speed (no ethtool speed: lo, or
/// SPEED_UNKNOWN) counts as 1000 Mb/s, as there. The table is mainline's for a
/// netdev that reports no lane count (`ib_get_width_and_speed`; sysfs has no
/// lanes); kernels before 6.10 stop at 4X EDR above 40 Gb/s.
/// Returns (ib_speed enum value, ib_width enum value).
pub fn ib_speed_width(speed_mbps: Option<u32>) -> (u8, u8) {
    const SDR: u8 = 1;
    const DDR: u8 = 2;
    const FDR10: u8 = 8;
    const EDR: u8 = 32;
    const HDR: u8 = 64;
    const NDR: u8 = 128;
    const W1X: u8 = 1;
    const W4X: u8 = 2;
    const W2X: u8 = 16;
    match speed_mbps.unwrap_or(1000) {
        0..=1000 => (SDR, W1X),
        1001..=10000 => (FDR10, W1X),
        10001..=20000 => (DDR, W4X),
        20001..=25000 => (EDR, W1X),
        25001..=40000 => (FDR10, W4X),
        40001..=50000 => (EDR, W2X),
        50001..=100000 => (EDR, W4X),
        100001..=200000 => (HDR, W4X),
        _ => (NDR, W4X),
    }
}

/// The kernel's `ports/<p>/rate` text for an (ib_speed, ib_width) pair.
pub fn rate_text(speed: u8, width: u8) -> String {
    let (tenths, name) = match speed {
        2 => (50, " DDR"),
        4 => (100, " QDR"),
        8 => (100, " FDR10"),
        16 => (140, " FDR"),
        32 => (250, " EDR"),
        64 => (500, " HDR"),
        128 => (1000, " NDR"),
        _ => (25, " SDR"),
    };
    let lanes = match width {
        1 => 1,
        2 => 4,
        4 => 8,
        8 => 12,
        16 => 2,
        _ => 0,
    };
    let rate = tenths * lanes;
    format!("{}{} Gb/sec ({}X{})", rate / 10, if rate % 10 != 0 { ".5" } else { "" }, lanes, name)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn rates() {
        assert_eq!(rate_text(1, 1), "2.5 Gb/sec (1X SDR)");
        assert_eq!(rate_text(8, 1), "10 Gb/sec (1X FDR10)");
        assert_eq!(rate_text(32, 2), "100 Gb/sec (4X EDR)");
        assert_eq!(ib_speed_width(None), (1, 1));
        assert_eq!(ib_speed_width(Some(10000)), (8, 1));
        assert_eq!(ib_speed_width(Some(100000)), (32, 2));
        assert_eq!(ib_speed_width(Some(50000)), (32, 16));
        assert_eq!(ib_speed_width(Some(400000)), (128, 2));
        assert_eq!(ib_speed_width(Some(1000)), (1, 1));
        assert_eq!(rate_text(32, 16), "50 Gb/sec (2X EDR)");
        assert_eq!(rate_text(128, 2), "400 Gb/sec (4X NDR)");
        assert_eq!(rate_text(64, 2), "200 Gb/sec (4X HDR)");
    }
    #[test]
    fn mac() {
        assert_eq!(parse_mac("52:54:00:12:34:56"), Some([0x52, 0x54, 0, 0x12, 0x34, 0x56]));
        assert_eq!(parse_mac("00:00:00:00:00:00"), Some([0; 6]));
        assert_eq!(parse_mac("bogus"), None);
    }
}
