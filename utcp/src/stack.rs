//! A host's worth of TCP on one IPv4 address: demultiplexing frames to connections, LISTEN,
//! RSTs for segments nobody owns (RFC 9293 §3.10.7.1), and Ethernet framing. Sans IO: frames
//! and time in, frames and events out; the driver owns the socket.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Instant;

use crate::packet::{self, flags, FrameAddrs, Mac, ParseError, TcpHeader};
use crate::tcb::{Config, State, Tcb};

/// Connections in SYN-RECEIVED a stack holds at most (SYN flood bound).
pub const MAX_HALF_OPEN: usize = 256;

/// A connection's index in the stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handle(pub usize);

/// Stack-wide settings.
#[derive(Debug, Clone)]
pub struct StackConfig {
    pub mac: Mac,
    pub ip: Ipv4Addr,
    /// Link MTU (IP packet size); the MSS announced is `mtu - 40`.
    pub mtu: usize,
    pub tcp: Config,
    /// Seed for initial sequence numbers (RFC 6528 wants them unpredictable: the driver
    /// seeds from the OS's random source).
    pub seed: u64,
}

/// Why a frame was not delivered (counted by the driver, never fatal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drop {
    Parse(ParseError),
    /// Not addressed to this stack's IPv4 address.
    NotOurs,
}

#[derive(Debug)]
struct Conn {
    remote: Ipv4Addr,
    tcb: Tcb,
    /// Created by LISTEN and not yet handed out by `accept`.
    passive_unaccepted: bool,
}

/// The stack.
#[derive(Debug)]
pub struct Stack {
    cfg: StackConfig,
    conns: Vec<Option<Conn>>,
    by_tuple: HashMap<(Ipv4Addr, u16, u16), usize>,
    listeners: HashSet<u16>,
    accept_q: VecDeque<Handle>,
    neigh: HashMap<Ipv4Addr, Mac>,
    /// RSTs to send for segments no connection owns: (remote ip, remote mac, header).
    rsts: VecDeque<(Ipv4Addr, Mac, TcpHeader)>,
    ip_id: u16,
    rng: u64,
    scratch: Vec<u8>,
    /// Round-robin start for `poll_transmit`.
    next: usize,
}

impl Stack {
    pub fn new(mut cfg: StackConfig) -> Self {
        cfg.tcp.mss = (cfg.mtu.saturating_sub(40)).clamp(536, 0xffff) as u16;
        let rng = cfg.seed | 1;
        Stack {
            cfg,
            conns: Vec::new(),
            by_tuple: HashMap::new(),
            listeners: HashSet::new(),
            accept_q: VecDeque::new(),
            neigh: HashMap::new(),
            rsts: VecDeque::new(),
            ip_id: 0,
            rng,
            scratch: Vec::new(),
            next: 0,
        }
    }

    pub fn ip(&self) -> Ipv4Addr {
        self.cfg.ip
    }

    pub fn mac(&self) -> Mac {
        self.cfg.mac
    }

    /// The largest frame `poll_transmit` writes.
    pub fn max_frame(&self) -> usize {
        packet::ETH_HDR + self.cfg.mtu
    }

