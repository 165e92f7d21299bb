//! The AF_PACKET fallback: a `SOCK_RAW` packet socket bound to one interface.
//!
//! Receive is plain non-blocking `recv` (TPACKET_V3's block timeout adds about a
//! millisecond; TPACKET_V2 rings are a possible later step). A classic BPF filter attached
//! before `bind` lets only IPv4/TCP to uiw's address and port range, unfragmented, reach the
//! socket; `PACKET_IGNORE_OUTGOING` keeps our own transmissions out of it. The kernel sees
//! the same frames: pair the socket with [`crate::guard::RstGuard`].

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::RawFd;

use uiw_kabi::raw::packet::PacketFd;

use crate::{FrameIo, Iface};

pub use uiw_kabi::raw::packet::SockFilter;

const fn ins(code: u16, jt: u8, jf: u8, k: u32) -> SockFilter {
    SockFilter { code, jt, jf, k }
}

// Classic BPF opcodes (linux/filter.h).
const LD_H_ABS: u16 = 0x28;
const LD_B_ABS: u16 = 0x30;
const LD_W_ABS: u16 = 0x20;
const LDX_B_MSH: u16 = 0xb1;
const LD_H_IND: u16 = 0x48;
const JEQ_K: u16 = 0x15;
const JGE_K: u16 = 0x35;
const JGT_K: u16 = 0x25;
const JSET_K: u16 = 0x45;
const RET_K: u16 = 0x06;

/// The filter: Ethernet/IPv4, protocol TCP, destination `ip`, not a fragment, TCP
/// destination port in `ports` → whole frame; anything else → dropped (the kernel still
/// gets its own copy).
pub fn filter(ip: Ipv4Addr, ports: (u16, u16)) -> Vec<SockFilter> {
    filter_with(ip, ports, &[])
}

/// [`filter`], also passing TCP to the `extra` ports (at most [`MAX_EXTRA`]; see
/// `FrameIo::steer`).
pub fn filter_with(ip: Ipv4Addr, ports: (u16, u16), extra: &[u16]) -> Vec<SockFilter> {
    let n = extra.len().min(MAX_EXTRA) as u8;
    let mut p = vec![
        ins(LD_H_ABS, 0, 0, 12),                 // 0: ethertype
        ins(JEQ_K, 0, 10 + n, 0x0800),           // 1: IPv4 ? : drop
        ins(LD_B_ABS, 0, 0, 23),                 // 2: IP protocol
        ins(JEQ_K, 0, 8 + n, 6),                 // 3: TCP ? : drop
        ins(LD_W_ABS, 0, 0, 30),                 // 4: destination address
        ins(JEQ_K, 0, 6 + n, u32::from(ip)),     // 5: ours ? : drop
        ins(LD_H_ABS, 0, 0, 20),                 // 6: flags + fragment offset
        ins(JSET_K, 4 + n, 0, 0x3fff),           // 7: fragment ? drop
        ins(LDX_B_MSH, 0, 0, 14),                // 8: X = IP header length
        ins(LD_H_IND, 0, 0, 16),                 // 9: TCP destination port
        ins(JGE_K, 0, 1, u32::from(ports.0)),    // 10: >= lo ? : the extra ports
        ins(JGT_K, 0, 1 + n, u32::from(ports.1)), // 11: > hi ? the extra ports : accept
    ];
    for (k, &port) in extra.iter().take(n as usize).enumerate() {
        p.push(ins(JEQ_K, n - k as u8, 0, u32::from(port))); // 12 + k: this one ? accept
    }
    p.push(ins(RET_K, 0, 0, 0)); //                              12 + n: drop
    p.push(ins(RET_K, 0, 0, 0x0004_0000)); //                    13 + n: accept (whole frame)
    p
}

/// Ports a socket passes beyond its range at most (a classic BPF jump reaches 255 ahead).
pub const MAX_EXTRA: usize = 200;


/// An AF_PACKET socket on one interface.
#[derive(Debug)]
pub struct PacketSocket {
    fd: PacketFd,
    buf: Vec<u8>,
    ip: Ipv4Addr,
    ports: (u16, u16),
    /// Ports passed beyond the range (see `FrameIo::steer`).
    extra: Vec<u16>,
}

impl PacketSocket {
    /// Open on `iface`, passing uiw's TCP to `iface.ip` on `ports`. Needs CAP_NET_RAW.
    pub fn open(iface: &Iface, ports: (u16, u16)) -> io::Result<PacketSocket> {
        let fd = PacketFd::open(iface.index, &filter(iface.ip, ports))?;
        Ok(PacketSocket { fd, buf: vec![0; 65536], ip: iface.ip, ports, extra: Vec::new() })
    }
}

impl FrameIo for PacketSocket {
    /// Replaces the filter (SO_ATTACH_FILTER swaps it atomically).
    fn steer(&mut self, port: u16, on: bool) -> io::Result<()> {
        let mut extra = self.extra.clone();
        extra.retain(|&p| p != port);
        if on {
            if extra.len() >= MAX_EXTRA {
                return Err(io::Error::new(io::ErrorKind::OutOfMemory, format!("more than {MAX_EXTRA} ports steered")));
            }
            extra.push(port);
        }
        self.fd.set_filter(&filter_with(self.ip, self.ports, &extra))?;
        self.extra = extra;
        Ok(())
    }

