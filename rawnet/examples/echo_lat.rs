//! Echo round-trip latency across the test bed's veth pair, same run. Clients in namespace a:
//!   kernel  — a kernel TCP socket (non-blocking, busy-polled);
//!   packet  — uiw's userspace TCP on AF_PACKET (busy-polled);
//!   xdp     — uiw's userspace TCP on AF_XDP (busy-polled);
//! each against two echo servers in namespace b: the kernel's TCP (a blocking socket) and
//! uiw's userspace TCP on AF_XDP (busy-polled).
//!
//!   sudo cargo run --release -p uiw-rawnet --example echo_lat [-- ITERATIONS [SIZE [MTU]]]
//!
//! Prints p50/p99/mean per client; then one-way bulk throughput (64 MiB) from each client
//! to a kernel TCP sink in b. MTU is the veth pair's (default 1500; 9000 puts the xdp
//! clients' frames in several UMEM chunks, AF_XDP multi-buffer). Needs root, iproute2,
//! nftables, ethtool.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddrV4, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use uiw_rawnet::testbed::{Bed, B_IP, IF};
use uiw_rawnet::{afpacket::PacketSocket, guard::RstGuard, neigh, netns, xdp::XskSocket, FrameIo, Host, Iface, DEFAULT_PORTS};
use uiw_utcp::{Config, StackConfig, State};

fn report(name: &str, mut v: Vec<Duration>) {
    v.sort();
    let p = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)];
    let mean = v.iter().sum::<Duration>() / v.len() as u32;
    println!("{name:<8} n={:<6} p50 {:>7.2} us  p99 {:>7.2} us  mean {:>7.2} us", v.len(), p(0.5).as_secs_f64() * 1e6, p(0.99).as_secs_f64() * 1e6, mean.as_secs_f64() * 1e6);
}

fn kernel_echo(ns: String, port: u16, conns: usize, ready: mpsc::Sender<()>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        netns::enter(&ns).unwrap();
        let l = TcpListener::bind(SocketAddrV4::new(B_IP, port)).unwrap();
        ready.send(()).unwrap();
        for _ in 0..conns {
            let (mut s, _) = l.accept().unwrap();
            s.set_nodelay(true).unwrap();
            let mut buf = vec![0u8; 65536];
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if s.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                }
            }
        }
    })
}

/// uiw's userspace TCP on AF_XDP in b, echoing every connection to `port` until `stop`.
fn user_echo(ns: String, port: u16, ready: mpsc::Sender<()>, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        netns::enter(&ns).unwrap();
        let iface = Iface::lookup(IF).unwrap();
        let _guard = RstGuard::install(IF, iface.ip, DEFAULT_PORTS).unwrap();
        let io: Box<dyn FrameIo> = Box::new(XskSocket::open(&iface, DEFAULT_PORTS).unwrap());
        let cfg = StackConfig { mac: iface.mac, ip: iface.ip, mtu: io.max_mtu().map_or(iface.mtu, |m| m.min(iface.mtu)), tcp: Config::default(), seed: 0x9e37_79b9 ^ std::process::id() as u64 };
        let mut host = Host::new(cfg, io);
        host.stack.listen(port);
        ready.send(()).unwrap();
        let mut conns = Vec::new();
        let mut buf = vec![0u8; 65536];
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            host.poll(64).unwrap();
            while let Some(h) = host.stack.accept() {
                conns.push(h);
            }
            for &h in &conns {
                let Some(t) = host.stack.tcb(h) else { continue };
                let room = t.send_capacity().min(buf.len());
                let n = t.recv(&mut buf[..room]);
                if n > 0 {
                    let _ = t.send(&buf[..n]);
                }
                if t.at_eof() && t.state() == State::CloseWait {
                    t.close();
                }
            }
        }
    })
}

const BULK: usize = 64 << 20;

