//! Two stacks joined by a simulated Ethernet link with a virtual clock: handshakes, bulk
//! transfer checked byte for byte under loss, reordering and duplication, flow control,
//! FIN/RST. Everything is deterministic (seeded PRNG, virtual time).

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use uiw_utcp::packet::{self, flags};
use uiw_utcp::{Config, Event, Handle, Stack, StackConfig, State};

const A_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const B_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
const A_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const B_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// true with probability p percent (in hundredths of a percent).
    fn chance(&mut self, per10k: u64) -> bool {
        self.next() % 10_000 < per10k
    }
}

#[derive(Clone, Copy, Default)]
struct Impair {
    loss: u64,    // per 10 000
    dup: u64,     // per 10 000
    reorder: u64, // per 10 000: delayed by a few extra link times
}

struct Net {
    t0: Instant,
    now: Instant,
    a: Stack,
    b: Stack,
    /// (deliver at, to b?, frame)
    wire: Vec<(Instant, bool, Vec<u8>)>,
    rng: Rng,
    imp: Impair,
    delay: Duration,
    mtu: usize,
    frames: usize,
    dropped: usize,
    /// Every frame that crossed, for checks (to_b, frame).
    log: Vec<(bool, Vec<u8>)>,
    keep_log: bool,
    /// Rewrites each frame B sends as it leaves (a receiver that behaves otherwise).
    edit_to_a: Option<Box<dyn FnMut(&mut [u8])>>,
}

fn stack(mac: [u8; 6], ip: Ipv4Addr, mtu: usize, tcp: Config, seed: u64) -> Stack {
    Stack::new(StackConfig { mac, ip, mtu, tcp, seed })
}

impl Net {
    fn new(mtu: usize, tcp: Config, imp: Impair, seed: u64) -> Net {
        let t0 = Instant::now();
        let mut a = stack(A_MAC, A_IP, mtu, tcp.clone(), seed);
        let mut b = stack(B_MAC, B_IP, mtu, tcp, seed.wrapping_mul(7) + 1);
        a.set_neighbour(B_IP, B_MAC);
        b.set_neighbour(A_IP, A_MAC);
        Net {
            t0,
            now: t0,
            a,
            b,
            wire: Vec::new(),
            rng: Rng(seed | 1),
            imp,
            delay: Duration::from_micros(50),
            mtu,
            frames: 0,
            dropped: 0,
            log: Vec::new(),
            keep_log: false,
            edit_to_a: None,
        }
    }

    /// Move every frame both stacks want to send onto the wire.
    fn flush(&mut self) {
        let mut buf = vec![0u8; 10_000];
        for to_b in [true, false] {
            loop {
                let s = if to_b { &mut self.a } else { &mut self.b };
                let Some(n) = s.poll_transmit(self.now, &mut buf) else { break };
                let mut f = buf[..n].to_vec();
                assert!(n <= packet::ETH_HDR + self.mtu, "a {n}-byte frame exceeds the MTU {}", self.mtu);
                if let (false, Some(edit)) = (to_b, self.edit_to_a.as_mut()) {
                    edit(&mut f);
                }
                self.frames += 1;
                if self.keep_log {
                    self.log.push((to_b, f.clone()));
                }
                if self.rng.chance(self.imp.loss) {
                    self.dropped += 1;
                    continue;
                }
                let mut at = self.now + self.delay;
                if self.rng.chance(self.imp.reorder) {
                    at += self.delay * (2 + (self.rng.next() % 6) as u32);
                }
                if self.rng.chance(self.imp.dup) {
                    self.wire.push((at + self.delay, to_b, f.clone()));
                }
                self.wire.push((at, to_b, f));
            }
        }
    }

    /// Advance to the next event (delivery or timer) and process it. False if nothing is
    /// pending at all.
    fn step(&mut self) -> bool {
        self.flush();
        let next_frame = self.wire.iter().map(|w| w.0).min();
        let next_timer = [self.a.poll_timeout(), self.b.poll_timeout()].into_iter().flatten().min();
        let Some(t) = [next_frame, next_timer].into_iter().flatten().min() else { return false };
        if t > self.now {
            self.now = t;
        }
        let now = self.now;
        let mut due: Vec<(Instant, bool, Vec<u8>)> = Vec::new();
        let mut i = 0;
        while i < self.wire.len() {
            if self.wire[i].0 <= now {
                due.push(self.wire.swap_remove(i));
            } else {
                i += 1;
            }
        }
        due.sort_by_key(|d| d.0);
        for (_, to_b, f) in due {
            let s = if to_b { &mut self.b } else { &mut self.a };
            let _ = s.on_frame(&f, now);
        }
        self.a.on_timeout(now);
        self.b.on_timeout(now);
        self.flush();
        true
    }

    fn elapsed(&self) -> Duration {
        self.now - self.t0
    }
}

fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(2654435761) >> 13) as u8
}

fn drain_events(s: &mut Stack, h: Handle) -> Vec<Event> {
    let mut v = Vec::new();
    if let Some(t) = s.tcb(h) {
        while let Some(e) = t.poll_event() {
            v.push(e);
        }
    }
    v
}

