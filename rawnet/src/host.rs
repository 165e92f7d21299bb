//! A userspace TCP stack driven over a [`FrameIo`]: receive a batch, run timers, transmit
//! everything due. One `poll` is one turn of the loop; `wait` blocks in `poll(2)` until a
//! frame arrives or the stack's next deadline.

use std::io;
use std::time::{Duration, Instant};

use uiw_utcp::{Stack, StackConfig};

use crate::FrameIo;

/// Counters of one host.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub rx_frames: u64,
    pub rx_dropped: u64,
    pub tx_frames: u64,
    /// Frames the driver had no room for (the TCP retransmits them).
    pub tx_full: u64,
}

/// The stack and its driver.
pub struct Host<Io: FrameIo> {
    pub stack: Stack,
    pub io: Io,
    buf: Vec<u8>,
    /// A frame in `buf` the driver had no room for: sent before anything new.
    pending: Option<usize>,
    pub stats: Stats,
}

impl<Io: FrameIo> Host<Io> {
    pub fn new(cfg: StackConfig, io: Io) -> Self {
        let stack = Stack::new(cfg);
        let buf = vec![0; stack.max_frame()];
        Host { stack, io, buf, pending: None, stats: Stats::default() }
    }

    /// One turn: up to `budget` received frames in, timers, every due frame out. Returns
    /// whether anything moved.
    pub fn poll(&mut self, budget: usize) -> io::Result<bool> {
        let now = Instant::now();
        let stack = &mut self.stack;
        let stats = &mut self.stats;
        let n = self.io.recv(budget, &mut |f| {
            stats.rx_frames += 1;
            if stack.on_frame(f, now).is_err() {
                stats.rx_dropped += 1;
            }
        })?;
        self.stack.on_timeout(now);
        let mut sent = 0;
        loop {
            // A frame the stack produced is never dropped for lack of room: it waits in
            // `buf` (and the stack is not asked for more) until the driver takes it.
            let len = match self.pending.take() {
                Some(len) => len,
                None => match self.stack.poll_transmit(now, &mut self.buf) {
                    Some(len) => len,
                    None => break,
                },
            };
            if self.io.send(&self.buf[..len])? {
                sent += 1;
            } else {
                self.stats.tx_full += 1;
                self.io.flush()?;
                if !self.io.send(&self.buf[..len])? {
                    self.pending = Some(len);
                    break;
                }
                sent += 1;
            }
        }
        self.stats.tx_frames += sent;
        if sent > 0 || self.io.tx_waiting() {
            self.io.flush()?;
        }
        Ok(n > 0 || sent > 0)
    }

    /// Whether a frame waits for room in the driver (the next `poll` sends it first), or
    /// for a kick the driver could not make.
    pub fn backlogged(&self) -> bool {
        self.pending.is_some() || self.io.tx_waiting()
    }

    /// Block until a frame may have arrived, the stack's next deadline, or `max`.
    pub fn wait(&mut self, max: Duration) -> io::Result<()> {
        let now = Instant::now();
        let mut t = max;
        if let Some(d) = self.stack.poll_timeout() {
            t = t.min(d.saturating_duration_since(now));
        }
        uiw_kabi::raw::poll_readable(self.io.fd(), t).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, SocketAddrV4};
    use uiw_utcp::packet::parse_frame;
    use uiw_utcp::Config;

    /// A driver that takes at most `room` frames between two flushes, and frees room only
    /// on every other flush (as when the kernel is still busy with the last batch).
    struct Tight {
        room: usize,
        left: usize,
        flushes: usize,
        sent: Vec<Vec<u8>>,
        rx: Vec<Vec<u8>>,
    }

    impl FrameIo for Tight {
        fn recv(&mut self, budget: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
            let n = self.rx.len().min(budget);
            for fr in self.rx.drain(..n) {
                f(&fr);
            }
            Ok(n)
        }
        fn send(&mut self, frame: &[u8]) -> io::Result<bool> {
            if self.left == 0 {
                return Ok(false);
            }
            self.left -= 1;
            self.sent.push(frame.to_vec());
            Ok(true)
        }
        fn flush(&mut self) -> io::Result<()> {
            self.flushes += 1;
            if self.flushes % 2 == 0 {
                self.left = self.room;
            }
            Ok(())
        }
        fn fd(&self) -> std::os::fd::RawFd {
            -1
        }
        fn kind(&self) -> &'static str {
            "test"
        }
    }

    /// A driver short of room never loses a frame: data segments leave in sequence, with no
    /// gap a retransmission would have to fill.
    #[test]
    fn full_driver_loses_no_frame() {
        let (a_ip, b_ip) = (Ipv4Addr::new(10, 1, 0, 1), Ipv4Addr::new(10, 1, 0, 2));
        let cfg = |ip, mac| StackConfig { mac, ip, mtu: 1500, tcp: Config::default(), seed: 5 };
        let io = Tight { room: 3, left: 3, flushes: 0, sent: Vec::new(), rx: Vec::new() };
        let mut a = Host::new(cfg(a_ip, [2, 0, 0, 0, 0, 1]), io);
        let mut b = Stack::new(cfg(b_ip, [2, 0, 0, 0, 0, 2]));
        a.stack.set_neighbour(b_ip, [2, 0, 0, 0, 0, 2]);
        b.listen(20000);
        let h = a.stack.connect(20001, SocketAddrV4::new(b_ip, 20000));
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let mut queued = false;
        let mut got = Vec::new();
        let mut next_seq: Option<u32> = None;
        let mut buf = vec![0u8; 2000];
        for _ in 0..100_000 {
            a.poll(64).unwrap();
            for f in a.io.sent.drain(..) {
                let (_, p) = parse_frame(&f).unwrap();
                if !p.payload.is_empty() {
                    if let Some(s) = next_seq {
                        assert_eq!(p.tcp.seq, s, "a gap: a frame was lost");
                    }
                    next_seq = Some(p.tcp.seq.wrapping_add(p.payload.len() as u32));
                }
                b.on_frame(&f, Instant::now()).unwrap();
            }
            while let Some(n) = b.poll_transmit(Instant::now(), &mut buf) {
                a.io.rx.push(buf[..n].to_vec());
            }
            if let Some(hb) = b.accept() {
                let _ = hb;
            }
            if !queued && a.stack.tcb(h).unwrap().state() == uiw_utcp::State::Established {
                assert_eq!(a.stack.tcb(h).unwrap().send(&data), Ok(data.len()));
                queued = true;
            }
            for hb in b.handles() {
                let t = b.tcb(hb).unwrap();
                let mut r = vec![0u8; 65536];
                let n = t.recv(&mut r);
                got.extend_from_slice(&r[..n]);
            }
            if got.len() == data.len() {
                break;
            }
        }
        assert!(got == data);
        assert!(a.stats.tx_full > 0, "the driver was short of room");
    }
}
