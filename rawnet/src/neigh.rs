//! The peer's MAC address from the kernel's neighbour table (ARP, `/proc/net/arp` of the
//! calling thread's namespace). uiw does not answer or send ARP itself: the kernel owns the
//! interface's address, answers the peer's ARP requests (the XDP program and the AF_PACKET
//! filter leave ARP to it), and resolves the peer when asked to send to it.

use std::io;
use std::net::{Ipv4Addr, UdpSocket};
use std::time::{Duration, Instant};

/// A complete entry for `ip` in the calling thread's ARP table.
pub fn lookup(ip: Ipv4Addr) -> Option<[u8; 6]> {
    let text = std::fs::read_to_string("/proc/thread-self/net/arp").ok()?;
    parse_arp(&text, ip)
}

fn parse_arp(text: &str, ip: Ipv4Addr) -> Option<[u8; 6]> {
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 4 || f[0].parse::<Ipv4Addr>().ok()? != ip {
            continue;
        }
        let flags = u32::from_str_radix(f[2].trim_start_matches("0x"), 16).ok()?;
        if flags & 0x2 == 0 {
            continue; // ATF_COM: not (yet) complete
        }
        let mut mac = [0u8; 6];
        let parts: Vec<&str> = f[3].split(':').collect();
        if parts.len() != 6 {
            continue;
        }
        for (d, p) in mac.iter_mut().zip(parts) {
            *d = u8::from_str_radix(p, 16).ok()?;
        }
        return Some(mac);
    }
    None
}

/// Resolve `ip`: from the table, or by making the kernel resolve it (a one-byte UDP
/// datagram to the discard port makes it send ARP requests), waiting up to `timeout`.
pub fn resolve(ip: Ipv4Addr, timeout: Duration) -> io::Result<[u8; 6]> {
    if let Some(m) = lookup(ip) {
        return Ok(m);
    }
    let sock = UdpSocket::bind("0.0.0.0:0")?;
    let start = Instant::now();
    let mut next_nudge = start;
    loop {
        if Instant::now() >= next_nudge {
            let _ = sock.send_to(&[0], (ip, 9));
            next_nudge = Instant::now() + Duration::from_millis(200);
        }
        if let Some(m) = lookup(ip) {
            return Ok(m);
        }
        if start.elapsed() >= timeout {
            return Err(io::Error::new(io::ErrorKind::TimedOut, format!("{ip}: no ARP reply (neighbour unreachable)")));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_table() {
        let t = "IP address       HW type     Flags       HW address            Mask     Device\n\
                 10.0.0.2         0x1         0x2         aa:bb:cc:00:11:22     *        veth0\n\
                 10.0.0.3         0x1         0x0         00:00:00:00:00:00     *        veth0\n";
        assert_eq!(parse_arp(t, "10.0.0.2".parse().unwrap()), Some([0xaa, 0xbb, 0xcc, 0, 0x11, 0x22]));
        assert_eq!(parse_arp(t, "10.0.0.3".parse().unwrap()), None);
        assert_eq!(parse_arp(t, "10.0.0.4".parse().unwrap()), None);
    }
}
