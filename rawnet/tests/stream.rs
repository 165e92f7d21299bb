//! `Transport`/`RawStream`: the userspace TCP behind `std::io::Read`/`Write`, with its
//! progress thread, against the kernel's TCP across the namespaces (both directions of
//! connection set-up, 1 MiB each way under 1 % loss). Needs root.

use std::io::{Read, Write};
use std::net::{SocketAddrV4, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

use uiw_rawnet::probe::Kind;
use uiw_rawnet::stream::Transport;
use uiw_rawnet::testbed::{self as bed, Bed, A_IP, B_IP, IF};
use uiw_rawnet::{netns, DEFAULT_PORTS};
use uiw_utcp::Config;

const LEN: usize = 1 << 20;

fn data() -> Vec<u8> {
    (0..LEN).map(|i| (i.wrapping_mul(40503) >> 7) as u8).collect()
}

fn active(kind: Kind) {
    let bed = Bed::new(1500);
    bed.loss(1.0);
    let server = bed::kernel_echo_server(&bed.b, SocketAddrV4::new(B_IP, 7300));
    netns::enter(&bed.a).unwrap();
    let t = Transport::open(IF, kind, DEFAULT_PORTS, Config::default()).unwrap();
    let mut s = t.connect(DEFAULT_PORTS.0 + 50, SocketAddrV4::new(B_IP, 7300), Duration::from_secs(10)).unwrap();
    s.set_timeout(Some(Duration::from_secs(60)));
    let d = data();
    s.write_all(&d).unwrap();
    s.shutdown_write();
    let mut back = Vec::new();
    s.read_to_end(&mut back).unwrap();
    assert_eq!(server.join().unwrap(), LEN);
    assert!(back == d, "echo differs ({} bytes back)", back.len());
    eprintln!("{}: {LEN} B each way via Read/Write, {} frames dropped", t.kind(), bed.dropped());
}

fn passive(kind: Kind) {
    let bed = Bed::new(1500);
    bed.loss(1.0);
    let a = bed.a.clone();
    let (tx, rx) = mpsc::channel();
    let server = std::thread::spawn(move || {
        netns::enter(&a).unwrap();
        let t = Transport::open(IF, kind, DEFAULT_PORTS, Config::default()).unwrap();
        t.listen(DEFAULT_PORTS.0 + 60);
        tx.send(()).unwrap();
        let mut s = t.accept(Duration::from_secs(20)).unwrap();
        s.set_timeout(Some(Duration::from_secs(60)));
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        s.write_all(&got).unwrap();
        // Every byte and the FIN acknowledged before the transport goes away.
        s.linger(Duration::from_secs(60)).unwrap();
        got.len()
    });
    rx.recv().unwrap();
    netns::enter(&bed.b).unwrap();
    let mut s = TcpStream::connect_timeout(&SocketAddrV4::new(A_IP, DEFAULT_PORTS.0 + 60).into(), Duration::from_secs(10)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let d = data();
    s.write_all(&d).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut back = Vec::new();
    s.read_to_end(&mut back).unwrap();
    assert_eq!(server.join().unwrap(), LEN);
    assert!(back == d, "echo differs ({} bytes back)", back.len());
}

#[test]
fn xdp_stream_connects_to_kernel() {
    bed::run_privileged("xdp_stream_connects_to_kernel", || active(Kind::Xdp));
}

#[test]
fn packet_stream_connects_to_kernel() {
    bed::run_privileged("packet_stream_connects_to_kernel", || active(Kind::Packet));
}

#[test]
fn kernel_connects_to_xdp_stream() {
    bed::run_privileged("kernel_connects_to_xdp_stream", || passive(Kind::Xdp));
}
