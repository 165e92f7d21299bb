//! Ethernet II, IPv4 (RFC 791) and TCP (RFC 9293 §3.1) headers: parse, emit and checksum.
//!
//! Only what the stack needs: IPv4 without options on receive (options are skipped), no
//! fragments (DF is set on every frame sent; a fragment is dropped), TCP options MSS, window
//! scale (RFC 7323 §2), SACK-permitted and SACK (RFC 2018). Checksums are always computed and
//! verified here: the test bed turns the veth offloads off, and the peer may be anything.

use std::net::Ipv4Addr;

/// An Ethernet MAC address.
pub type Mac = [u8; 6];

pub const ETH_HDR: usize = 14;
pub const IPV4_HDR: usize = 20;
pub const TCP_HDR: usize = 20;
pub const ETHERTYPE_IPV4: u16 = 0x0800;
pub const IPPROTO_TCP: u8 = 6;

/// TCP header flags.
pub mod flags {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const PSH: u8 = 0x08;
    pub const ACK: u8 = 0x10;
}

/// Why a frame was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseError {
    /// Shorter than its headers say.
    Truncated,
    /// Not IPv4/TCP (for the stack: someone else's frame).
    NotTcp,
    /// A fragment: uiw sends with DF and never reassembles IP.
    Fragment,
    /// IPv4 or TCP checksum wrong.
    Checksum,
    /// Header fields that make no sense (IHL < 5, data offset < 5 ...).
    Malformed,
}

/// A TCP header's fields and the options this stack knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpHeader {
    pub src_port: u16,
    pub dst_port: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    /// The raw 16-bit window field (unscaled).
    pub window: u16,
    pub mss: Option<u16>,
    pub wscale: Option<u8>,
    pub sack_permitted: bool,
    /// Up to 3 SACK blocks `[left, right)` (RFC 2018 §3); `sack_len` of them are valid.
    pub sack: [(u32, u32); 3],
    pub sack_len: u8,
}

impl TcpHeader {
    pub fn has(&self, f: u8) -> bool {
        self.flags & f != 0
    }

    /// Bytes the options take on the wire, padded to 4.
    pub fn options_len(&self) -> usize {
        let mut n = 0;
        if self.mss.is_some() {
            n += 4;
        }
        if self.wscale.is_some() {
            n += 4; // NOP + 3
        }
        if self.sack_permitted {
            n += 4; // NOP NOP + 2
        }
        if self.sack_len > 0 {
            n += 4 + 8 * self.sack_len as usize; // NOP NOP + 2 + blocks
        }
        n
    }

    pub fn header_len(&self) -> usize {
        TCP_HDR + self.options_len()
    }

    /// The SACK blocks carried.
    pub fn sack_blocks(&self) -> &[(u32, u32)] {
        &self.sack[..self.sack_len as usize]
    }
}

/// A parsed IPv4/TCP packet borrowed from a frame.
#[derive(Debug, Clone, Copy)]
pub struct TcpPacket<'a> {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub tcp: TcpHeader,
    pub payload: &'a [u8],
}

