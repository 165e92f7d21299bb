//! iWARP over the kernel bypass, without the provider's engine: `uiw-wire`'s sans-IO
//! connection (MPA, DDP, RDMAP) on uiw's userspace TCP on AF_XDP or AF_PACKET in namespace a,
//! against the same connection on the kernel's TCP in namespace b. Send, RDMA Write and RDMA
//! Read of 1 MiB each, under random loss, with every byte checked; and a capture that
//! Wireshark's iWARP dissectors decode with no malformed frame (`ci/tshark-check.sh`).
//! Needs root; as root under CI it must run.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddrV4, TcpListener};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use uiw_rawnet::testbed::{self as bed, Bed, B_IP, IF};
use uiw_rawnet::{afpacket::PacketSocket, guard::RstGuard, neigh, netns, xdp::XskSocket, FrameIo, Host, Iface, DEFAULT_PORTS};
use uiw_utcp::{Config as TcpConfig, StackConfig, State as TcpState};
use uiw_wire::conn::{Config, Connection, Event, Role, SendFlags, WcOpcode};
use uiw_wire::placement::{Access, Memory, MemoryIo, Placement, Source};
use uiw_wire::{TaggedError, WcStatus};

const LEN: usize = 1 << 20;
const SRC_STAG: u32 = 0x100; // b's region that a reads
const DST_STAG: u32 = 0x200; // b's region that a writes
const LOCAL_STAG: u32 = 0x300; // a's region the Read lands in
const BASE: u64 = 0x10_0000;

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| ((i.wrapping_mul(2654435761)) >> 9) as u8 ^ seed).collect()
}

/// Registered memory, as the engine would keep it.
#[derive(Default)]
struct Mem {
    regions: HashMap<u32, Vec<u8>>,
    sends: HashMap<u64, Vec<u8>>,
    recvs: HashMap<u64, Vec<u8>>,
}

impl Memory for Mem {
    fn check_tagged(&self, stag: u32, to: u64, len: u32, _access: Access) -> Result<(), TaggedError> {
        let r = self.regions.get(&stag).ok_or(TaggedError::InvalidStag)?;
        let end = to.checked_add(u64::from(len)).ok_or(TaggedError::ToWrap)?;
        if to < BASE || end > BASE + r.len() as u64 {
            return Err(TaggedError::BaseBounds);
        }
        Ok(())
    }
}

impl MemoryIo for Mem {
    fn read(&self, src: Source, out: &mut [u8]) {
        match src {
            Source::Wr { wr_id, offset } => out.copy_from_slice(&self.sends[&wr_id][offset as usize..][..out.len()]),
            Source::Tagged { stag, to } => {
                let o = (to - BASE) as usize;
                out.copy_from_slice(&self.regions[&stag][o..o + out.len()]);
            }
            Source::None => {}
        }
    }
    fn write(&mut self, dst: Placement, data: &[u8]) {
        match dst {
            Placement::Recv { wr_id, offset } => {
                self.recvs.get_mut(&wr_id).unwrap()[offset as usize..][..data.len()].copy_from_slice(data)
            }
            Placement::Tagged { stag, to } => {
                let o = (to - BASE) as usize;
                self.regions.get_mut(&stag).unwrap()[o..o + data.len()].copy_from_slice(data);
            }
            Placement::Discard => {}
        }
    }
}