/// Connect A→B, send `len` bytes A→B and `back` bytes B→A, close both sides; check every byte.
fn transfer(mtu: usize, tcp: Config, imp: Impair, seed: u64, len: usize, back: usize) -> Net {
    let mut net = Net::new(mtu, tcp, imp, seed);
    net.b.listen(20_001);
    let ha = net.a.connect(40_000, SocketAddrV4::new(B_IP, 20_001));
    let mut hb = None;
    let (mut sent_a, mut got_b, mut sent_b, mut got_a) = (0usize, 0usize, 0usize, 0usize);
    let (mut closed_a, mut closed_b) = (false, false);
    let mut buf = vec![0u8; 65536];
    let mut steps = 0u64;
    loop {
        steps += 1;
        assert!(steps < 5_000_000, "no progress: sent {sent_a} got {got_b}");
        assert!(net.elapsed() < Duration::from_secs(600), "virtual time ran away");
        if hb.is_none() {
            hb = net.b.accept();
        }
        // A: send
        let ta = net.a.tcb(ha).unwrap();
        if matches!(ta.state(), State::Established | State::CloseWait) && sent_a < len {
            let chunk: Vec<u8> = (sent_a..(sent_a + 40_000).min(len)).map(pattern).collect();
            sent_a += ta.send(&chunk).unwrap();
        }
        if sent_a == len && !closed_a && ta.state() != State::SynSent {
            ta.close();
            closed_a = true;
        }
        let n = ta.recv(&mut buf);
        for (k, &x) in buf[..n].iter().enumerate() {
            assert_eq!(x, pattern(got_a + k + 7), "A received a wrong byte at {}", got_a + k);
        }
        got_a += n;
        if let Some(hb) = hb {
            let tb = net.b.tcb(hb).unwrap();
            let n = tb.recv(&mut buf);
            for (k, &x) in buf[..n].iter().enumerate() {
                assert_eq!(x, pattern(got_b + k), "B received a wrong byte at {}", got_b + k);
            }
            got_b += n;
            if matches!(tb.state(), State::Established | State::CloseWait) && sent_b < back {
                let chunk: Vec<u8> = (sent_b..(sent_b + 40_000).min(back)).map(|i| pattern(i + 7)).collect();
                sent_b += tb.send(&chunk).unwrap();
            }
            if tb.at_eof() && sent_b == back && !closed_b {
                tb.close();
                closed_b = true;
            }
        }
        // Done once closed and every byte read (A may hold more than one read takes).
        let ta = net.a.tcb(ha).unwrap();
        let done_a = matches!(ta.state(), State::TimeWait | State::Closed) && ta.recv_available() == 0;
        let done_b = hb.map_or(false, |h| net.b.tcb(h).unwrap().state() == State::Closed);
        if done_a && done_b {
            break;
        }
        let readable = hb.map_or(false, |h| net.b.tcb(h).unwrap().recv_available() > 0)
            || net.a.tcb(ha).unwrap().recv_available() > 0;
        if !net.step() && !readable {
            let ta = format!("{:?}", net.a.tcb(ha).unwrap()); let tb = format!("{:?}", net.b.tcb(hb.unwrap()).unwrap());
            panic!("deadlock: nothing pending, sent {sent_a} got {got_b}\nA {}\nB {}", &ta[..ta.len().min(3000)], &tb[..tb.len().min(3000)]);
        }
    }
    assert_eq!(got_b, len);
    assert_eq!(got_a, back);
    assert!(net.a.tcb(ha).unwrap().at_eof());
    net
}

#[test]
fn handshake_negotiates_options() {
    let mut net = Net::new(9000, Config::default(), Impair::default(), 1);
    net.keep_log = true;
    net.b.listen(20_001);
    let ha = net.a.connect(40_000, SocketAddrV4::new(B_IP, 20_001));
    for _ in 0..10 {
        net.step();
    }
    let hb = net.b.accept().expect("B accepted");
    assert_eq!(drain_events(&mut net.a, ha), vec![Event::Connected]);
    assert_eq!(drain_events(&mut net.b, hb), vec![Event::Connected]);
    let ta = net.a.tcb(ha).unwrap();
    assert_eq!(ta.state(), State::Established);
    assert_eq!(ta.mss(), 8960);
    assert!(ta.sack_enabled());
    // The SYN and the SYN-ACK carried MSS, window scale and SACK-permitted; the third
    // segment is a plain ACK.
    let (_, syn) = packet::parse_frame(&net.log[0].1).unwrap();
    assert!(net.log[0].0);
    assert_eq!(syn.tcp.flags, flags::SYN);
    assert_eq!(syn.tcp.mss, Some(8960));
    assert_eq!(syn.tcp.wscale, Some(5)); // 1 MiB buffer >> 5 fits 16 bits
    assert!(syn.tcp.sack_permitted);
    let (_, synack) = packet::parse_frame(&net.log[1].1).unwrap();
    assert_eq!(synack.tcp.flags, flags::SYN | flags::ACK);
    assert_eq!(synack.tcp.ack, syn.tcp.seq.wrapping_add(1));
    assert_eq!(synack.tcp.wscale, Some(5));
    let (_, ack) = packet::parse_frame(&net.log[2].1).unwrap();
    assert_eq!(ack.tcp.flags, flags::ACK);
    assert_eq!(ack.tcp.ack, synack.tcp.seq.wrapping_add(1));
    assert_eq!(ack.tcp.mss, None);
}

#[test]
fn clean_transfer_both_ways() {
    let net = transfer(1500, Config::default(), Impair::default(), 2, 3_000_000, 500_000);
    assert_eq!(net.dropped, 0);
}

#[test]
fn jumbo_frames() {
    transfer(9000, Config::default(), Impair::default(), 3, 2_000_000, 10);
}

#[test]
fn one_percent_loss() {
    let imp = Impair { loss: 100, ..Impair::default() };
    let net = transfer(1500, Config::default(), imp, 4, 2_000_000, 100_000);
    assert!(net.dropped > 0);
}