/// One's-complement sum of `data` (RFC 1071), not yet folded.
fn sum16(mut acc: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

/// The internet checksum of `data`.
pub fn checksum(data: &[u8]) -> u16 {
    fold(sum16(0, data))
}

/// TCP checksum over the IPv4 pseudo-header (RFC 9293 §3.1) and `segment` (header + payload,
/// with the checksum field as it is: zero when computing, the received value when verifying).
pub fn tcp_checksum(src: Ipv4Addr, dst: Ipv4Addr, segment: &[u8]) -> u16 {
    let mut acc = sum16(0, &src.octets());
    acc = sum16(acc, &dst.octets());
    acc += u32::from(IPPROTO_TCP);
    acc += segment.len() as u32;
    fold(sum16(acc, segment))
}

/// Parse an Ethernet frame carrying IPv4/TCP. Returns the source MAC and the packet.
pub fn parse_frame(frame: &[u8]) -> Result<(Mac, TcpPacket<'_>), ParseError> {
    if frame.len() < ETH_HDR {
        return Err(ParseError::Truncated);
    }
    if u16::from_be_bytes([frame[12], frame[13]]) != ETHERTYPE_IPV4 {
        return Err(ParseError::NotTcp);
    }
    let mut mac = [0; 6];
    mac.copy_from_slice(&frame[6..12]);
    Ok((mac, parse_ipv4(&frame[ETH_HDR..])?))
}

/// Parse an IPv4 packet carrying TCP, verifying both checksums.
pub fn parse_ipv4(ip: &[u8]) -> Result<TcpPacket<'_>, ParseError> {
    if ip.len() < IPV4_HDR {
        return Err(ParseError::Truncated);
    }
    if ip[0] >> 4 != 4 {
        return Err(ParseError::NotTcp);
    }
    let ihl = usize::from(ip[0] & 0xf) * 4;
    if ihl < IPV4_HDR {
        return Err(ParseError::Malformed);
    }
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    if total < ihl || ip.len() < total {
        return Err(ParseError::Truncated);
    }
    if ip[9] != IPPROTO_TCP {
        return Err(ParseError::NotTcp);
    }
    let frag = u16::from_be_bytes([ip[6], ip[7]]);
    if frag & 0x3fff != 0 {
        return Err(ParseError::Fragment);
    }
    if checksum(&ip[..ihl]) != 0 {
        return Err(ParseError::Checksum);
    }
    let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    let seg = &ip[ihl..total];
    if tcp_checksum(src, dst, seg) != 0 {
        return Err(ParseError::Checksum);
    }
    let (tcp, payload) = parse_tcp(seg)?;
    Ok(TcpPacket { src, dst, tcp, payload })
}

/// Parse a TCP segment (header, options, payload). Unknown options are skipped.
pub fn parse_tcp(seg: &[u8]) -> Result<(TcpHeader, &[u8]), ParseError> {
    if seg.len() < TCP_HDR {
        return Err(ParseError::Truncated);
    }
    let off = usize::from(seg[12] >> 4) * 4;
    if off < TCP_HDR || off > seg.len() {
        return Err(ParseError::Malformed);
    }
    let mut h = TcpHeader {
        src_port: u16::from_be_bytes([seg[0], seg[1]]),
        dst_port: u16::from_be_bytes([seg[2], seg[3]]),
        seq: u32::from_be_bytes([seg[4], seg[5], seg[6], seg[7]]),
        ack: u32::from_be_bytes([seg[8], seg[9], seg[10], seg[11]]),
        flags: seg[13] & 0x3f,
        window: u16::from_be_bytes([seg[14], seg[15]]),
        ..TcpHeader::default()
    };
    let mut o = &seg[TCP_HDR..off];
    while let [kind, rest @ ..] = o {
        match kind {
            0 => break,
            1 => {
                o = rest;
                continue;
            }
            _ => {}
        }
        let Some(&len) = rest.first() else { return Err(ParseError::Malformed) };
        let len = usize::from(len);
        if len < 2 || len > o.len() {
            return Err(ParseError::Malformed);
        }
        let body = &o[2..len];
        match (kind, body.len()) {
            (2, 2) => h.mss = Some(u16::from_be_bytes([body[0], body[1]])),
            (3, 1) => h.wscale = Some(body[0].min(14)), // RFC 7323 §2.3: cap at 14
            (4, 0) => h.sack_permitted = true,
            (5, n) if n % 8 == 0 => {
                for b in body.chunks_exact(8).take(3) {
                    let l = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
                    let r = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
                    h.sack[h.sack_len as usize] = (l, r);
                    h.sack_len += 1;
                }
            }
            _ => {}
        }
        o = &o[len..];
    }
    Ok((h, &seg[off..]))
}

