//! The non-blocking use of a `Transport` (`uiw_rawnet::nonblock`, what the provider's progress
//! thread drives): readiness eventfds under edge-triggered epoll, against the kernel's TCP
//! across the namespaces with 1 % loss. A raw-transport echo server that only ever calls
//! `try_accept`/`try_read`/`try_write` after its descriptor fired, and a raw client opened
//! with `connect_start` that writes before the handshake completes. A lost wake-up hangs the
//! exchange, which the watchdog turns into a failure. Needs root.

use std::io::{self, Read, Write};
use std::net::{SocketAddrV4, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

use uiw_kabi::sys::{Epoll, EPOLL_IN, EPOLL_SOCKET_EDGE};
use uiw_rawnet::probe::Kind;
use uiw_rawnet::stream::{RawStream, Transport};
use uiw_rawnet::testbed::{self as bed, Bed, A_IP, B_IP, IF};
use uiw_rawnet::{netns, DEFAULT_PORTS};
use uiw_utcp::Config;

const LEN: usize = 300 << 10;

/// Buffers much smaller than the data: the reader waits for more, and the writer for room,
/// many times over.
fn small() -> Config {
    Config { recv_buf: 32 << 10, send_buf: 32 << 10, ..Config::default() }
}

fn data() -> Vec<u8> {
    (0..LEN).map(|i| (i.wrapping_mul(40503) >> 7) as u8).collect()
}

/// Waits for the next edge of anything in `ep` (bounded: a lost wake-up is a failure).
fn wait(ep: &Epoll) {
    let mut evs = Vec::with_capacity(4);
    ep.wait(&mut evs, 20_000).unwrap();
    assert!(!evs.is_empty(), "no readiness within 20 s: a lost wake-up");
}

/// Reads to the end of the stream, waiting for the edge after every short read.
fn read_all(s: &mut RawStream, ep: &Epoll) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 7000];
    loop {
        match s.try_read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait(ep),
            Err(e) => panic!("try_read: {e}"),
        }
    }
}

