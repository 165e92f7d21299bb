//! Who turns the userspace TCP (issue 12's polling model), against the kernel's TCP across
//! the namespaces. Needs root.
//!
//! - A driven transport (`Transport::open_driven`, what the provider opens) starts no thread:
//!   the caller's event loop waits on its socket and timer. A thread that only ever calls
//!   `try_write`/`try_read` (as an application thread polling its CQ does) connects, sends
//!   and receives with nobody else turning the stack: it reads the rings itself.
//! - A transport with its own progress thread that sits idle takes no wake-ups: the thread
//!   sleeps in epoll with no timeout (deadlines are a timerfd's), not in 10 ms naps.
//!
//! The tests count threads and context switches of this process, so they run one at a time.

use std::io;
use std::net::SocketAddrV4;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use uiw_rawnet::probe::Kind;
use uiw_rawnet::stream::Transport;
use uiw_rawnet::testbed::{self as bed, Bed, B_IP, IF};
use uiw_rawnet::{netns, DEFAULT_PORTS};
use uiw_utcp::Config;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// This process's thread ids.
fn tasks() -> Vec<u32> {
    let mut v: Vec<u32> = std::fs::read_dir("/proc/self/task").unwrap().filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    v.sort();
    v
}

/// Voluntary plus involuntary context switches of thread `tid` of this process.
fn switches(tid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
    s.lines().filter(|l| l.contains("ctxt_switches:")).map(|l| l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap()).sum()
}

fn driven_polling_thread(kind: Kind) {
    let bed = Bed::new(1500);
    let server = bed::kernel_echo_server(&bed.b, SocketAddrV4::new(B_IP, 7400));
    netns::enter(&bed.a).unwrap();
    let before = tasks();
    let t = Transport::open_driven(IF, kind, DEFAULT_PORTS, Config::default()).unwrap();
    assert_eq!(tasks(), before, "{}: opening a driven transport started a thread", t.kind());
    let mut s = t.connect_start(SocketAddrV4::new(B_IP, 7400), Duration::from_secs(5)).unwrap();
    let data: Vec<u8> = (0..200_000u32).map(|i| (i.wrapping_mul(2654435761) >> 11) as u8).collect();
    let (mut sent, mut back) = (0, Vec::new());
    let mut buf = vec![0u8; 9000];
    let end = Instant::now() + Duration::from_secs(60);
    // Nobody calls `turn`: every frame in and out is moved by this thread's calls.
    loop {
        assert!(Instant::now() < end, "{}: stalled: {sent} sent, {} back", t.kind(), back.len());
        if sent < data.len() {
            match s.try_write(&data[sent..]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("try_write: {e}"),
            }
            if sent == data.len() {
                s.shutdown_write();
            }
        }
        match s.try_read(&mut buf) {
            Ok(0) => break,
            Ok(n) => back.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("try_read: {e}"),
        }
    }
    assert_eq!(server.join().unwrap(), data.len());
    assert!(back == data, "{}: the echo differs", t.kind());
    assert!(t.rx_frames() > 100, "{}: {} frames received", t.kind(), t.rx_frames());
    // (The echo server's thread has ended since.)
    assert!(tasks().iter().all(|x| before.contains(x)), "{}: a thread appeared", t.kind());
}

#[test]
fn a_driven_xdp_transport_is_turned_by_the_thread_that_polls() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    bed::run_privileged("a_driven_xdp_transport_is_turned_by_the_thread_that_polls", || driven_polling_thread(Kind::Xdp));
}

#[test]
fn a_driven_packet_transport_is_turned_by_the_thread_that_polls() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    bed::run_privileged("a_driven_packet_transport_is_turned_by_the_thread_that_polls", || driven_polling_thread(Kind::Packet));
}

/// An idle transport's progress thread sleeps: over half a second, a few context switches
/// at most (the 10 ms naps it took before were 50).
#[test]
fn an_idle_transport_takes_no_wakeups() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    bed::run_privileged("an_idle_transport_takes_no_wakeups", || {
        let bed = Bed::new(1500);
        netns::enter(&bed.a).unwrap();
        let before = tasks();
        let t = Transport::open(IF, Kind::Xdp, DEFAULT_PORTS, Config::default()).unwrap();
        let new: Vec<u32> = tasks().into_iter().filter(|x| !before.contains(x)).collect();
        assert_eq!(new.len(), 1, "one progress thread: {new:?}");
        let tid = new[0];
        // Let it settle into its sleep.
        std::thread::sleep(Duration::from_millis(100));
        let s0 = switches(tid);
        std::thread::sleep(Duration::from_millis(500));
        let woke = switches(tid) - s0;
        assert!(woke <= 3, "{}: the idle progress thread was switched {woke} times in 500 ms", t.kind());
    });
}