#[test]
fn five_percent_loss_reorder_duplication() {
    let imp = Impair { loss: 500, dup: 200, reorder: 300 };
    for seed in [5, 6, 7] {
        let net = transfer(1500, Config::default(), imp, seed, 1_000_000, 200_000);
        assert!(net.dropped > 0);
    }
}

#[test]
fn twenty_percent_loss_still_delivers() {
    let imp = Impair { loss: 2000, dup: 0, reorder: 0 };
    transfer(1500, Config::default(), imp, 8, 200_000, 1000);
}

#[test]
fn small_buffers_exercise_flow_control() {
    let cfg = Config { recv_buf: 4096, send_buf: 3000, ..Config::default() };
    let imp = Impair { loss: 300, dup: 100, reorder: 200 };
    transfer(1500, cfg, imp, 9, 300_000, 300_000);
}

#[test]
fn sequence_numbers_wrap() {
    // Many seeds: some ISS lands close enough to 2^32 that 4 MB crosses the wrap.
    let imp = Impair { loss: 100, ..Impair::default() };
    for seed in 10..14 {
        transfer(9000, Config::default(), imp, seed, 400_000, 400_000);
    }
}

/// Drop exactly one data segment: fast retransmit (three duplicate ACKs) must repair it long
/// before the RTO would fire.
#[test]
fn fast_retransmit_beats_the_rto() {
    let (mut net, ha, hb) = connected(Config::default(), 20);
    // Send the first flight, then drop its third data frame.
    let (data, to_b) = send_flight(&mut net, ha, 100_000);
    assert!(to_b.len() >= 5, "a flight of several segments");
    net.wire.remove(to_b[2]);
    let start = net.now;
    assert_eq!(read_all(&mut net, hb, data.len()), data);
    let rto_min = Config::default().rto_min;
    assert!(net.now - start < rto_min, "repaired by fast retransmit, not by the RTO");
}

/// As above, against a receiver like Linux, which offers a larger window on every
/// out-of-order segment it queues: its duplicate ACKs SACK new data but never repeat the
/// window, so only RFC 6675's definition of a duplicate ACK (one that SACKs new bytes) sees
/// them. Counting them by RFC 5681's "same window" alone left each loss to the RTO (every
/// lost segment cost 200 ms against a kernel peer).
#[test]
fn fast_retransmit_when_the_dupacks_grow_the_window() {
    let (mut net, ha, hb) = connected(Config::default(), 22);
    assert!(net.a.tcb(ha).unwrap().sack_enabled());
    let (data, to_b) = send_flight(&mut net, ha, 100_000);
    assert!(to_b.len() >= 5, "a flight of several segments");
    net.wire.remove(to_b[2]);
    let start = net.now;
    let grown = std::rc::Rc::new(std::cell::Cell::new(0u16));
    let g = grown.clone();
    // Every pure ACK B sends offers a window other than the last one's (as Linux's grows),
    // never more than B really has.
    net.edit_to_a = Some(Box::new(move |f: &mut [u8]| {
        let ip = packet::ETH_HDR;
        let ihl = usize::from(f[ip] & 0xf) * 4;
        let tcp = ip + ihl;
        let total = usize::from(u16::from_be_bytes([f[ip + 2], f[ip + 3]]));
        let hlen = usize::from(f[tcp + 12] >> 4) * 4;
        if total != ihl + hlen || f[tcp + 13] & (flags::SYN | flags::FIN | flags::RST) != 0 {
            return;
        }
        g.set(g.get() + 1);
        let w = u16::from_be_bytes([f[tcp + 14], f[tcp + 15]]).saturating_sub(1 + g.get() % 8);
        f[tcp + 14..tcp + 16].copy_from_slice(&w.to_be_bytes());
        f[tcp + 16..tcp + 18].fill(0);
        let c = packet::tcp_checksum(B_IP, A_IP, &f[tcp..ip + total]);
        f[tcp + 16..tcp + 18].copy_from_slice(&c.to_be_bytes());
    }));
    assert_eq!(read_all(&mut net, hb, data.len()), data);
    assert!(grown.get() >= 3, "the window changed on {} ACKs", grown.get());
    let rto_min = Config::default().rto_min;
    assert!(net.now - start < rto_min, "repaired by fast retransmit, not by the RTO");
}

/// Against a receiver that compresses its duplicate ACKs, as Linux does (one SACK update for
/// many out-of-order segments): a single duplicate ACK SACKing more than 2 MSS above the hole
/// marks it lost (RFC 6675 IsLost), without waiting for three.
#[test]
fn fast_retransmit_on_one_compressed_sack() {
    let (mut net, ha, hb) = connected(Config::default(), 23);
    let (data, to_b) = send_flight(&mut net, ha, 20_000);
    assert!(to_b.len() >= 5, "a flight of several segments");
    // Lose the first segment, and deliver the rest of the flight at once behind it.
    net.wire.remove(to_b[0]);
    let start = net.now;
    // B takes the flight in one go and answers with one duplicate ACK SACKing all of it
    // (keep only the last, should it send more).
    net.step();
    let dup: Vec<usize> = (0..net.wire.len()).filter(|&i| !net.wire[i].1).collect();
    assert!(!dup.is_empty(), "B sent no duplicate ACK");
    for &i in dup[..dup.len() - 1].iter().rev() {
        net.wire.remove(i);
    }
    assert_eq!(read_all(&mut net, hb, data.len()), data);
    let rto_min = Config::default().rto_min;
    assert!(net.now - start < rto_min, "repaired by fast retransmit, not by the RTO");
}