/// A kernel TCP sink in b: read BULK bytes per connection, answer one byte.
fn kernel_sink(ns: String, port: u16, conns: usize, ready: mpsc::Sender<()>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        netns::enter(&ns).unwrap();
        let l = TcpListener::bind(SocketAddrV4::new(B_IP, port)).unwrap();
        ready.send(()).unwrap();
        for _ in 0..conns {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = vec![0u8; 1 << 20];
            let mut got = 0;
            while got < BULK {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got += n,
                }
            }
            let _ = s.write_all(&[1]);
        }
    })
}

fn gbps(t: Duration) -> f64 {
    BULK as f64 * 8.0 / t.as_secs_f64() / 1e9
}

fn kernel_bulk(port: u16) -> Duration {
    let mut s = TcpStream::connect(SocketAddrV4::new(B_IP, port)).unwrap();
    let chunk = vec![0x77u8; 1 << 20];
    let t = Instant::now();
    for _ in 0..BULK / chunk.len() {
        s.write_all(&chunk).unwrap();
    }
    let mut b = [0u8; 1];
    s.read_exact(&mut b).unwrap();
    t.elapsed()
}

fn user_bulk(xdp: bool, port: u16, local: u16) -> Duration {
    let iface = Iface::lookup(IF).unwrap();
    let _guard = RstGuard::install(IF, iface.ip, DEFAULT_PORTS).unwrap();
    let io: Box<dyn FrameIo> = if xdp {
        Box::new(XskSocket::open(&iface, DEFAULT_PORTS).unwrap())
    } else {
        Box::new(PacketSocket::open(&iface, DEFAULT_PORTS).unwrap())
    };
    let cfg = StackConfig { mac: iface.mac, ip: iface.ip, mtu: io.max_mtu().map_or(iface.mtu, |m| m.min(iface.mtu)), tcp: Config { send_buf: 4 << 20, ..Config::default() }, seed: local as u64 * 31 };
    let mut host = Host::new(cfg, io);
    host.stack.set_neighbour(B_IP, neigh::resolve(B_IP, Duration::from_secs(5)).unwrap());
    let h = host.stack.connect(local, SocketAddrV4::new(B_IP, port));
    while host.stack.tcb(h).unwrap().state() != State::Established {
        host.poll(64).unwrap();
    }
    let chunk = vec![0x77u8; 1 << 20];
    let t = Instant::now();
    let mut sent = 0;
    let mut b = [0u8; 1];
    loop {
        host.poll(256).unwrap();
        let tcb = host.stack.tcb(h).unwrap();
        if sent < BULK {
            let n = tcb.send(&chunk[..(BULK - sent).min(chunk.len())]).unwrap();
            sent += n;
        }
        if tcb.recv(&mut b) == 1 {
            break;
        }
    }
    let d = t.elapsed();
    host.stack.tcb(h).unwrap().close();
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(200) {
        host.poll(64).unwrap();
    }
    d
}