    fn recv(&mut self, budget: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let mut n = 0;
        while n < budget {
            let Some(len) = self.fd.recv(&mut self.buf)? else { break };
            if len <= self.buf.len() {
                f(&self.buf[..len]);
            }
            n += 1;
        }
        Ok(n)
    }

    fn send(&mut self, frame: &[u8]) -> io::Result<bool> {
        self.fd.send(frame)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }

    fn fd(&self) -> RawFd {
        self.fd.fd()
    }

    fn kind(&self) -> &'static str {
        "packet"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run the classic BPF program the way the kernel would (the subset it uses).
    fn run(prog: &[SockFilter], p: &[u8]) -> u32 {
        let (mut a, mut x, mut pc) = (0u32, 0u32, 0usize);
        let ld = |off: usize, n: usize| -> Option<u32> {
            p.get(off..off + n).map(|b| b.iter().fold(0u32, |acc, &v| acc << 8 | u32::from(v)))
        };
        loop {
            let i = prog[pc];
            pc += 1;
            match i.code {
                LD_H_ABS => a = match ld(i.k as usize, 2) { Some(v) => v, None => return 0 },
                LD_B_ABS => a = match ld(i.k as usize, 1) { Some(v) => v, None => return 0 },
                LD_W_ABS => a = match ld(i.k as usize, 4) { Some(v) => v, None => return 0 },
                LD_H_IND => a = match ld((x + i.k) as usize, 2) { Some(v) => v, None => return 0 },
                LDX_B_MSH => x = match ld(i.k as usize, 1) { Some(v) => (v & 0xf) * 4, None => return 0 },
                JEQ_K | JGE_K | JGT_K | JSET_K => {
                    let t = match i.code {
                        JEQ_K => a == i.k,
                        JGE_K => a >= i.k,
                        JGT_K => a > i.k,
                        _ => a & i.k != 0,
                    };
                    pc += usize::from(if t { i.jt } else { i.jf });
                }
                RET_K => return i.k,
                c => panic!("opcode {c:#x}"),
            }
        }
    }

    fn frame(dst: Ipv4Addr, port: u16, frag: u16) -> Vec<u8> {
        use uiw_utcp::packet::{emit_frame, frame_len, FrameAddrs, TcpHeader};
        let h = TcpHeader { src_port: 5000, dst_port: port, ..TcpHeader::default() };
        let a = FrameAddrs { src_mac: [2; 6], dst_mac: [4; 6], src: Ipv4Addr::new(10, 0, 0, 9), dst, ip_id: 1 };
        let mut f = vec![0; frame_len(&h, 3)];
        emit_frame(&a, &h, b"abc", &mut f);
        f[20..22].copy_from_slice(&frag.to_be_bytes());
        f
    }

    #[test]
    fn filter_takes_only_our_tcp() {
        let ip = Ipv4Addr::new(10, 0, 0, 1);
        let p = filter(ip, (20000, 24095));
        assert!(run(&p, &frame(ip, 20000, 0x4000)) > 0);
        assert!(run(&p, &frame(ip, 24095, 0)) > 0);
        assert_eq!(run(&p, &frame(ip, 19999, 0x4000)), 0);
        assert_eq!(run(&p, &frame(ip, 24096, 0x4000)), 0);
        assert_eq!(run(&p, &frame(ip, 22, 0x4000)), 0, "ssh stays with the kernel");
        assert_eq!(run(&p, &frame(Ipv4Addr::new(10, 0, 0, 2), 20000, 0)), 0);
        assert_eq!(run(&p, &frame(ip, 20000, 0x2000)), 0, "fragments are not ours");
        let mut arp = frame(ip, 20000, 0);
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        assert_eq!(run(&p, &arp), 0, "ARP stays with the kernel");
        let mut udp = frame(ip, 20000, 0);
        udp[23] = 17;
        assert_eq!(run(&p, &udp), 0);
    }

    /// rdma_cm listens on the port the application names (rping's 7174, perftest's 18515):
    /// those pass too once steered, and nothing else does; every early "drop" still lands
    /// on the drop however many ports are added.
    #[test]
    fn filter_passes_steered_ports_too() {
        let ip = Ipv4Addr::new(10, 0, 0, 1);
        for n in [0usize, 1, 2, 7, MAX_EXTRA] {
            let extra: Vec<u16> = (0..n as u16).map(|k| 7174 + 3 * k).collect();
            let p = filter_with(ip, (20000, 24095), &extra);
            assert_eq!(p.len(), 14 + n);
            for &port in &extra {
                assert!(run(&p, &frame(ip, port, 0x4000)) > 0, "{n} extra: {port}");
                assert_eq!(run(&p, &frame(ip, port + 1, 0x4000)), 0, "{n} extra: {}", port + 1);
                assert_eq!(run(&p, &frame(Ipv4Addr::new(10, 0, 0, 2), port, 0)), 0);
                assert_eq!(run(&p, &frame(ip, port, 0x2000)), 0, "fragments are not ours");
            }
            assert!(run(&p, &frame(ip, 20000, 0)) > 0);
            assert!(run(&p, &frame(ip, 24095, 0)) > 0);
            assert_eq!(run(&p, &frame(ip, 24096, 0)), 0);
            assert_eq!(run(&p, &frame(ip, 22, 0)), 0, "ssh stays with the kernel");
            let mut arp = frame(ip, extra.first().copied().unwrap_or(20000), 0);
            arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
            assert_eq!(run(&p, &arp), 0, "ARP stays with the kernel");
        }
    }
}