#[test]
fn zero_window_then_reopen() {
    let cfg = Config { recv_buf: 8192, ..Config::default() };
    let (mut net, ha, hb) = connected(cfg, 21);
    let data: Vec<u8> = (0..50_000).map(pattern).collect();
    let n = net.a.tcb(ha).unwrap().send(&data).unwrap();
    assert_eq!(n, 50_000);
    // B does not read: A fills the 8 KiB window and stops.
    for _ in 0..200 {
        net.step();
    }
    assert_eq!(net.b.tcb(hb).unwrap().recv_available(), 8192);
    assert!(net.a.tcb(ha).unwrap().send_queued() >= 50_000 - 8192);
    // Advance through several persist-timer probes: still nothing beyond the window.
    let t = net.now;
    while net.now - t < Duration::from_secs(3) {
        assert!(net.step());
    }
    assert_eq!(net.b.tcb(hb).unwrap().recv_available(), 8192);
    // Reading reopens the window; everything arrives.
    let mut got = Vec::new();
    let mut buf = vec![0u8; 4096];
    while got.len() < data.len() {
        let n = net.b.tcb(hb).unwrap().recv(&mut buf);
        got.extend_from_slice(&buf[..n]);
        assert!(net.step() || n > 0);
    }
    assert_eq!(got, data);
}

/// `recv_with` hands the bytes out where they lie — at most two slices (the ring's halves),
/// in order, no more than asked — and reopens the window as `recv` does.
#[test]
fn recv_with_lends_the_bytes_in_place() {
    let cfg = Config { recv_buf: 8192, ..Config::default() };
    let (mut net, ha, hb) = connected(cfg, 23);
    let data: Vec<u8> = (0..100_000).map(pattern).collect();
    let mut sent = 0;
    let mut got = Vec::new();
    let mut wrapped = false;
    let mut steps = 0;
    while got.len() < data.len() {
        steps += 1;
        assert!(steps < 1_000_000, "no progress: got {}", got.len());
        if sent < data.len() {
            sent += net.a.tcb(ha).unwrap().send(&data[sent..]).unwrap();
        }
        // An odd read size, and reads that leave bytes behind (the ring then wraps).
        let tb = net.b.tcb(hb).unwrap();
        if tb.recv_available() < 5000 && sent - got.len() >= 5000 {
            assert!(net.step(), "nothing moves with {} bytes unread", sent - got.len());
            continue;
        }
        let (mut slices, before) = (0, got.len());
        let n = tb.recv_with(3001, &mut |s| {
            assert!(!s.is_empty(), "an empty slice was lent");
            slices += 1;
            got.extend_from_slice(s);
        });
        assert!(n <= 3001 && got.len() - before == n, "{n} taken, {} lent", got.len() - before);
        assert!(slices <= 2, "{slices} slices for one read");
        wrapped |= slices == 2;
        assert!(net.step() || n > 0 || sent < data.len());
    }
    assert_eq!(got, data);
    assert!(wrapped, "the receive ring never wrapped: the two-slice case went untested");
}

#[test]
fn rst_for_closed_port_and_refused_connect() {
    let mut net = Net::new(1500, Config::default(), Impair::default(), 22);
    let ha = net.a.connect(40_000, SocketAddrV4::new(B_IP, 20_009)); // nobody listens
    for _ in 0..10 {
        net.step();
    }
    let ev = drain_events(&mut net.a, ha);
    assert_eq!(ev, vec![Event::Reset, Event::Closed]);
    assert_eq!(net.a.tcb(ha).unwrap().state(), State::Closed);
}

#[test]
fn abort_resets_the_peer() {
    let (mut net, ha, hb) = connected(Config::default(), 23);
    drain_events(&mut net.b, hb);
    net.a.tcb(ha).unwrap().abort();
    for _ in 0..10 {
        net.step();
    }
    assert_eq!(drain_events(&mut net.b, hb), vec![Event::Reset, Event::Closed]);
}

#[test]
fn rst_with_wrong_sequence_gets_a_challenge_ack() {
    let mut net = Net::new(1500, Config::default(), Impair::default(), 24);
    net.keep_log = true;
    net.b.listen(20_001);
    let ha = net.a.connect(40_000, SocketAddrV4::new(B_IP, 20_001));
    for _ in 0..10 {
        net.step();
    }
    let hb = net.b.accept().unwrap();
    // Forge a RST from A to B with an in-window but inexact sequence number.
    let (_, last_to_b) = net.log.iter().rev().find(|l| l.0).cloned().unwrap();
    let (_, p) = packet::parse_frame(&last_to_b).unwrap();
    let mut h = p.tcp;
    h.seq = h.seq.wrapping_add(100);
    h.flags = flags::RST;
    h.mss = None;
    h.wscale = None;
    h.sack_permitted = false;
    let a = packet::FrameAddrs { src_mac: A_MAC, dst_mac: B_MAC, src: A_IP, dst: B_IP, ip_id: 1 };
    let mut f = vec![0u8; packet::frame_len(&h, 0)];
    packet::emit_frame(&a, &h, &[], &mut f);
    let before = net.log.len();
    net.b.on_frame(&f, net.now).unwrap();
    net.flush();
    assert_eq!(net.b.tcb(hb).unwrap().state(), State::Established);
    let (to_b, ack) = &net.log[before];
    assert!(!to_b);
    let (_, p) = packet::parse_frame(ack).unwrap();
    assert_eq!(p.tcp.flags, flags::ACK, "challenge ACK (RFC 5961 §3.2)");
    assert_eq!(net.a.tcb(ha).unwrap().state(), State::Established);
}