fn write_all(s: &mut RawStream, ep: &Epoll, mut d: &[u8]) {
    while !d.is_empty() {
        match s.try_write(&d[..d.len().min(50_000)]) {
            Ok(n) => d = &d[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait(ep),
            Err(e) => panic!("try_write: {e}"),
        }
    }
}

fn passive(kind: Kind) {
    let bed = Bed::new(1500);
    bed.loss(1.0);
    let a = bed.a.clone();
    let (tx, rx) = mpsc::channel();
    let server = std::thread::spawn(move || {
        netns::enter(&a).unwrap();
        let t = Transport::open(IF, kind, DEFAULT_PORTS, small()).unwrap();
        let l = t.listen_nonblocking(DEFAULT_PORTS.0 + 70).unwrap();
        let lep = Epoll::new().unwrap();
        lep.add(l.fd(), 1, EPOLL_IN).unwrap();
        tx.send(()).unwrap();
        let mut s = loop {
            match l.try_accept() {
                Ok(s) => break s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait(&lep),
                Err(e) => panic!("try_accept: {e}"),
            }
        };
        let ep = Epoll::new().unwrap();
        ep.add(s.fd().expect("a non-blocking stream has a readiness fd"), 2, EPOLL_SOCKET_EDGE).unwrap();
        assert_eq!(s.peer().map(|p| *p.ip()), Some(B_IP));
        let got = read_all(&mut s, &ep);
        // The turns that fed the stream said so (`take_readable`): a thread that turns the
        // stack can serve the streams it fed before it reports its own (the provider does).
        let mut fed = Vec::new();
        t.take_readable(&mut fed);
        assert!(fed.contains(&s.fd().unwrap()), "the stream's arrivals were never reported readable: {fed:?}");
        write_all(&mut s, &ep, &got);
        s.linger(Duration::from_secs(60)).unwrap();
        got.len()
    });
    rx.recv().unwrap();
    netns::enter(&bed.b).unwrap();
    let mut s = TcpStream::connect_timeout(&SocketAddrV4::new(A_IP, DEFAULT_PORTS.0 + 70).into(), Duration::from_secs(10)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let d = data();
    s.write_all(&d).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut back = Vec::new();
    s.read_to_end(&mut back).unwrap();
    assert_eq!(server.join().unwrap(), LEN);
    assert!(back == d, "echo differs ({} bytes back)", back.len());
}

fn active(kind: Kind) {
    let bed = Bed::new(1500);
    bed.loss(1.0);
    let server = bed::kernel_echo_server(&bed.b, SocketAddrV4::new(B_IP, 7301));
    netns::enter(&bed.a).unwrap();
    let t = Transport::open(IF, kind, DEFAULT_PORTS, small()).unwrap();
    let mut s = t.connect_start(SocketAddrV4::new(B_IP, 7301), Duration::from_secs(5)).unwrap();
    let ep = Epoll::new().unwrap();
    ep.add(s.fd().unwrap(), 1, EPOLL_SOCKET_EDGE).unwrap();
    let d = data();
    // The first bytes go in while the handshake may still be under way.
    write_all(&mut s, &ep, &d);
    s.shutdown_write();
    let back = read_all(&mut s, &ep);
    assert_eq!(server.join().unwrap(), LEN);
    assert!(back == d, "echo differs ({} bytes back)", back.len());
}

#[test]
fn nonblocking_xdp_stream_accepts_from_kernel() {
    bed::run_privileged("nonblocking_xdp_stream_accepts_from_kernel", || passive(Kind::Xdp));
}

#[test]
fn nonblocking_packet_stream_accepts_from_kernel() {
    bed::run_privileged("nonblocking_packet_stream_accepts_from_kernel", || passive(Kind::Packet));
}

#[test]
fn nonblocking_xdp_stream_connects_to_kernel() {
    bed::run_privileged("nonblocking_xdp_stream_connects_to_kernel", || active(Kind::Xdp));
}

/// A turn by a thread that serves a stream itself (`turn_serving`: the provider's progress
/// thread) hands the stream's news over instead of signalling its eventfd — no eventfd write,
/// and no second wake-up to find it — and the exchange still completes.
fn served_by_the_turner(kind: Kind) {
    let bed = Bed::new(1500);
    let server = bed::kernel_echo_server(&bed.b, SocketAddrV4::new(B_IP, 7302));
    netns::enter(&bed.a).unwrap();
    let t = Transport::open_driven(IF, kind, DEFAULT_PORTS, Config::default()).unwrap();
    let mut s = t.connect_start(SocketAddrV4::new(B_IP, 7302), Duration::from_secs(5)).unwrap();
    let sfd = s.fd().unwrap();
    let ev = Epoll::new().unwrap();
    ev.add(sfd, 1, EPOLL_SOCKET_EDGE).unwrap();
    let turns = Epoll::new().unwrap();
    for fd in t.fds() {
        turns.add(fd, 2, EPOLL_IN).unwrap();
    }
    let d: Vec<u8> = data()[..100_000].to_vec();
    let (mut sent, mut back, mut handed) = (0, Vec::new(), 0);
    let mut buf = vec![0u8; 9000];
    let mut evs = Vec::with_capacity(4);
    let end = std::time::Instant::now() + Duration::from_secs(60);
    while back.len() < d.len() {
        assert!(std::time::Instant::now() < end, "{}: stalled: {sent} sent, {} back", t.kind(), back.len());
        if sent < d.len() {
            match s.try_write(&d[sent..]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("try_write: {e}"),
            }
            if sent == d.len() {
                // The echo server answers once it has read to the end.
                s.shutdown_write();
            }
        }
        loop {
            match s.try_read(&mut buf) {
                Ok(0) => break,
                Ok(n) => back.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("try_read: {e}"),
            }
        }
        // The calls above turn the stack themselves and signal as ever: forget their edges.
        evs.clear();
        ev.wait(&mut evs, 0).unwrap();
        // Then wait for frames or a deadline and turn the stack as the progress thread does.
        evs.clear();
        turns.wait(&mut evs, 100).unwrap();
        let mut served = Vec::new();
        t.turn_serving(&|fd| fd == sfd, &mut served);
        evs.clear();
        ev.wait(&mut evs, 0).unwrap();
        assert!(evs.is_empty(), "{}: a turn that serves the stream itself signalled its eventfd", t.kind());
        handed += served.iter().filter(|&&f| f == sfd).count();
    }
    assert!(back == d, "echo differs ({} bytes back)", back.len());
    assert!(handed > 0, "{}: no turn handed the stream's news over", t.kind());
    assert_eq!(server.join().unwrap(), d.len());
}

#[test]
fn a_turn_that_serves_the_stream_signals_nothing_xdp() {
    bed::run_privileged("a_turn_that_serves_the_stream_signals_nothing_xdp", || served_by_the_turner(Kind::Xdp));
}
