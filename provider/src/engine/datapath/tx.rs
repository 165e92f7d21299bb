//! Transmit: transmit units of the protocol core gathered into `sendmsg` calls, payload sent
//! straight from registered memory (zero copy), send completions held until their last byte
//! has been handed to TCP.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::AsRawFd;

use uiw_wire::conn::Tx;
use uiw_wire::placement::Source;

use super::super::user_memory::IoPart;
use super::{run_at, DataPath, Env, Fatal, Link, SendEntry, TX_BYTES, TX_PIECES};
use crate::engine::wr::Payload;

/// One piece of the transmit backlog.
#[derive(Debug)]
pub(super) enum Piece {
    Own(Vec<u8>),
    Small([u8; 32], u8),
    User(u64, u32),
}

impl Piece {
    pub(super) fn small(b: &[u8]) -> Piece {
        let mut a = [0u8; 32];
        a[..b.len()].copy_from_slice(b);
        Piece::Small(a, b.len() as u8)
    }

    pub(super) fn len(&self) -> usize {
        match self {
            Piece::Own(v) => v.len(),
            Piece::Small(_, n) => *n as usize,
            Piece::User(_, n) => *n as usize,
        }
    }

    pub(super) fn part(&self, skip: usize) -> IoPart<'_> {
        match self {
            Piece::Own(v) => IoPart::Bytes(&v[skip..]),
            Piece::Small(a, n) => IoPart::Bytes(&a[skip..*n as usize]),
            Piece::User(addr, n) => IoPart::User { addr: addr + skip as u64, len: *n as usize - skip },
        }
    }
}
impl DataPath {
    /// Moves transmit units from the protocol core to the socket until it would block.
    pub fn pump_tx(&mut self, env: &Env) -> Option<Fatal> {
        loop {
            // Fill the backlog.
            loop {
                let l = self.link.as_mut()?;
                if l.tx.len() >= TX_PIECES || l.backlog() >= TX_BYTES {
                    break;
                }
                let Some(tx) = l.conn.next_tx() else { break };
                match tx {
                    Tx::Bytes(b) => l.push(Piece::Own(b)),
                    Tx::Segment(s) => {
                        let n = s.payload_len as usize;
                        if l.conn.crc() {
                            let mut buf = vec![0u8; n];
                            gather(&self.sq, env, s.source, &mut buf);
                            let t = s.trailer(&[&buf]);
                            l.push(Piece::small(s.header.as_slice()));
                            l.push(Piece::Own(buf));
                            l.push(Piece::small(t.as_slice()));
                        } else {
                            l.push(Piece::small(s.header.as_slice()));
                            let mut pieces = Vec::new();
                            source_pieces(&self.sq, env, s.source, n, &mut pieces);
                            for p in pieces {
                                l.push(p);
                            }
                            l.push(Piece::small(s.trailer_no_crc().as_slice()));
                        }
                    }
                }
                if let Some(f) = self.drain_events(env) {
                    return Some(f);
                }
            }
            let l = self.link.as_mut()?;
            if l.tx.is_empty() {
                release_held(l, env);
                return None;
            }
            let parts: Vec<IoPart<'_>> =
                l.tx.iter().take(64).enumerate().map(|(i, p)| p.part(if i == 0 { l.tx_skip } else { 0 })).collect();
            match env.user_mem.send(l.sock.as_raw_fd(), &parts) {
                Ok(mut n) => {
                    drop(parts);
                    l.tx_sent += n as u64;
                    while n > 0 {
                        let left = l.tx.front().map(|p| p.len() - l.tx_skip).unwrap_or(0);
                        if n >= left {
                            n -= left;
                            l.tx.pop_front();
                            l.tx_skip = 0;
                        } else {
                            l.tx_skip += n;
                            n = 0;
                        }
                    }
                    release_held(l, env);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    drop(parts);
                    l.conn.handle_eof();
                    return self.drain_events(env).or(Some(Fatal::Lost));
                }
            }
        }
    }
}

pub(super) fn release_held(l: &mut Link, env: &Env) {
    while let Some(&(mark, c)) = l.held.front() {
        if mark > l.tx_sent {
            break;
        }
        l.held.pop_front();
        env.send_cq.push(c);
    }
}

/// The pieces of `len` payload bytes at `src`.
fn source_pieces(sq: &BTreeMap<u64, SendEntry>, env: &Env, src: Source, len: usize, out: &mut Vec<Piece>) {
    match src {
        Source::Wr { wr_id, offset } => {
            let Some(e) = sq.get(&wr_id) else {
                out.push(Piece::Own(vec![0; len]));
                return;
            };
            match &e.wqe.payload {
                Payload::Inline(b) => {
                    let o = offset as usize;
                    out.push(Piece::Own(b[o.min(b.len())..(o + len).min(b.len())].to_vec()));
                }
                Payload::Sges(_) => {
                    let mut off = u64::from(offset);
                    let mut left = len as u64;
                    while left > 0 {
                        let Some((addr, avail)) = run_at(&e.runs, off) else {
                            out.push(Piece::Own(vec![0; left as usize]));
                            return;
                        };
                        let k = avail.min(left);
                        out.push(Piece::User(addr, k as u32));
                        off += k;
                        left -= k;
                    }
                }
            }
        }
        Source::Tagged { stag, to } => match env.mrs.lookup(stag) {
            Some(mr) if to >= mr.iova && to - mr.iova + len as u64 <= mr.length => {
                out.push(Piece::User(mr.addr + (to - mr.iova), len as u32))
            }
            _ => out.push(Piece::Own(vec![0; len])),
        },
        Source::None => {}
    }
}

/// With CRC: the payload copied into `buf` (the CRC must see the bytes).
fn gather(sq: &BTreeMap<u64, SendEntry>, env: &Env, src: Source, buf: &mut [u8]) {
    let mut pieces = Vec::new();
    source_pieces(sq, env, src, buf.len(), &mut pieces);
    let mut at = 0usize;
    for p in pieces {
        let k = p.len();
        match p {
            Piece::User(a, n) => {
                env.user_mem.read(a, &mut buf[at..at + n as usize]);
            }
            Piece::Own(v) => buf[at..at + k].copy_from_slice(&v),
            Piece::Small(s, n) => buf[at..at + n as usize].copy_from_slice(&s[..n as usize]),
        }
        at += k;
    }
}