#[test]
fn lost_syn_and_synack_are_retransmitted() {
    let mut net = Net::new(1500, Config::default(), Impair::default(), 25);
    net.b.listen(20_001);
    let ha = net.a.connect(40_000, SocketAddrV4::new(B_IP, 20_001));
    net.flush();
    net.wire.clear(); // the SYN is lost
    while net.b.handles().is_empty() {
        assert!(net.step());
    }
    assert!(net.elapsed() >= Duration::from_secs(1), "SYN retransmitted after the initial RTO");
    net.wire.retain(|w| w.1); // the SYN-ACK is lost
    let mut n = 0;
    while net.a.tcb(ha).unwrap().state() != State::Established {
        assert!(net.step());
        n += 1;
        assert!(n < 100);
    }
    for _ in 0..10 {
        net.step();
    }
    assert!(net.b.accept().is_some());
}

/// Untrusted peers: frames of a real connection, mutated at random (bit flips, truncation,
/// option bytes, flags, sequence numbers — with checksums recomputed so they reach the
/// state machine), fed to a live stack. Nothing may panic, and the connection must still
/// be in a legal state afterwards.
#[test]
fn mutated_segments_never_panic() {
    let mut net = Net::new(1500, Config::default(), Impair::default(), 30);
    net.keep_log = true;
    net.b.listen(20_001);
    let ha = net.a.connect(40_000, SocketAddrV4::new(B_IP, 20_001));
    for _ in 0..10 {
        net.step();
    }
    let data: Vec<u8> = (0..20_000).map(pattern).collect();
    net.a.tcb(ha).unwrap().send(&data).unwrap();
    for _ in 0..50 {
        net.step();
    }
    let samples: Vec<Vec<u8>> = net.log.iter().filter(|l| l.0).map(|l| l.1.clone()).collect();
    let mut rng = Rng(0xfeed);
    for round in 0..20_000 {
        let mut f = samples[round % samples.len()].clone();
        let ip0 = packet::ETH_HDR;
        let tcp0 = ip0 + packet::IPV4_HDR;
        match rng.next() % 6 {
            0 => {
                let i = (rng.next() as usize) % f.len();
                f[i] ^= 1 << (rng.next() % 8);
            }
            1 => f.truncate((rng.next() as usize) % f.len()),
            2 => {
                // TCP header/options bytes, then fix the checksums so the parser and the
                // state machine see them.
                for _ in 0..4 {
                    let i = tcp0 + (rng.next() as usize) % (f.len() - tcp0).min(60);
                    f[i] = rng.next() as u8;
                }
            }
            3 => f[tcp0 + 13] = rng.next() as u8, // flags
            4 => {
                let s = rng.next() as u32;
                f[tcp0 + 4..tcp0 + 8].copy_from_slice(&s.to_be_bytes());
            }
            _ => {
                let a = rng.next() as u32;
                f[tcp0 + 8..tcp0 + 12].copy_from_slice(&a.to_be_bytes());
            }
        }
        if f.len() > tcp0 + packet::TCP_HDR && rng.next() % 4 != 0 {
            let tot = (f.len() - ip0) as u16;
            f[ip0 + 2..ip0 + 4].copy_from_slice(&tot.to_be_bytes());
            f[ip0 + 10..ip0 + 12].fill(0);
            let c = packet::checksum(&f[ip0..tcp0]);
            f[ip0 + 10..ip0 + 12].copy_from_slice(&c.to_be_bytes());
            f[tcp0 + 16..tcp0 + 18].fill(0);
            let c = packet::tcp_checksum(A_IP, B_IP, &f[tcp0..]);
            f[tcp0 + 16..tcp0 + 18].copy_from_slice(&c.to_be_bytes());
        }
        let _ = net.b.on_frame(&f, net.now);
        let mut out = vec![0u8; 2000];
        while let Some(n) = net.b.poll_transmit(net.now, &mut out) {
            assert!(n <= packet::ETH_HDR + 1500);
        }
        net.now += Duration::from_micros(10);
        net.b.on_timeout(net.now);
    }
}

/// A SYN flood holds at most MAX_HALF_OPEN connections; a passive connection reset before it
/// was accepted is forgotten by the stack.
#[test]
fn syn_flood_is_bounded_and_unaccepted_resets_are_reaped() {
    let mut net = Net::new(1500, Config::default(), Impair::default(), 31);
    net.b.listen(20_001);
    let a = packet::FrameAddrs { src_mac: A_MAC, dst_mac: B_MAC, src: A_IP, dst: B_IP, ip_id: 1 };
    let syn = |port: u16, seq: u32| {
        let h = packet::TcpHeader { src_port: port, dst_port: 20_001, seq, flags: flags::SYN, window: 1000, mss: Some(1460), ..Default::default() };
        let mut f = vec![0u8; packet::frame_len(&h, 0)];
        packet::emit_frame(&a, &h, &[], &mut f);
        f
    };
    for port in 0..1000u16 {
        net.b.on_frame(&syn(30_000 + port, 7), net.now).unwrap();
    }
    assert_eq!(net.b.handles().len(), uiw_utcp::stack::MAX_HALF_OPEN);
    // One of them is reset by its "client" (RST at the SYN-ACK's ack point): reaped.
    let mut out = vec![0u8; 2000];
    let mut synack = None;
    while let Some(n) = net.b.poll_transmit(net.now, &mut out) {
        let (_, p) = packet::parse_frame(&out[..n]).unwrap();
        if p.tcp.dst_port == 30_000 {
            synack = Some(p.tcp);
        }
    }
    let sa = synack.expect("a SYN-ACK to port 30000");
    let h = packet::TcpHeader { src_port: 30_000, dst_port: 20_001, seq: sa.ack, flags: flags::RST, ..Default::default() };
    let mut f = vec![0u8; packet::frame_len(&h, 0)];
    packet::emit_frame(&a, &h, &[], &mut f);
    net.b.on_frame(&f, net.now).unwrap();
    net.b.on_timeout(net.now);
    assert_eq!(net.b.handles().len(), uiw_utcp::stack::MAX_HALF_OPEN - 1);
    assert!(net.b.accept().is_none());
}