    fn iss(&mut self) -> u32 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
    }

    /// Learn (or set) the MAC address of a neighbour.
    pub fn set_neighbour(&mut self, ip: Ipv4Addr, mac: Mac) {
        self.neigh.insert(ip, mac);
    }

    pub fn neighbour(&self, ip: Ipv4Addr) -> Option<Mac> {
        self.neigh.get(&ip).copied()
    }

    /// Accept connections to `port` (RFC 9293 LISTEN).
    pub fn listen(&mut self, port: u16) {
        self.listeners.insert(port);
    }

    pub fn unlisten(&mut self, port: u16) {
        self.listeners.remove(&port);
    }

    /// A connection that completed its handshake on a listening port.
    pub fn accept(&mut self) -> Option<Handle> {
        while let Some(h) = self.accept_q.pop_front() {
            if let Some(Some(c)) = self.conns.get_mut(h.0) {
                c.passive_unaccepted = false;
                return Some(h);
            }
        }
        None
    }

    /// Whether a connection may be waiting for [`Stack::accept`] (a readiness hint: the
    /// queue may still hold connections removed since).
    pub fn acceptable(&self) -> bool {
        !self.accept_q.is_empty()
    }

    /// [`Stack::accept`] for one listening port: the oldest connection made to `port`, the
    /// others left queued (a host may listen on several ports, each with its own owner — the
    /// provider's QP port and the rdma_cm listeners).
    pub fn accept_on(&mut self, port: u16) -> Option<Handle> {
        let k = self.accept_q.iter().position(|h| self.conn_port(*h) == Some(port))?;
        let h = self.accept_q.remove(k)?;
        if let Some(Some(c)) = self.conns.get_mut(h.0) {
            c.passive_unaccepted = false;
        }
        Some(h)
    }

    /// Whether a connection to `port` waits for [`Stack::accept_on`].
    pub fn acceptable_on(&self, port: u16) -> bool {
        self.accept_q.iter().any(|h| self.conn_port(*h) == Some(port))
    }

    fn conn_port(&self, h: Handle) -> Option<u16> {
        self.conns.get(h.0)?.as_ref().map(|c| c.tcb.local_port())
    }

    /// The local port of a connection.
    pub fn local_port(&self, h: Handle) -> Option<u16> {
        self.conn_port(h)
    }

    /// Open a connection from `local_port` to `remote`. The remote's MAC must be known
    /// (`set_neighbour`) before anything is sent.
    pub fn connect(&mut self, local_port: u16, remote: SocketAddrV4) -> Handle {
        let iss = self.iss();
        let tcb = Tcb::connect(self.cfg.tcp.clone(), local_port, remote.port(), iss);
        Handle(self.insert(*remote.ip(), tcb))
    }

    fn insert(&mut self, remote: Ipv4Addr, tcb: Tcb) -> usize {
        let key = (remote, tcb.remote_port(), tcb.local_port());
        let idx = match self.conns.iter().position(Option::is_none) {
            Some(i) => {
                self.conns[i] = Some(Conn { remote, tcb, passive_unaccepted: false });
                i
            }
            None => {
                self.conns.push(Some(Conn { remote, tcb, passive_unaccepted: false }));
                self.conns.len() - 1
            }
        };
        self.by_tuple.insert(key, idx);
        idx
    }

    /// The connection behind a handle (None once removed).
    pub fn tcb(&mut self, h: Handle) -> Option<&mut Tcb> {
        self.conns.get_mut(h.0)?.as_mut().map(|c| &mut c.tcb)
    }

    /// The remote address of a connection.
    pub fn remote(&self, h: Handle) -> Option<SocketAddrV4> {
        let c = self.conns.get(h.0)?.as_ref()?;
        Some(SocketAddrV4::new(c.remote, c.tcb.remote_port()))
    }

    /// Forget a CLOSED connection (its 4-tuple may be reused).
    pub fn remove(&mut self, h: Handle) {
        if let Some(Some(c)) = self.conns.get(h.0) {
            let key = (c.remote, c.tcb.remote_port(), c.tcb.local_port());
            self.by_tuple.remove(&key);
            self.conns[h.0] = None;
            self.accept_q.retain(|&x| x != h);
        }
    }

    /// Handles of every live connection.
    pub fn handles(&self) -> Vec<Handle> {
        (0..self.conns.len()).filter(|&i| self.conns[i].is_some()).map(Handle).collect()
    }

    /// Take one received Ethernet frame.
    pub fn on_frame(&mut self, frame: &[u8], now: Instant) -> Result<Option<Handle>, Drop> {
        let (src_mac, p) = packet::parse_frame(frame).map_err(Drop::Parse)?;
        if p.dst != self.cfg.ip {
            return Err(Drop::NotOurs);
        }
        let h = p.tcp;
        self.neigh.entry(p.src).or_insert(src_mac);
        let key = (p.src, h.src_port, h.dst_port);
        if let Some(&i) = self.by_tuple.get(&key) {
            if let Some(c) = self.conns[i].as_mut() {
                let was = c.tcb.state();
                c.tcb.on_segment(&h, p.payload, now);
                if was == State::SynReceived
                    && matches!(c.tcb.state(), State::Established | State::CloseWait | State::FinWait1)
                {
                    self.accept_q.push_back(Handle(i));
                }
                return Ok(Some(Handle(i)));
            }
        }
        if h.has(flags::SYN) && !h.has(flags::ACK) && !h.has(flags::RST) && self.listeners.contains(&h.dst_port) {
            // A SYN flood must not grow the table without bound: beyond MAX_HALF_OPEN
            // connections in SYN-RECEIVED, new SYNs are dropped (the peer retries).
            let half_open = self.conns.iter().flatten().filter(|c| c.tcb.state() == State::SynReceived).count();
            if half_open >= MAX_HALF_OPEN {
                return Ok(None);
            }
            let iss = self.iss();
            let tcb = Tcb::accept(self.cfg.tcp.clone(), &h, iss);
            self.neigh.insert(p.src, src_mac);
            let i = self.insert(p.src, tcb);
            if let Some(c) = self.conns[i].as_mut() {
                c.passive_unaccepted = true;
            }
            return Ok(Some(Handle(i)));
        }
        // Nobody's: RST (RFC 9293 §3.10.7.1), never in answer to a RST.
        if !h.has(flags::RST) {
            let len = p.payload.len() as u32 + u32::from(h.has(flags::SYN)) + u32::from(h.has(flags::FIN));
            let rst = if h.has(flags::ACK) {
                TcpHeader { src_port: h.dst_port, dst_port: h.src_port, seq: h.ack, flags: flags::RST, ..Default::default() }
            } else {
                TcpHeader {
                    src_port: h.dst_port,
                    dst_port: h.src_port,
                    seq: 0,
                    ack: h.seq.wrapping_add(len),
                    flags: flags::RST | flags::ACK,
                    ..Default::default()
                }
            };
            if self.rsts.len() < 64 {
                self.rsts.push_back((p.src, src_mac, rst));
            }
        }
        Ok(None)
    }

    /// Write the next frame to send into `out` (at least `max_frame()` bytes); returns its
    /// length. Call until None after every batch of input and every timeout.
    pub fn poll_transmit(&mut self, now: Instant, out: &mut [u8]) -> Option<usize> {
        if let Some((ip, mac, h)) = self.rsts.pop_front() {
            return Some(self.emit(ip, mac, &h, &[], out));
        }
        let n = self.conns.len();
        for k in 0..n {
            let i = (self.next + k) % n;
            let Some(c) = self.conns[i].as_mut() else { continue };
            let Some(&mac) = self.neigh.get(&c.remote) else { continue };
            let remote = c.remote;
            let mut payload = std::mem::take(&mut self.scratch);
            let seg = c.tcb.poll_transmit(now, &mut payload);
            let r = seg.map(|h| self.emit(remote, mac, &h, &payload, out));
            self.scratch = payload;
            if r.is_some() {
                // One segment per connection in turn: a bulk flow does not starve the others.
                self.next = (i + 1) % n;
                return r;
            }
        }
        None
    }

    fn emit(&mut self, dst: Ipv4Addr, dst_mac: Mac, h: &TcpHeader, payload: &[u8], out: &mut [u8]) -> usize {
        self.ip_id = self.ip_id.wrapping_add(1);
        let a = FrameAddrs { src_mac: self.cfg.mac, dst_mac, src: self.cfg.ip, dst, ip_id: self.ip_id };
        packet::emit_frame(&a, h, payload, out)
    }

    /// The earliest deadline of any connection.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.conns.iter().flatten().filter_map(|c| c.tcb.poll_timeout()).min()
    }

    /// Drive every connection's timers. A passive connection that closed before it was
    /// accepted (reset, or its handshake timed out) is forgotten here: nobody holds its
    /// handle.
    pub fn on_timeout(&mut self, now: Instant) {
        let mut gone = Vec::new();
        for (i, c) in self.conns.iter_mut().enumerate() {
            let Some(c) = c else { continue };
            if matches!(c.tcb.poll_timeout(), Some(t) if t <= now) {
                c.tcb.on_timeout(now);
            }
            if c.passive_unaccepted && c.tcb.state() == State::Closed {
                gone.push(Handle(i));
            }
        }
        for h in gone {
            self.remove(h);
        }
    }
}
