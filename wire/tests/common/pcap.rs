//! Test helper: classic libpcap reader, Ethernet/IPv4/TCP parsing and
//! per-direction TCP stream reassembly. Only what the capture tests need.
#![allow(dead_code)]

use std::collections::HashMap;

#[derive(Clone, Debug)]
pub struct Packet {
    /// 1-based frame number, as tshark counts.
    pub frame: usize,
    pub data: Vec<u8>,
}

/// Read a classic pcap file (either byte order, µs or ns timestamps).
pub fn read_pcap(bytes: &[u8]) -> (u32, Vec<Packet>) {
    assert!(bytes.len() >= 24, "short pcap");
    let magic = u32::from_le_bytes(bytes[0..4].try_into().unwrap());
    let le = match magic {
        0xa1b2c3d4 | 0xa1b23c4d => true,
        0xd4c3b2a1 | 0x4d3cb2a1 => false,
        _ => panic!("not a classic pcap file: magic {magic:#x}"),
    };
    let rd32 = |b: &[u8]| {
        let a: [u8; 4] = b.try_into().unwrap();
        if le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    let linktype = rd32(&bytes[20..24]);
    let mut off = 24;
    let mut out = Vec::new();
    while off + 16 <= bytes.len() {
        let incl = rd32(&bytes[off + 8..off + 12]) as usize;
        let orig = rd32(&bytes[off + 12..off + 16]) as usize;
        assert_eq!(incl, orig, "truncated packet in capture (snaplen)");
        off += 16;
        out.push(Packet {
            frame: out.len() + 1,
            data: bytes[off..off + incl].to_vec(),
        });
        off += incl;
    }
    (linktype, out)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    pub ip: [u8; 4],
    pub port: u16,
}

#[derive(Clone, Debug)]
pub struct TcpSeg {
    /// MSS option of a SYN, minus 12 if timestamps are on (effective MSS).
    pub mss: Option<u16>,
    pub frame: usize,
    pub src: Endpoint,
    pub dst: Endpoint,
    pub seq: u32,
    pub syn: bool,
    pub fin: bool,
    pub payload: Vec<u8>,
}

/// Parse Ethernet (link type 1), Linux cooked (113) or raw IP (101/228).
pub fn tcp_of(linktype: u32, p: &Packet) -> Option<TcpSeg> {
    let d = &p.data;
    let ip = match linktype {
        1 => {
            if d.len() < 14 || u16::from_be_bytes([d[12], d[13]]) != 0x0800 {
                return None;
            }
            &d[14..]
        }
        113 => {
            if d.len() < 16 || u16::from_be_bytes([d[14], d[15]]) != 0x0800 {
                return None;
            }
            &d[16..]
        }
        101 | 228 => &d[..],
        _ => panic!("unsupported link type {linktype}"),
    };
    if ip.len() < 20 || ip[0] >> 4 != 4 || ip[9] != 6 {
        return None;
    }
    let ihl = (ip[0] & 0x0f) as usize * 4;
    let tot = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    let ip = &ip[..tot.min(ip.len())];
    let tcp = &ip[ihl..];
    let doff = (tcp[12] >> 4) as usize * 4;
    let flags = tcp[13];
    let (mut mss, mut ts) = (None, false);
    let mut o = 20;
    while o < doff {
        match tcp[o] {
            0 => break,
            1 => o += 1,
            k => {
                let l = tcp[o + 1] as usize;
                if k == 2 {
                    mss = Some(u16::from_be_bytes([tcp[o + 2], tcp[o + 3]]));
                }
                if k == 8 {
                    ts = true;
                }
                o += l.max(2);
            }
        }
    }
    Some(TcpSeg {
        mss: mss.map(|m| if ts { m - 12 } else { m }),
        frame: p.frame,
        src: Endpoint {
            ip: ip[12..16].try_into().unwrap(),
            port: u16::from_be_bytes([tcp[0], tcp[1]]),
        },
        dst: Endpoint {
            ip: ip[16..20].try_into().unwrap(),
            port: u16::from_be_bytes([tcp[2], tcp[3]]),
        },
        seq: u32::from_be_bytes(tcp[4..8].try_into().unwrap()),
        syn: flags & 0x02 != 0,
        fin: flags & 0x01 != 0,
        payload: tcp[doff..].to_vec(),
    })
}

/// A contiguous run of stream bytes.
#[derive(Clone, Debug, Default)]
pub struct Chunk {
    /// Stream offset of `data[0]`.
    pub start: usize,
    pub data: Vec<u8>,
    /// (end offset within `data`, frame) for every segment that extended it.
    pub ends: Vec<(usize, usize)>,
    /// Bytes beyond this chunk were lost in the capture.
    pub gap_after: bool,
}

impl Chunk {
    /// Frame in which chunk byte `end` (exclusive) arrived.
    pub fn frame_of_end(&self, end: usize) -> usize {
        self.ends
            .iter()
            .find(|(e, _)| *e >= end)
            .map(|x| x.1)
            .unwrap_or(0)
    }
}

/// One direction of a TCP connection, reassembled by sequence number into
/// contiguous chunks (a new chunk starts after bytes the capture lost).
#[derive(Clone, Debug, Default)]
pub struct Stream {
    pub src: Option<Endpoint>,
    pub dst: Option<Endpoint>,
    pub isn: Option<u32>,
    pub chunks: Vec<Chunk>,
    pub syn_frame: usize,
    /// Effective MSS this side announced in its SYN.
    pub mss: Option<u16>,
}

impl Stream {
    /// The first chunk (starts at stream offset 0).
    pub fn first(&self) -> Option<&Chunk> {
        self.chunks.first().filter(|c| c.start == 0)
    }
}

/// A TCP connection: the direction that sent the SYN is `a` (initiator).
#[derive(Clone, Debug, Default)]
pub struct Conn {
    pub a: Stream,
    pub b: Stream,
}

pub fn reassemble(linktype: u32, pkts: &[Packet]) -> Vec<Conn> {
    let mut conns: Vec<Conn> = Vec::new();
    let mut index: HashMap<(Endpoint, Endpoint), (usize, bool)> = HashMap::new();
    for p in pkts {
        let Some(s) = tcp_of(linktype, p) else {
            continue;
        };
        let key = (s.src, s.dst);
        let (ci, is_a) = match index.get(&key) {
            Some(v) => *v,
            None => {
                if !(s.syn) {
                    continue; // connection started before the capture
                }
                // SYN without ACK opens a connection; SYN/ACK answers it.
                if let Some(&(ci, _)) = index.get(&(s.dst, s.src)) {
                    index.insert(key, (ci, false));
                    (ci, false)
                } else {
                    conns.push(Conn::default());
                    let ci = conns.len() - 1;
                    index.insert(key, (ci, true));
                    (ci, true)
                }
            }
        };
        let st = if is_a {
            &mut conns[ci].a
        } else {
            &mut conns[ci].b
        };
        if s.syn {
            st.isn = Some(s.seq.wrapping_add(1));
            st.src = Some(s.src);
            st.dst = Some(s.dst);
            st.syn_frame = s.frame;
            st.mss = s.mss;
            continue;
        }
        let Some(isn) = st.isn else { continue };
        if s.payload.is_empty() {
            continue;
        }
        let off = s.seq.wrapping_sub(isn) as usize;
        let end = off + s.payload.len();
        let cur_end = st
            .chunks
            .last()
            .map(|c| c.start + c.data.len())
            .unwrap_or(0);
        if st.chunks.is_empty() && off == 0 || off > cur_end {
            if let Some(c) = st.chunks.last_mut() {
                c.gap_after = true;
            } else if off > 0 {
                st.chunks.push(Chunk {
                    start: 0,
                    gap_after: true,
                    ..Default::default()
                });
            }
            st.chunks.push(Chunk {
                start: off,
                ..Default::default()
            });
        }
        let c = st.chunks.last_mut().unwrap();
        if end > c.start + c.data.len() && off >= c.start {
            let skip = c.start + c.data.len() - off;
            c.data.extend_from_slice(&s.payload[skip..]);
            c.ends.push((end - c.start, s.frame));
        }
    }
    conns
}