fn delayed() -> Config {
    Config { ack_delay: Duration::from_micros(500), ..Config::default() }
}

/// With delayed ACK, transfers in both directions still complete byte for byte, clean and
/// under loss, reordering and duplication (out-of-order data is acknowledged at once).
#[test]
fn delayed_ack_transfers_under_loss() {
    transfer(1500, delayed(), Impair::default(), 21, 2_000_000, 300_000);
    transfer(1500, delayed(), Impair { loss: 100, dup: 0, reorder: 0 }, 22, 1_000_000, 100_000);
    transfer(1500, delayed(), Impair { loss: 500, dup: 100, reorder: 200 }, 23, 500_000, 500_000);
}

/// One small request, answered: with `ack_delay` the request's ACK rides on the answer (one
/// frame each way, no pure ACK); without, a pure ACK leaves first. A request nobody answers
/// is acknowledged when the delay is up, and a stream of full-sized segments every second
/// segment.
#[test]
fn delayed_ack_rides_on_the_answer() {
    for (cfg, frames_b) in [(delayed(), 1), (Config::default(), 2)] {
        let mut net = Net::new(1500, cfg, Impair::default(), 5);
        net.b.listen(20_001);
        let ha = net.a.connect(40_000, SocketAddrV4::new(B_IP, 20_001));
        for _ in 0..10 {
            net.step();
        }
        let hb = net.b.accept().expect("accepted");
        net.keep_log = true;
        assert_eq!(net.a.tcb(ha).unwrap().send(b"request"), Ok(7));
        net.flush();
        // Deliver the request (and nothing else yet), and let B transmit what it wants at
        // once (a host's turn), before its application answers.
        net.now += net.delay;
        let (_, _, f) = net.wire.pop().unwrap();
        assert!(net.wire.is_empty());
        let _ = net.b.on_frame(&f, net.now);
        net.flush();
        let mut buf = [0u8; 16];
        assert_eq!(net.b.tcb(hb).unwrap().recv(&mut buf), 7);
        assert_eq!(net.b.tcb(hb).unwrap().send(b"answer"), Ok(6));
        net.flush();
        let from_b: Vec<_> = net.log.iter().filter(|(to_b, _)| !to_b).collect();
        assert_eq!(from_b.len(), frames_b, "frames from B for one request and its answer");
        let (_, last) = packet::parse_frame(&from_b.last().unwrap().1).unwrap();
        assert_eq!(last.payload, b"answer");
        assert!(last.tcp.flags & flags::ACK != 0);
        // The answer acknowledged the request.
        let (_, req) = packet::parse_frame(&net.log[0].1).unwrap();
        assert_eq!(last.tcp.ack, req.tcp.seq.wrapping_add(7));
    }

    // Unanswered: acknowledged once the delay is up, not before.
    let mut net = Net::new(1500, delayed(), Impair::default(), 6);
    net.b.listen(20_001);
    let ha = net.a.connect(40_000, SocketAddrV4::new(B_IP, 20_001));
    for _ in 0..10 {
        net.step();
    }
    let _hb = net.b.accept().expect("accepted");
    net.keep_log = true;
    assert_eq!(net.a.tcb(ha).unwrap().send(b"x"), Ok(1));
    net.flush();
    net.now += net.delay;
    let (_, _, f) = net.wire.pop().unwrap();
    let _ = net.b.on_frame(&f, net.now);
    let got = net.now;
    net.flush();
    assert_eq!(net.log.iter().filter(|(to_b, _)| !to_b).count(), 0, "a pure ACK before the delay");
    assert_eq!(net.b.poll_timeout(), Some(got + Duration::from_micros(500)));
    net.now = got + Duration::from_micros(500);
    net.b.on_timeout(net.now);
    net.flush();
    assert_eq!(net.log.iter().filter(|(to_b, _)| !to_b).count(), 1, "the ACK when the delay is up");

    // Full-sized segments: an ACK for every second one at once.
    net.log.clear();
    net.wire.clear();
    assert_eq!(net.a.tcb(ha).unwrap().send(&[7u8; 1460 * 4]), Ok(1460 * 4));
    net.flush();
    net.now += net.delay;
    for (_, _, f) in std::mem::take(&mut net.wire) {
        let _ = net.b.on_frame(&f, net.now);
    }
    net.flush();
    let acks = net.log.iter().filter(|(to_b, _)| !to_b).count();
    assert!(acks >= 1, "no ACK for four full-sized segments");
}

/// A queues `len` bytes of the pattern (taken whole) and its first flight goes on the wire:
/// the data, and where in `net.wire` the frames to B are.
fn send_flight(net: &mut Net, ha: Handle, len: usize) -> (Vec<u8>, Vec<usize>) {
    let data: Vec<u8> = (0..len).map(pattern).collect();
    assert_eq!(net.a.tcb(ha).unwrap().send(&data), Ok(len));
    net.flush();
    let to_b = (0..net.wire.len()).filter(|&i| net.wire[i].1).collect();
    (data, to_b)
}

/// A connected pair (A active, B passive) on a clean link, handshake done.
fn connected(cfg: Config, seed: u64) -> (Net, Handle, Handle) {
    let mut net = Net::new(1500, cfg, Impair::default(), seed);
    net.b.listen(20_001);
    let ha = net.a.connect(40_000, SocketAddrV4::new(B_IP, 20_001));
    for _ in 0..10 {
        net.step();
    }
    let hb = net.b.accept().unwrap();
    (net, ha, hb)
}