/// Write the TCP header of `h` into `out` (which must hold `h.header_len()` bytes), checksum
/// field zero.
fn emit_tcp_header(h: &TcpHeader, out: &mut [u8]) {
    let hl = h.header_len();
    out[0..2].copy_from_slice(&h.src_port.to_be_bytes());
    out[2..4].copy_from_slice(&h.dst_port.to_be_bytes());
    out[4..8].copy_from_slice(&h.seq.to_be_bytes());
    out[8..12].copy_from_slice(&h.ack.to_be_bytes());
    out[12] = ((hl / 4) as u8) << 4;
    out[13] = h.flags;
    out[14..16].copy_from_slice(&h.window.to_be_bytes());
    out[16..20].fill(0);
    let mut i = TCP_HDR;
    if let Some(mss) = h.mss {
        out[i..i + 4].copy_from_slice(&[2, 4, (mss >> 8) as u8, mss as u8]);
        i += 4;
    }
    if let Some(ws) = h.wscale {
        out[i..i + 4].copy_from_slice(&[1, 3, 3, ws]);
        i += 4;
    }
    if h.sack_permitted {
        out[i..i + 4].copy_from_slice(&[1, 1, 4, 2]);
        i += 4;
    }
    if h.sack_len > 0 {
        out[i..i + 4].copy_from_slice(&[1, 1, 5, 2 + 8 * h.sack_len]);
        i += 4;
        for &(l, r) in h.sack_blocks() {
            out[i..i + 4].copy_from_slice(&l.to_be_bytes());
            out[i + 4..i + 8].copy_from_slice(&r.to_be_bytes());
            i += 8;
        }
    }
    debug_assert_eq!(i, hl);
}

/// Addresses of one frame.
#[derive(Debug, Clone, Copy)]
pub struct FrameAddrs {
    pub src_mac: Mac,
    pub dst_mac: Mac,
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    /// IPv4 identification.
    pub ip_id: u16,
}

/// Length of the frame `emit_frame` writes.
pub fn frame_len(h: &TcpHeader, payload_len: usize) -> usize {
    ETH_HDR + IPV4_HDR + h.header_len() + payload_len
}