fn kernel_client(port: u16, iters: usize, size: usize) -> Vec<Duration> {
    let mut s = TcpStream::connect(SocketAddrV4::new(B_IP, port)).unwrap();
    s.set_nodelay(true).unwrap();
    s.set_nonblocking(true).unwrap();
    let msg = vec![0x5au8; size];
    let mut buf = vec![0u8; size];
    let mut v = Vec::with_capacity(iters);
    for k in 0..iters + 100 {
        let t = Instant::now();
        s.write_all(&msg).unwrap();
        let mut got = 0;
        while got < size {
            match s.read(&mut buf[got..]) {
                Ok(0) => panic!("closed"),
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
        if k >= 100 {
            v.push(t.elapsed());
        }
    }
    v
}

fn user_client(xdp: bool, port: u16, local: u16, iters: usize, size: usize) -> (Vec<Duration>, &'static str) {
    let iface = Iface::lookup(IF).unwrap();
    let _guard = RstGuard::install(IF, iface.ip, DEFAULT_PORTS).unwrap();
    let io: Box<dyn FrameIo> = if xdp {
        Box::new(XskSocket::open(&iface, DEFAULT_PORTS).unwrap())
    } else {
        Box::new(PacketSocket::open(&iface, DEFAULT_PORTS).unwrap())
    };
    let kind = io.kind();
    let seed = Instant::now().elapsed().as_nanos() as u64 ^ std::process::id() as u64;
    let cfg = StackConfig { mac: iface.mac, ip: iface.ip, mtu: io.max_mtu().map_or(iface.mtu, |m| m.min(iface.mtu)), tcp: Config::default(), seed };
    let mut host = Host::new(cfg, io);
    host.stack.set_neighbour(B_IP, neigh::resolve(B_IP, Duration::from_secs(5)).unwrap());
    let h = host.stack.connect(local, SocketAddrV4::new(B_IP, port));
    while host.stack.tcb(h).unwrap().state() != State::Established {
        host.poll(64).unwrap();
    }
    let msg = vec![0x5au8; size];
    let mut buf = vec![0u8; size];
    let mut v = Vec::with_capacity(iters);
    for k in 0..iters + 100 {
        let t = Instant::now();
        assert_eq!(host.stack.tcb(h).unwrap().send(&msg), Ok(size));
        let mut got = 0;
        while got < size {
            host.poll(64).unwrap();
            got += host.stack.tcb(h).unwrap().recv(&mut buf[got..]);
        }
        if k >= 100 {
            v.push(t.elapsed());
        }
    }
    host.stack.tcb(h).unwrap().close();
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(200) && !matches!(host.stack.tcb(h).unwrap().state(), State::TimeWait | State::Closed) {
        host.poll(64).unwrap();
    }
    (v, kind)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let iters: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let size: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(64);
    let mtu: u32 = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(1500);
    let bed = Bed::new(mtu);
    let (tx, rx) = mpsc::channel();
    let server = kernel_echo(bed.b.clone(), 7100, 3, tx.clone());
    let sink = kernel_sink(bed.b.clone(), 7101, 3, tx.clone());
    rx.recv().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let userver = user_echo(bed.b.clone(), DEFAULT_PORTS.0 + 100, tx, stop.clone());
    rx.recv().unwrap();
    rx.recv().unwrap();
    let a = bed.a.clone();
    let stop2 = stop.clone();
    let client = std::thread::spawn(move || {
        netns::enter(&a).unwrap();
        println!("echo round trip, {size} B messages, {iters} iterations, across a veth pair");
        let mut kinds = Vec::new();
        for (server, port) in [("kernel", 7100), ("uiw xdp", DEFAULT_PORTS.0 + 100)] {
            println!("server in b: {server}");
            report("kernel", kernel_client(port, iters, size));
            let (v, kind) = user_client(false, port, DEFAULT_PORTS.0 + 10 + port % 7, iters, size);
            report("packet", v);
            let (v, kind2) = user_client(true, port, DEFAULT_PORTS.0 + 20 + port % 7, iters, size);
            report("xdp", v);
            kinds = vec![kind, kind2];
        }
        println!("(client drivers: {})", kinds.join(", "));
        stop2.store(true, std::sync::atomic::Ordering::Relaxed); // free b's spinning core
        println!("bulk, {} MiB one way to a kernel TCP sink in b (MTU {mtu}):", BULK >> 20);
        println!("kernel   {:>6.2} Gbit/s", gbps(kernel_bulk(7101)));
        println!("packet   {:>6.2} Gbit/s", gbps(user_bulk(false, 7101, DEFAULT_PORTS.0 + 40)));
        println!("xdp      {:>6.2} Gbit/s", gbps(user_bulk(true, 7101, DEFAULT_PORTS.0 + 41)));
    });
    client.join().unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    server.join().unwrap();
    sink.join().unwrap();
    userver.join().unwrap();
}