/// (sequence number, payload length, flags) of a frame.
fn seg_of(f: &[u8]) -> (u32, usize, u8) {
    let (_, p) = packet::parse_frame(f).unwrap();
    (p.tcp.seq, p.payload.len(), p.tcp.flags)
}

/// Run until B has read `want` bytes; returns them.
fn read_all(net: &mut Net, hb: Handle, want: usize) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 65536];
    while got.len() < want {
        assert!(net.step(), "stalled with {} of {want} bytes", got.len());
        let n = net.b.tcb(hb).unwrap().recv(&mut buf);
        got.extend_from_slice(&buf[..n]);
    }
    got
}

/// The tail of a flight is lost, and nothing follows it to draw duplicate ACKs: the tail loss
/// probe (RFC 8985 §7) repairs it after about two RTTs, not after the RTO. Two segments lost:
/// probed at 2·SRTT (200 µs here). One lost: the one segment left in flight is probed only
/// after the peer's worst-case delayed ACK (WCDelAckT, 200 ms) — as Linux does, so with the
/// default 200 ms RTO floor that is the RTO's job; with a 1 s RTO the probe comes first.
#[test]
fn tail_loss_probe_repairs_a_lost_tail() {
    let slow_rto = Config { rto_min: Duration::from_secs(1), ..Config::default() };
    let ms = Duration::from_millis;
    for (seed, lost, cfg, within) in [(40, 2, Config::default(), ms(0)..ms(5)), (41, 1, slow_rto, ms(200)..ms(500))] {
        let (mut net, ha, hb) = connected(cfg, seed);
        let srtt = net.a.tcb(ha).unwrap().srtt().expect("an RTT sample from the handshake");
        // Ten segments: the whole initial window, nothing queued behind it.
        let (data, to_b) = send_flight(&mut net, ha, 14_000);
        assert_eq!(to_b.len(), 10);
        let end = {
            let (s, len, _) = seg_of(&net.wire[to_b[9]].2);
            s.wrapping_add(len as u32)
        };
        for &i in to_b[10 - lost..].iter().rev() {
            net.wire.remove(i);
        }
        let start = net.now;
        net.keep_log = true;
        let mut probed = None;
        let mut got = Vec::new();
        let mut buf = vec![0u8; 65536];
        while got.len() < data.len() {
            assert!(net.step());
            let n = net.b.tcb(hb).unwrap().recv(&mut buf);
            got.extend_from_slice(&buf[..n]);
            if probed.is_none() {
                if let Some((_, f)) = net.log.iter().find(|l| l.0) {
                    probed = Some((net.now - start, seg_of(f)));
                }
            }
        }
        assert_eq!(got, data);
        let (at, (s, len, _)) = probed.unwrap();
        assert!(within.contains(&at), "{lost} lost at the tail: first resent after {at:?} (SRTT {srtt:?})");
        assert_eq!(s.wrapping_add(len as u32), end, "the probe is the last segment again");
        let took = net.now - start;
        assert!(took < within.end, "{lost} lost at the tail: repaired after {took:?}");
    }
}

/// Every segment arrived but B's one cumulative ACK for them was lost: one probe draws the
/// ACK again, and nothing else is retransmitted.
#[test]
fn tail_loss_probe_recovers_a_lost_ack() {
    let (mut net, ha, hb) = connected(Config::default(), 42);
    let (data, _) = send_flight(&mut net, ha, 14_000);
    // Deliver the flight; drop whatever B answers.
    net.step();
    let from_b = net.wire.iter().filter(|w| !w.1).count();
    assert!(from_b >= 1, "B acknowledged the flight");
    net.wire.retain(|w| w.1);
    let start = net.now;
    net.keep_log = true;
    assert_eq!(read_all(&mut net, hb, data.len()), data);
    while net.a.tcb(ha).unwrap().send_queued() > 0 {
        assert!(net.step());
        assert!(net.now - start < Duration::from_secs(1), "never acknowledged");
    }
    let took = net.now - start;
    assert!(took < Duration::from_millis(5), "acknowledged after {took:?}");
    let sent: Vec<_> = net.log.iter().filter(|l| l.0).map(|l| seg_of(&l.1)).collect();
    assert_eq!(sent.len(), 1, "one probe, no retransmission storm: {sent:?}");
    assert!(sent[0].1 > 0 && sent[0].1 <= 1460);
}

/// An ACK that is only late — by 1 ms here, ten times the SRTT, as when the peer's thread is
/// preempted — draws no probe: the PTO has Linux's slack (2 ms) on top of 2·SRTT.
#[test]
fn tail_loss_probe_leaves_a_late_ack_alone() {
    let (mut net, ha, hb) = connected(Config::default(), 45);
    let srtt = net.a.tcb(ha).unwrap().srtt().expect("an RTT sample from the handshake");
    assert!(srtt * 10 <= Duration::from_millis(1), "SRTT {srtt:?}: the link is too slow for this test");
    let (data, _) = send_flight(&mut net, ha, 14_000);
    net.keep_log = true;
    // Deliver the flight; hold back whatever B answers by 1 ms.
    net.step();
    assert!(net.wire.iter().any(|w| !w.1), "B acknowledged the flight");
    for w in net.wire.iter_mut().filter(|w| !w.1) {
        w.0 += Duration::from_millis(1);
    }
    assert_eq!(read_all(&mut net, hb, data.len()), data);
    let start = net.now;
    while net.a.tcb(ha).unwrap().send_queued() > 0 {
        assert!(net.step());
        assert!(net.now - start < Duration::from_secs(1), "never acknowledged");
    }
    let resent: Vec<_> = net.log.iter().filter(|l| l.0).map(|l| seg_of(&l.1)).filter(|s| s.1 > 0).collect();
    assert!(resent.is_empty(), "a late ACK drew a probe: {resent:?}");
}