/// Write a whole Ethernet/IPv4/TCP frame into `out`, with both checksums; `out` must hold
/// `frame_len(h, payload.len())` bytes. Returns the frame length.
pub fn emit_frame(a: &FrameAddrs, h: &TcpHeader, payload: &[u8], out: &mut [u8]) -> usize {
    let tl = h.header_len();
    let ip_total = IPV4_HDR + tl + payload.len();
    let len = ETH_HDR + ip_total;
    out[0..6].copy_from_slice(&a.dst_mac);
    out[6..12].copy_from_slice(&a.src_mac);
    out[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    let ip = &mut out[ETH_HDR..len];
    ip[0] = 0x45;
    ip[1] = 0;
    ip[2..4].copy_from_slice(&(ip_total as u16).to_be_bytes());
    ip[4..6].copy_from_slice(&a.ip_id.to_be_bytes());
    ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes()); // DF
    ip[8] = 64;
    ip[9] = IPPROTO_TCP;
    ip[10..12].fill(0);
    ip[12..16].copy_from_slice(&a.src.octets());
    ip[16..20].copy_from_slice(&a.dst.octets());
    let c = checksum(&ip[..IPV4_HDR]);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let seg = &mut ip[IPV4_HDR..];
    emit_tcp_header(h, &mut seg[..tl]);
    seg[tl..].copy_from_slice(payload);
    let c = tcp_checksum(a.src, a.dst, seg);
    seg[16..18].copy_from_slice(&c.to_be_bytes());
    len
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_with_options() {
        let h = TcpHeader {
            src_port: 20001,
            dst_port: 40000,
            seq: 0xdead_beef,
            ack: 7,
            flags: flags::SYN | flags::ACK,
            window: 65535,
            mss: Some(1460),
            wscale: Some(7),
            sack_permitted: true,
            sack: [(1, 2), (5, 9), (0, 0)],
            sack_len: 2,
        };
        let a = FrameAddrs {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            src: Ipv4Addr::new(10, 9, 0, 1),
            dst: Ipv4Addr::new(10, 9, 0, 2),
            ip_id: 9,
        };
        let mut buf = vec![0; frame_len(&h, 5)];
        let n = emit_frame(&a, &h, b"hello", &mut buf);
        assert_eq!(n, buf.len());
        let (mac, p) = parse_frame(&buf).unwrap();
        assert_eq!(mac, a.src_mac);
        assert_eq!((p.src, p.dst), (a.src, a.dst));
        assert_eq!(p.tcp, h);
        assert_eq!(p.payload, b"hello");
        // One flipped bit anywhere in the TCP part fails the checksum.
        buf[ETH_HDR + IPV4_HDR + 30] ^= 0x10;
        assert_eq!(parse_frame(&buf).unwrap_err(), ParseError::Checksum);
    }

    #[test]
    fn checksum_of_known_header() {
        // RFC 1071-style example: a real IPv4 header whose checksum is 0xb861.
        let hdr = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(checksum(&hdr), 0xb861);
    }

    /// A segment whose checksum comes to zero: one's complement has two zeros, 0x0000 and
    /// 0xffff. RFC 1624 §3: a sender writes 0x0000 (tshark reports 0xffff as a bad
    /// checksum), while Linux writes 0xffff when it computes a TCP checksum in software
    /// (`skb_checksum_help`), so a receiver must take both.
    #[test]
    fn zero_checksum_is_sent_as_0000_and_both_zeros_are_accepted() {
        let h = TcpHeader { src_port: 7000, dst_port: 20001, seq: 77, ack: 5, flags: flags::ACK | flags::PSH, window: 501, ..TcpHeader::default() };
        let a = FrameAddrs {
            src_mac: [2, 0, 0, 0, 0, 2],
            dst_mac: [2, 0, 0, 0, 0, 1],
            src: Ipv4Addr::new(198, 51, 100, 2),
            dst: Ipv4Addr::new(198, 51, 100, 1),
            ip_id: 3,
        };
        let csum_at = ETH_HDR + IPV4_HDR + 16;
        let mut payload = *b"..zero checksum";
        let mut buf = vec![0; frame_len(&h, payload.len())];
        // The first two payload bytes pick the sum: exactly one value of them makes it zero.
        let found = (0..=u16::MAX).find(|v| {
            payload[..2].copy_from_slice(&v.to_be_bytes());
            emit_frame(&a, &h, &payload, &mut buf);
            buf[csum_at..csum_at + 2] == [0, 0]
        });
        assert!(found.is_some(), "no payload gives a zero checksum");
        let (_, p) = parse_frame(&buf).expect("0x0000 verifies");
        assert_eq!(p.payload, &payload[..]);
        // The same segment as the kernel sends it.
        buf[csum_at..csum_at + 2].copy_from_slice(&[0xff, 0xff]);
        let (_, p) = parse_frame(&buf).expect("0xffff (negative zero) verifies");
        assert_eq!(p.payload, &payload[..]);
        // Negative zero is not a wildcard: the bytes must still sum to zero.
        buf[csum_at + 10] ^= 1;
        assert_eq!(parse_frame(&buf).unwrap_err(), ParseError::Checksum);
    }

    /// No segment is ever sent with 0xffff: `fold` complements a sum that cannot be zero
    /// (the pseudo-header's protocol field alone is 6), so the field is at most 0xfffe.
    #[test]
    fn emitted_checksums_are_never_negative_zero() {
        let h = TcpHeader { src_port: 1, dst_port: 2, flags: flags::ACK, ..TcpHeader::default() };
        let a = FrameAddrs { src_mac: [0; 6], dst_mac: [0; 6], src: Ipv4Addr::UNSPECIFIED, dst: Ipv4Addr::UNSPECIFIED, ip_id: 0 };
        let csum_at = ETH_HDR + IPV4_HDR + 16;
        let mut buf = vec![0; frame_len(&h, 2)];
        let mut zeros = 0;
        for v in 0..=u16::MAX {
            emit_frame(&a, &h, &v.to_be_bytes(), &mut buf);
            let c = u16::from_be_bytes([buf[csum_at], buf[csum_at + 1]]);
            assert_ne!(c, 0xffff, "payload {v:#06x} sent with checksum 0xffff");
            zeros += usize::from(c == 0);
        }
        assert!(zeros > 0, "some payload value sums to zero (and is sent as 0x0000)");
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(parse_frame(&[0; 10]).unwrap_err(), ParseError::Truncated);
        let mut f = [0u8; 60];
        f[12] = 0x08;
        assert!(parse_frame(&f).is_err());
        // a bad option length
        let mut seg = [0u8; 24];
        seg[12] = 6 << 4;
        seg[20] = 2;
        seg[21] = 9;
        assert_eq!(parse_tcp(&seg).unwrap_err(), ParseError::Malformed);
    }
}