/// b: the responder on a kernel TCP socket. Returns its memory after the peer closes.
fn kernel_responder(ns: String, port: u16, ready: mpsc::Sender<()>) -> std::thread::JoinHandle<(Mem, Vec<Event>)> {
    std::thread::spawn(move || {
        netns::enter(&ns).unwrap();
        let l = TcpListener::bind(SocketAddrV4::new(B_IP, port)).unwrap();
        ready.send(()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        s.set_nonblocking(true).unwrap();
        s.set_nodelay(true).unwrap();
        let mut cfg = Config::new(Role::Responder);
        cfg.mss = 1448; // the kernel's MSS toward a 1500-byte link with timestamps
        let start = Instant::now();
        let now_ms = || start.elapsed().as_millis() as u64;
        let mut c = Connection::new(cfg, now_ms());
        let mut m = Mem::default();
        m.regions.insert(SRC_STAG, pattern(LEN, 0x5a));
        m.regions.insert(DST_STAG, vec![0; LEN]);
        m.recvs.insert(1, vec![0; LEN]);
        c.post_recv(1, LEN as u32).unwrap();
        let mut events = Vec::new();
        let mut out: Vec<u8> = Vec::new();
        let mut buf = vec![0u8; 65536];
        loop {
            assert!(start.elapsed() < Duration::from_secs(120), "kernel responder stalled: {events:?}");
            let mut idle = true;
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    idle = false;
                    let mut off = 0;
                    while off < n {
                        let k = c.handle_bytes(&buf[off..n], &mut m);
                        if k == 0 {
                            break;
                        }
                        off += k;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("kernel responder: {e}"),
            }
            while out.len() < 1 << 20 && c.poll_transmit(&mut out, &m) {}
            if !out.is_empty() {
                match s.write(&out) {
                    Ok(n) => {
                        out.drain(..n);
                        idle = false;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(e) => panic!("kernel responder write: {e}"),
                }
            }
            if let Some(t) = c.poll_timeout() {
                if now_ms() >= t {
                    c.handle_timeout(now_ms());
                }
            }
            while let Some(e) = c.poll_event() {
                events.push(e);
            }
            if idle {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        (m, events)
    })
}

/// a: the initiator on uiw's userspace TCP. Sends, Writes and Reads LEN bytes each.
fn user_initiator(xdp: bool, port: u16) -> Mem {
    let iface = Iface::lookup(IF).unwrap();
    let _guard = RstGuard::install(IF, iface.ip, DEFAULT_PORTS).unwrap();
    let io: Box<dyn FrameIo> = if xdp {
        Box::new(XskSocket::open(&iface, DEFAULT_PORTS).unwrap())
    } else {
        Box::new(PacketSocket::open(&iface, DEFAULT_PORTS).unwrap())
    };
    let cfg = StackConfig { mac: iface.mac, ip: iface.ip, mtu: iface.mtu, tcp: TcpConfig::default(), seed: std::process::id() as u64 * 7919 };
    let mut host = Host::new(cfg, io);
    host.stack.set_neighbour(B_IP, neigh::resolve(B_IP, Duration::from_secs(5)).unwrap());
    let h = host.stack.connect(DEFAULT_PORTS.0 + 33, SocketAddrV4::new(B_IP, port));
    let start = Instant::now();
    while host.stack.tcb(h).unwrap().state() != TcpState::Established {
        assert!(start.elapsed() < Duration::from_secs(10), "TCP handshake with the kernel");
        host.poll(64).unwrap();
    }
    let now_ms = || start.elapsed().as_millis() as u64;
    let mut wcfg = Config::new(Role::Initiator);
    wcfg.mss = host.stack.tcb(h).unwrap().mss();
    let mut c = Connection::new(wcfg, now_ms());
    let mut m = Mem::default();
    m.sends.insert(10, pattern(LEN, 0x11));
    m.sends.insert(11, pattern(LEN, 0x22));
    m.regions.insert(LOCAL_STAG, vec![0; LEN]);
    let mut posted = false;
    let mut done: Vec<(u64, WcOpcode, WcStatus)> = Vec::new();
    let mut out: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 65536];
    let mut pending_rx: Vec<u8> = Vec::new();
    while done.len() < 3 {
        assert!(start.elapsed() < Duration::from_secs(120), "stalled; completions {done:?}, {:?}", host.stats);
        host.poll(64).unwrap();
        let t = host.stack.tcb(h).unwrap();
        assert_ne!(t.state(), TcpState::Closed, "TCP connection lost");
        let n = t.recv(&mut buf);
        pending_rx.extend_from_slice(&buf[..n]);
        let mut off = 0;
        while off < pending_rx.len() {
            let k = c.handle_bytes(&pending_rx[off..], &mut m);
            if k == 0 {
                break;
            }
            off += k;
        }
        pending_rx.drain(..off);
        while let Some(e) = c.poll_event() {
            match e {
                Event::Established(_) if !posted => {
                    posted = true;
                    c.post_send(10, SendFlags::default(), LEN as u32).unwrap();
                    c.post_write(11, DST_STAG, BASE, LEN as u32, None).unwrap();
                    c.post_read(12, LOCAL_STAG, BASE, SRC_STAG, BASE, LEN as u32).unwrap();
                }
                Event::Completion(w) => done.push((w.wr_id, w.opcode, w.status)),
                Event::Terminated { .. } | Event::Failed(_) => panic!("iWARP connection failed: {e:?}"),
                _ => {}
            }
        }
        while out.len() < 256 << 10 && c.poll_transmit(&mut out, &m) {}
        let t = host.stack.tcb(h).unwrap();
        if !out.is_empty() {
            let n = t.send(&out).unwrap();
            out.drain(..n);
        }
        if let Some(d) = c.poll_timeout() {
            if now_ms() >= d {
                c.handle_timeout(now_ms());
            }
        }
    }
    done.sort_by_key(|d| d.0);
    assert_eq!(
        done,
        vec![(10, WcOpcode::Send, WcStatus::Success), (11, WcOpcode::RdmaWrite, WcStatus::Success), (12, WcOpcode::RdmaRead, WcStatus::Success)]
    );
    // Close: FIN after everything, wait for the peer's.
    host.stack.tcb(h).unwrap().close();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        host.poll(64).unwrap();
        let t = host.stack.tcb(h).unwrap();
        let _ = t.recv(&mut buf);
        if matches!(t.state(), TcpState::TimeWait | TcpState::Closed) {
            break;
        }
        host.wait(Duration::from_millis(2)).unwrap();
    }
    m
}

fn run(xdp: bool, loss: f64, capture: bool) {
    let bed = Bed::new(1500);
    bed.loss(loss);
    let pcap = format!("/tmp/{}-iwarp.pcapng", bed.b);
    let dumpcap = capture.then(|| bed::Capture::start(&bed, &pcap));
    let (tx, rx) = mpsc::channel();
    let port = 7200;
    let responder = kernel_responder(bed.b.clone(), port, tx);
    rx.recv().unwrap();
    let a = bed.a.clone();
    let initiator = std::thread::spawn(move || {
        netns::enter(&a).unwrap();
        user_initiator(xdp, port)
    });
    let ma = initiator.join().expect("initiator on the userspace TCP");
    let (mb, events) = responder.join().expect("responder on the kernel TCP");
    assert!(ma.regions[&LOCAL_STAG] == pattern(LEN, 0x5a), "RDMA Read data differs");
    assert!(mb.regions[&DST_STAG] == pattern(LEN, 0x22), "RDMA Write data differs");
    assert!(mb.recvs[&1] == pattern(LEN, 0x11), "Send data differs");
    assert!(events.iter().any(|e| matches!(e, Event::Completion(w) if w.opcode == WcOpcode::Recv && w.status == WcStatus::Success && w.byte_len as usize == LEN)), "{events:?}");
    let dropped = bed.dropped();
    eprintln!("iwarp over {} at {loss}% loss: Send, Write, Read of {LEN} B intact; {dropped} frames dropped", if xdp { "xdp" } else { "packet" });
    if loss > 0.0 {
        assert!(dropped > 0);
    }
    if let Some(c) = dumpcap {
        c.stop();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../ci/tshark-check.sh");
        let out = std::process::Command::new("bash").args([script, "-r", &pcap]).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        eprintln!("{}", text.trim());
        assert!(out.status.success(), "Wireshark's iWARP dissectors found problems in {pcap}:\n{text}");
        let _ = std::fs::remove_file(&pcap);
    }
}


#[test]
fn iwarp_over_xdp_to_kernel_tcp_decodes_in_tshark() {
    bed::run_privileged("iwarp_over_xdp_to_kernel_tcp_decodes_in_tshark", || run(true, 0.0, true));
}

#[test]
fn iwarp_over_xdp_to_kernel_tcp_loss_5pct() {
    bed::run_privileged("iwarp_over_xdp_to_kernel_tcp_loss_5pct", || run(true, 5.0, false));
}

#[test]
fn iwarp_over_packet_to_kernel_tcp_loss_1pct() {
    bed::run_privileged("iwarp_over_packet_to_kernel_tcp_loss_1pct", || run(false, 1.0, false));
}