/// The last three segments are lost. The probe (the last segment again, or new data when
/// more is queued) is SACKed with a hole at snd_una: the segments before it were lost, and
/// fast recovery starts at once (a short tail never draws three duplicate ACKs).
#[test]
fn tail_loss_probe_sack_starts_fast_recovery() {
    for (seed, total) in [(43, 14_000), (44, 100_000)] {
        let (mut net, ha, hb) = connected(Config::default(), seed);
        let (data, to_b) = send_flight(&mut net, ha, total);
        assert!(to_b.len() >= 10, "the initial window");
        let first_lost = seg_of(&net.wire[to_b[7]].2).0;
        for &i in to_b[7..].iter().rev() {
            net.wire.remove(i);
        }
        let start = net.now;
        net.keep_log = true;
        // Until the probe's SACK is back, then one more step for A to answer it.
        loop {
            assert!(net.step());
            assert!(net.now - start < Duration::from_millis(100), "no probe");
            if net.log.iter().any(|l| !l.0 && packet::parse_frame(&l.1).unwrap().1.tcp.sack_len > 0) {
                break;
            }
        }
        let sacked_at = net.now;
        net.step();
        let sent: Vec<_> = net.log.iter().filter(|l| l.0).map(|l| seg_of(&l.1)).collect();
        assert!(sent.len() >= 2, "{sent:?}");
        assert_ne!(sent[0].0, first_lost, "the first frame is the probe, past the hole");
        assert!(sent[1..].iter().any(|s| s.0 == first_lost), "the hole at snd_una retransmitted at once: {sent:?}");
        assert!(net.now - sacked_at < Duration::from_millis(1));
        assert_eq!(read_all(&mut net, hb, data.len()), data);
        let took = net.now - start;
        assert!(took < Duration::from_millis(50), "repaired after {took:?}");
    }
}

/// One segment in flight: the PTO waits out the peer's worst-case delayed ACK (RFC 8985
/// §7.2, WCDelAckT = 200 ms) — a delayed ACK draws no spurious probe — and a lost lone
/// segment is still probed before the RTO.
#[test]
fn tail_loss_probe_waits_for_a_delayed_ack() {
    // An RTO of at least 1 s leaves room for the probe below it.
    let cfg = Config { rto_min: Duration::from_secs(1), ack_delay: Duration::from_millis(100), ..Config::default() };
    let (mut net, ha, hb) = connected(cfg, 45);
    net.keep_log = true;
    assert_eq!(net.a.tcb(ha).unwrap().send(b"request"), Ok(7));
    let start = net.now;
    assert_eq!(read_all(&mut net, hb, 7), b"request");
    while net.a.tcb(ha).unwrap().send_queued() > 0 {
        assert!(net.step());
    }
    let took = net.now - start;
    assert!(took >= Duration::from_millis(100), "acknowledged after the delay, {took:?}");
    assert_eq!(net.log.iter().filter(|l| l.0).count(), 1, "no probe while the ACK was delayed");

    // The lone segment is lost: probed after 2·SRTT + 200 ms, before the 1 s RTO.
    net.log.clear();
    assert_eq!(net.a.tcb(ha).unwrap().send(b"again"), Ok(5));
    net.flush();
    net.wire.retain(|w| !w.1);
    let start = net.now;
    let mut first_resend = None;
    while net.a.tcb(ha).unwrap().send_queued() > 0 {
        assert!(net.step());
        if first_resend.is_none() && net.log.iter().filter(|l| l.0).count() >= 2 {
            first_resend = Some(net.now - start);
        }
    }
    let t = first_resend.expect("retransmitted");
    assert!(t >= Duration::from_millis(200), "probed before the delayed-ACK allowance: {t:?}");
    assert!(t < Duration::from_millis(500), "probed at {t:?}, not before the RTO");
}

/// D-SACK (RFC 2883 §4): a segment B receives twice is reported, once, as the first SACK
/// block of B's next segment — whether the copy came after the data was delivered in order
/// (below RCV.NXT) or while it waited out of order behind a hole. A Linux sender learns from
/// it that its retransmission was needless (veth reorders what it sends from two CPUs).
#[test]
fn data_received_twice_is_reported_once_as_a_d_sack() {
    for lose_first in [false, true] {
        let (mut net, ha, hb) = connected(Config::default(), 29);
        let (data, to_b) = send_flight(&mut net, ha, 6000);
        assert!(to_b.len() >= 3, "a flight of several segments");
        let twice = net.wire[to_b[1]].clone();
        let (seq, len, _) = seg_of(&twice.2);
        net.wire.push(twice);
        if lose_first {
            net.wire.remove(to_b[0]);
        }
        net.keep_log = true;
        assert_eq!(read_all(&mut net, hb, data.len()), data);
        let firsts: Vec<(u32, u32)> = net
            .log
            .iter()
            .filter(|(to_b, _)| !to_b)
            .filter_map(|(_, f)| packet::parse_frame(f).ok().and_then(|(_, p)| p.tcp.sack_blocks().first().copied()))
            .collect();
        let dsack = (seq, seq.wrapping_add(len as u32));
        assert_eq!(firsts.iter().filter(|&&b| b == dsack).count(), 1, "lose_first {lose_first}: first SACK blocks {firsts:?}, D-SACK {dsack:?}");
    }
}
