//! The data path driven through the transport seam with no socket: two `DataPath`s joined by
//! an in-memory stream (`transport::memory`) that moves at most a few bytes per call, so
//! that MPA negotiation, a Send, an RDMA Write and an RDMA Read cross every kind of byte
//! boundary (inside headers, inside payload placed in place, inside trailers), with MPA CRC
//! off and on (RFC 5044 §6: then checksummed in place on both sides, and a byte corrupted in
//! flight fails the stream instead of completing).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use uiw_wire::conn::{Connection, Role};
use uiw_wire::rdmap::Terminate;
use uiw_wire::segment::parse_fpdu;
use uiw_wire::TermCode;

use super::testkit::{cq, Arena, BASE};
use super::{DataPath, Env, Fatal, Holder, Link};
use crate::engine::access;
use crate::engine::cq::{wc_opcode, wc_status, Completion, CqObj};
use crate::engine::mr::{Mr, MrTable};
use crate::engine::transport::{config, memory, Pending, Stream};
use crate::engine::transport::memory::Tap;
use crate::engine::wr::{opcode, send_flags, Payload, RecvWqe, SendWqe, Sge};

const ARENA: usize = 64 << 10;

thread_local! {
    /// What `Env::poller_clock` says in this test's thread (both sides): `None`, no thread
    /// polls the send CQs.
    static POLLER_CLOCK: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

fn poller_clock(_: &CqObj) -> Option<u64> {
    POLLER_CLOCK.with(|c| c.get())
}

fn set_poller_clock(t: Option<u64>) {
    POLLER_CLOCK.with(|c| c.set(t));
}

thread_local! {
    /// How many times a side that tells its holder heard `Holder::still_sending`.
    static STILL_SENDING: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The holder of a side that has one (`Side::holder`): counts what the data path tells it.
struct CountingHolder;

impl Holder for CountingHolder {
    fn still_sending(&self) {
        STILL_SENDING.with(|c| c.set(c.get() + 1));
    }
}

fn still_sending_heard() -> usize {
    STILL_SENDING.with(|c| c.replace(0))
}

/// One side: its data path, its regions, its CQs.
struct Side {
    dp: DataPath,
    mrs: MrTable,
    mr: Arc<Mr>,
    scq: CqObj,
    rcq: CqObj,
    /// The QP's `qp_access_flags`.
    qp_access: u32,
    /// Whether the data path tells a holder ([`CountingHolder`]).
    holder: bool,
}

const PD: u32 = 1;

impl Side {
    fn new(addr: u64, len: u64) -> Side {
        let mrs = MrTable::new(16);
        let mr = mrs.register(PD, addr, len, addr, access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ).unwrap();
        Side { dp: DataPath::default(), mrs, mr, scq: cq(), rcq: cq(), qp_access: access::REMOTE_WRITE | access::REMOTE_READ, holder: false }
    }

    /// Runs `f` on the data path with its environment (borrowed apart from it).
    fn with<R>(&mut self, mem: &Arena, f: impl FnOnce(&mut DataPath, &Env) -> R) -> R {
        self.with_cqs(mem, false, f)
    }

    /// [`Side::with`]; `shared`: the send CQ takes the receive completions too (one CQ for
    /// both queues).
    fn with_cqs<R>(&mut self, mem: &Arena, shared: bool, f: impl FnOnce(&mut DataPath, &Env) -> R) -> R {
        let Side { dp, mrs, scq, rcq, qp_access, holder, .. } = self;
        let env = Env {
            qpn: 0x1001,
            pd: PD,
            sq_sig_all: false,
            qp_access: *qp_access,
            mrs,
            user_mem: mem,
            send_cq: scq,
            recv_cq: if shared { &*scq } else { &*rcq },
            srq: None,
            poller_clock,
            poller_now: Default::default(),
            holder: holder.then_some(&CountingHolder as &dyn Holder),
        };
        f(dp, &env)
    }

    fn pump(&mut self, mem: &Arena) {
        assert_eq!(self.try_pump(mem), None, "the data path failed");
    }

    fn try_pump(&mut self, mem: &Arena) -> Option<Fatal> {
        self.with(mem, |dp, env| dp.pump(env)).1
    }

    fn crc(&self) -> bool {
        self.dp.link.as_ref().expect("connected").conn.crc()
    }

    fn post_send(&mut self, mem: &Arena, wqe: SendWqe) {
        let r = self.with(mem, |dp, env| dp.post_send(env, wqe, 16, true));
        assert_eq!(r.unwrap(), None);
    }

    fn completions(q: &CqObj) -> Vec<Completion> {
        let mut v = Vec::new();
        while let Some(c) = q.lock_q().pop() {
            v.push(c);
        }
        v
    }
}

/// Who asks for MPA CRC (RFC 5044 §7.1: the C bit; if either side sets it, both use CRC).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Crc {
    Off,
    Initiator,
    Responder,
}

/// Negotiates MPA between an initiator `a` and a responder `b` over `max_io`-byte pieces;
/// returns the wire from `a` to `b` and from `b` to `a`, and the MSS `a`'s stream reports.
fn connect(mem: &Arena, a: &mut Side, b: &mut Side, max_io: usize, crc: Crc) -> (Tap, Tap, Arc<AtomicUsize>) {
    let (sa, sb) = memory::pair(max_io, 4096);
    let taps = (sa.tap(), sb.tap(), sa.mss_knob());
    let mut ca = config(Role::Initiator, 4, 4, b"hello".to_vec(), sa.mss());
    ca.first_fpdu_hold_ms = 0;
    ca.crc = crc == Crc::Initiator;
    a.dp.link = Some(Link::new(Connection::new(ca, 0), Box::new(sa)));
    let mut cb = config(Role::Responder, 0, 0, Vec::new(), sb.mss());
    cb.crc = crc == Crc::Responder;
    let mut pending = Pending::new(Connection::new(cb, 0), Box::new(sb));
    let mut request = None;
    for _ in 0..10_000 {
        a.pump(mem);
        match pending.read_request() {
            None => continue,
            Some(r) => {
                request = Some(r.expect("the MPA Request must parse"));
                break;
            }
        }
    }
    let request = request.expect("the MPA Request never arrived");
    assert_eq!(request.private_data, b"hello");
    pending.conn.accept(4, 4, b"welcome", 0).expect("accept");
    b.dp.link = Some(Link::new(pending.conn, pending.stream));
    for _ in 0..10_000 {
        b.pump(mem);
        a.pump(mem);
        if a.dp.established() && b.dp.established() {
            assert_eq!((a.crc(), b.crc()), (crc != Crc::Off, crc != Crc::Off), "CRC negotiated with {crc:?} asking");
            return taps;
        }
    }
    panic!("MPA negotiation did not finish over {max_io}-byte pieces");
}

/// The two halves of one arena as A's and B's regions, connected over `max_io`-byte pieces
/// (`crc`: who asks for MPA CRC):
/// the arena, both sides, and where each side's region starts.
fn connected_pair(max_io: usize, crc: Crc) -> (Arena, Side, Side, u64, u64) {
    let mem = Arena::new(ARENA);
    let (a_addr, b_addr) = (BASE, BASE + (ARENA / 2) as u64);
    let half = (ARENA / 2) as u64;
    let mut a = Side::new(a_addr, half);
    let mut b = Side::new(b_addr, half);
    connect(&mem, &mut a, &mut b, max_io, crc);
    (mem, a, b, a_addr, b_addr)
}

/// Pumps both sides until `done` holds (both ends run in this thread: no clock, no socket).
fn run(mem: &Arena, a: &mut Side, b: &mut Side, mut done: impl FnMut(&Side, &Side) -> bool) {
    for _ in 0..200_000 {
        a.pump(mem);
        b.pump(mem);
        if done(a, b) {
            return;
        }
    }
    panic!("the transfer did not finish");
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn send_wqe(wr_id: u64, op: u32, sge: Sge, remote_addr: u64, rkey: u32) -> SendWqe {
    SendWqe {
        wr_id,
        opcode: op,
        flags: send_flags::SIGNALED,
        payload: Payload::Sges(smallvec::smallvec![sge]),
        remote_addr,
        rkey,
        imm_or_inv: 0,
        compare_add: 0,
        swap: 0,
    }
}

/// Send, RDMA Write and RDMA Read of `len` bytes (at most 8 KiB) over pieces of at most
/// `max_io` bytes.
fn transfer(max_io: usize, len: usize) {
    transfer_crc(max_io, len, Crc::Off)
}

fn transfer_crc(max_io: usize, len: usize, crc: Crc) {
    let (mem, mut a, mut b, a_addr, b_addr) = connected_pair(max_io, crc);
    let (a_key, b_key) = (a.mr.stag, b.mr.stag);

    // Send: A's bytes at a_addr into B's receive at b_addr.
    let sent = pattern(len, 1);
    mem.set(a_addr, &sent);
    let recv = RecvWqe { wr_id: 7, sges: smallvec::smallvec![Sge { addr: b_addr, length: len as u32 + 16, lkey: b_key }] };
    assert_eq!(b.with(&mem, |dp, env| dp.post_recv(env, recv, false)), None);
    let wqe = send_wqe(1, opcode::SEND, Sge { addr: a_addr, length: len as u32, lkey: a_key }, 0, 0);
    a.post_send(&mem, wqe);
    let (mut got_send, mut got_recv) = (Vec::new(), Vec::new());
    run(&mem, &mut a, &mut b, |a, b| {
        got_send.extend(Side::completions(&a.scq));
        got_recv.extend(Side::completions(&b.rcq));
        !got_send.is_empty() && !got_recv.is_empty()
    });
    assert_eq!((got_send[0].wr_id, got_send[0].status, got_send[0].opcode), (1, wc_status::SUCCESS, wc_opcode::SEND));
    assert_eq!((got_recv[0].wr_id, got_recv[0].status, got_recv[0].byte_len), (7, wc_status::SUCCESS, len as u32));
    assert_eq!(mem.get(b_addr, len), sent, "Send payload over {max_io}-byte pieces");

    // RDMA Write: A's bytes at a_addr+len into B's region at b_addr+8192 (RFC 5040 §4.3).
    let written = pattern(len, 2);
    mem.set(a_addr + len as u64, &written);
    let wqe = send_wqe(2, opcode::RDMA_WRITE, Sge { addr: a_addr + len as u64, length: len as u32, lkey: a_key }, b_addr + 8192, b_key);
    a.post_send(&mem, wqe);
    let mut got = Vec::new();
    run(&mem, &mut a, &mut b, |a, _| {
        got.extend(Side::completions(&a.scq));
        !got.is_empty()
    });
    assert_eq!((got[0].wr_id, got[0].status, got[0].opcode), (2, wc_status::SUCCESS, wc_opcode::RDMA_WRITE));
    // Write completions are local (the bytes left); pump on until they are placed.
    run(&mem, &mut a, &mut b, |_, _| mem.get(b_addr + 8192, len) == written);

    // RDMA Read: B's bytes at b_addr+16384 into A's region at a_addr+16384 (RFC 5040 §4.4).
    let remote = pattern(len, 3);
    mem.set(b_addr + 16384, &remote);
    let wqe = send_wqe(3, opcode::RDMA_READ, Sge { addr: a_addr + 16384, length: len as u32, lkey: a_key }, b_addr + 16384, b_key);
    a.post_send(&mem, wqe);
    let mut got = Vec::new();
    run(&mem, &mut a, &mut b, |a, _| {
        got.extend(Side::completions(&a.scq));
        !got.is_empty()
    });
    assert_eq!((got[0].wr_id, got[0].status, got[0].opcode, got[0].byte_len), (3, wc_status::SUCCESS, wc_opcode::RDMA_READ, len as u32));
    assert_eq!(mem.get(a_addr + 16384, len), remote, "Read Response over {max_io}-byte pieces");
    // With CRC, payload beyond the small-copy size is checksummed where it lies, on both
    // sides (sent from, and received into, registered memory); without, nothing reads it.
    if crc == Crc::Off {
        assert_eq!(mem.checksummed(), 0);
    } else if len > super::TX_COPY_MAX {
        assert!(mem.checksummed() >= 3 * len, "{} bytes checksummed in place for 3 x {len}", mem.checksummed());
    }
}

/// The data path follows the stream's MSS as it changes (a kernel connection's grows as the
/// peer's window opens): after the next quarter MiB sent, the messages it starts use FPDUs of
/// the new size, and they are placed intact.
#[test]
fn fpdus_grow_with_the_stream_mss() {
    let mem = Arena::new(ARENA);
    let (a_addr, b_addr) = (BASE, BASE + (ARENA / 2) as u64);
    let half = (ARENA / 2) as u64;
    let (mut a, mut b) = (Side::new(a_addr, half), Side::new(b_addr, half));
    let (_, _, mss) = connect(&mem, &mut a, &mut b, 4096, Crc::Off);
    let (a_key, b_key) = (a.mr.stag, b.mr.stag);
    const LEN: usize = 16 << 10;
    let fpdus = |a: &Side| a.dp.link.as_ref().unwrap().conn.counters().tx_fpdus;
    let write = |a: &mut Side, b: &mut Side, id: u64| {
        let data = pattern(LEN, id as u8);
        mem.set(a_addr, &data);
        let before = fpdus(a);
        a.post_send(&mem, send_wqe(id, opcode::RDMA_WRITE, Sge { addr: a_addr, length: LEN as u32, lkey: a_key }, b_addr, b_key));
        run(&mem, a, b, |a, _| !Side::completions(&a.scq).is_empty());
        run(&mem, a, b, |_, _| mem.get(b_addr, LEN) == data);
        fpdus(a) - before
    };
    let at = |mss: usize| LEN.div_ceil(uiw_wire::mpa::mulpdu(mss) - 14) as u64;
    assert_eq!(write(&mut a, &mut b, 1), at(1460));
    mss.store(9000, Ordering::Relaxed);
    // Up to a quarter MiB goes before the data path looks again; then the FPDUs grow.
    let mut sizes = Vec::new();
    for id in 2..=20 {
        sizes.push(write(&mut a, &mut b, id));
    }
    assert_eq!(sizes[0], at(1460), "the first Write after the change: not looked at yet");
    assert_eq!(*sizes.last().unwrap(), at(9000), "{sizes:?}");
    assert!(sizes.iter().position(|&n| n == at(9000)).is_some_and(|i| i <= (256 << 10) / LEN), "{sizes:?}");
}

#[test]
fn send_write_read_whole_segments() {
    transfer(64 << 10, 3000);
}

#[test]
fn send_write_read_byte_by_byte() {
    transfer(1, 700);
}

#[test]
fn send_write_read_at_odd_boundaries() {
    for max_io in [3, 7, 13, 61, 577] {
        transfer(max_io, 2049);
    }
}

/// The peer's FIN is acted on by the pump that reads it, with no deadline to wait for: the
/// Send that arrived before it completes first, that pump reports `Fatal::Closed`, and the
/// flushes of the remaining receives come out of the CQ in a poll of their own (an
/// application reaping its last completions in a batch never finds flushes among them).
#[test]
fn peer_fin_fails_the_qp_when_it_is_read() {
    for max_io in [7, 64 << 10] {
        let (mem, mut a, mut b, a_addr, b_addr) = connected_pair(max_io, Crc::Off);
        let (a_key, b_key) = (a.mr.stag, b.mr.stag);
        for wr_id in [7, 8, 9] {
            let recv = RecvWqe { wr_id, sges: smallvec::smallvec![Sge { addr: b_addr, length: 64, lkey: b_key }] };
            assert_eq!(b.with(&mem, |dp, env| dp.post_recv(env, recv, false)), None);
        }
        mem.set(a_addr, b"last");
        a.post_send(&mem, send_wqe(1, opcode::SEND, Sge { addr: a_addr, length: 4, lkey: a_key }, 0, 0));
        // A closes in order: its last bytes, then FIN (what `Net::linger` does).
        let closing = a.with(&mem, |dp, env| dp.shutdown(env, true)).expect("a stream to close");
        let mut stream = closing.stream;
        stream.close_with(&closing.bytes, std::time::Duration::ZERO);

        let mut fatal = None;
        for _ in 0..10_000 {
            let (_, f) = b.with(&mem, |dp, env| dp.pump(env));
            if f.is_some() {
                fatal = f;
                break;
            }
        }
        assert_eq!(fatal, Some(super::Fatal::Closed), "the FIN was read but the QP did not fail (max_io {max_io})");
        // The QP fails: its receives are flushed behind the Send's completion.
        b.with(&mem, |dp, env| dp.shutdown(env, true));
        let mut q = b.rcq.lock_q();
        let first = q.pop_batch(0).expect("the Send's completion");
        assert_eq!((first.wr_id, first.status, first.byte_len), (7, wc_status::SUCCESS, 4));
        assert_eq!(q.pop_batch(1), None, "flushes share no poll with the completions before them");
        let flushed: Vec<(u64, u32)> = std::iter::from_fn(|| q.pop()).map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(flushed, vec![(8, wc_status::WR_FLUSH_ERR), (9, wc_status::WR_FLUSH_ERR)]);
        assert_eq!(mem.get(b_addr, 4), b"last");
    }
}

/// A receive whose region is deregistered after it was posted: the Send that would place
/// bytes into it fails at the receiver as memory that never checked out does
/// (`IBV_WC_LOC_PROT_ERR`, a Terminate to the sender, the QP failed), with nothing written —
/// not a successful completion with the bytes missing.
#[test]
fn a_send_into_a_receive_whose_region_was_deregistered_fails() {
    for max_io in [64 << 10, 7] {
        let (mem, mut a, mut b, a_addr, b_addr) = connected_pair(max_io, Crc::Off);
        let recv_mr = b.mrs.register(PD, b_addr + 4096, 4096, b_addr + 4096, access::LOCAL_WRITE).unwrap();
        let recv = RecvWqe { wr_id: 7, sges: smallvec::smallvec![Sge { addr: b_addr + 4096, length: 4096, lkey: recv_mr.stag }] };
        assert_eq!(b.with(&mem, |dp, env| dp.post_recv(env, recv, false)), None);
        assert!(b.mrs.deregister(recv_mr.stag).is_some());
        drop(recv_mr);

        mem.set(a_addr, &pattern(1000, 5));
        a.post_send(&mem, send_wqe(1, opcode::SEND, Sge { addr: a_addr, length: 1000, lkey: a.mr.stag }, 0, 0));
        let mut b_fatal = None;
        let mut got_recv = Vec::new();
        let mut got_send = Vec::new();
        for _ in 0..200_000 {
            let (_, fa) = a.with(&mem, |dp, env| dp.pump(env));
            got_send.extend(Side::completions(&a.scq));
            if b_fatal.is_none() {
                b_fatal = b.with(&mem, |dp, env| dp.pump(env)).1;
            }
            got_recv.extend(Side::completions(&b.rcq));
            if b_fatal.is_some() && (fa.is_some() || !got_send.is_empty()) {
                break;
            }
        }
        assert!(b_fatal.is_some(), "the receiver's QP did not fail (max_io {max_io})");
        assert_eq!(
            got_recv.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
            vec![(7, wc_status::LOC_PROT_ERR)],
            "the receive must fail, not succeed with nothing placed (max_io {max_io})"
        );
        assert_eq!(mem.get(b_addr + 4096, 1000), vec![0u8; 1000], "nothing may be written into a deregistered region");
    }
}

/// A receive's SGEs are checked as its bytes arrive, as siw's `siw_proc_send` checks them and
/// a NIC reads its receive queue's lkeys: a Send that fits a receive's first SGE lands there
/// and completes, though its second SGE names memory without local write; the next Send, whose
/// bytes reach the second SGE of the next receive, fails there (`IBV_WC_LOC_PROT_ERR`, a
/// Terminate, the QP failed) with nothing written into it.
#[test]
fn a_receives_sges_are_checked_as_its_bytes_arrive() {
    for max_io in [64 << 10, 7] {
        let (mem, mut a, mut b, a_addr, b_addr) = connected_pair(max_io, Crc::Off);
        let read_only = b.mrs.register(PD, b_addr + 8192, 4096, b_addr + 8192, 0).unwrap();
        for (wr_id, at) in [(7, 0), (8, 1024)] {
            let sges = smallvec::smallvec![
                Sge { addr: b_addr + at, length: 100, lkey: b.mr.stag },
                Sge { addr: b_addr + 8192 + at, length: 100, lkey: read_only.stag },
            ];
            assert_eq!(b.with(&mem, |dp, env| dp.post_recv(env, RecvWqe { wr_id, sges }, false)), None);
        }
        mem.set(a_addr, &pattern(150, 3));
        a.post_send(&mem, send_wqe(1, opcode::SEND, Sge { addr: a_addr, length: 50, lkey: a.mr.stag }, 0, 0));
        pump_both(&mem, &mut a, &mut b, 2000);
        let done: Vec<_> = Side::completions(&b.rcq).iter().map(|c| (c.wr_id, c.status, c.byte_len)).collect();
        assert_eq!(done, vec![(7, wc_status::SUCCESS, 50)], "the Send within the first SGE (max_io {max_io})");
        assert_eq!(mem.get(b_addr, 50), pattern(150, 3)[..50], "max_io {max_io}");

        a.post_send(&mem, send_wqe(2, opcode::SEND, Sge { addr: a_addr, length: 150, lkey: a.mr.stag }, 0, 0));
        let mut b_fatal = None;
        let mut got = Vec::new();
        for _ in 0..200_000 {
            a.with(&mem, |dp, env| dp.pump(env));
            if b_fatal.is_none() {
                b_fatal = b.with(&mem, |dp, env| dp.pump(env)).1;
            }
            got.extend(Side::completions(&b.rcq));
            if b_fatal.is_some() {
                break;
            }
        }
        assert_eq!(b_fatal, Some(Fatal::Terminated), "max_io {max_io}");
        assert_eq!(got.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), vec![(8, wc_status::LOC_PROT_ERR)], "max_io {max_io}");
        assert_eq!(mem.get(b_addr + 8192, 4096), vec![0u8; 4096], "nothing written where local write was not granted (max_io {max_io})");
    }
}

/// A small payload is framed in place at the end of the transmit backlog (`Link::push_framed`):
/// a Write whose region was deregistered after it was posted sends nothing of itself (its
/// framing is undone and a Terminate goes out instead), while the Write framed before it in
/// the same run arrives whole.
#[test]
fn a_small_write_whose_region_went_is_undone_behind_the_write_before_it() {
    for crc in [Crc::Off, Crc::Initiator] {
        let (mem, mut a, mut b, a_addr, b_addr) = connected_pair(64 << 10, crc);
        // The general path (`DataPath::post_direct` copies a small payload as it is posted).
        a.dp.general_only = true;
        let gone = a.mrs.register(PD, a_addr + 8192, 64, a_addr + 8192, access::LOCAL_WRITE).unwrap();
        mem.set(a_addr, &pattern(100, 1));
        mem.set(a_addr + 8192, &pattern(64, 2));
        let first = send_wqe(1, opcode::RDMA_WRITE, Sge { addr: a_addr, length: 100, lkey: a.mr.stag }, b_addr, b.mr.stag);
        let second = send_wqe(2, opcode::RDMA_WRITE, Sge { addr: a_addr + 8192, length: 64, lkey: gone.stag }, b_addr + 1000, b.mr.stag);
        // Posted without a doorbell: both are framed by the next pump, into one run.
        a.with(&mem, |dp, env| {
            assert_eq!(dp.post_send(env, first, 16, false).unwrap(), None);
            assert_eq!(dp.post_send(env, second, 16, false).unwrap(), None);
        });
        assert!(a.mrs.deregister(gone.stag).is_some());
        drop(gone);
        let (mut a_fatal, mut b_fatal) = (None, None);
        let mut done = Vec::new();
        for _ in 0..10_000 {
            if a_fatal.is_none() {
                a_fatal = a.try_pump(&mem);
            }
            done.extend(Side::completions(&a.scq));
            if b_fatal.is_none() {
                b_fatal = b.try_pump(&mem);
            }
            if a_fatal.is_some() && b_fatal.is_some() {
                break;
            }
        }
        assert_eq!(a_fatal, Some(Fatal::Terminated), "the requester terminates the stream ({crc:?})");
        assert_eq!(b_fatal, Some(Fatal::Terminated), "the peer gets the Terminate ({crc:?})");
        assert_eq!(mem.get(b_addr, 100), pattern(100, 1), "the Write framed first arrives whole ({crc:?})");
        assert_eq!(mem.get(b_addr + 1000, 64), vec![0u8; 64], "nothing of the second Write goes out ({crc:?})");
        assert_eq!(
            done.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
            vec![(1, wc_status::SUCCESS), (2, wc_status::LOC_PROT_ERR)],
            "the Write from the deregistered region fails, never succeeds ({crc:?})"
        );
    }
}

/// Pumps both sides (B first) until A reports a send completion: A's completions, and the
/// failure A's data path reported first.
fn pump_until_a_completes(mem: &Arena, a: &mut Side, b: &mut Side) -> (Vec<Completion>, Option<Fatal>) {
    let mut done = Vec::new();
    let mut a_fatal = None;
    for _ in 0..100_000 {
        b.pump(mem);
        a_fatal = a_fatal.or(a.try_pump(mem));
        done.extend(Side::completions(&a.scq));
        if !done.is_empty() {
            break;
        }
    }
    (done, a_fatal)
}

/// The local memory an RDMA Read was to land in is deregistered while the Read is outstanding
/// (the application's mistake): the Read Response's bytes are written nowhere, and the Read
/// fails — never a successful completion for data that was not placed.
#[test]
fn a_read_whose_local_region_went_fails() {
    // Staged and byte by byte; a Read Response large enough to be received in place.
    for (max_io, len) in [(64 << 10, 1000), (7, 1000), (64 << 10, 16 << 10)] {
        let (mem, mut a, mut b, a_addr, b_addr) = connected_pair(max_io, Crc::Off);
        let sink = a.mrs.register(PD, a_addr + 8192, 16 << 10, a_addr + 8192, access::LOCAL_WRITE).unwrap();
        mem.set(b_addr, &pattern(len, 3));
        a.post_send(&mem, send_wqe(1, opcode::RDMA_READ, Sge { addr: a_addr + 8192, length: len as u32, lkey: sink.stag }, b_addr, b.mr.stag));
        assert!(a.mrs.deregister(sink.stag).is_some());
        drop(sink);
        let (done, _) = pump_until_a_completes(&mem, &mut a, &mut b);
        assert_eq!(mem.get(a_addr + 8192, len), vec![0u8; len], "nothing may be written into a deregistered region (max_io {max_io}, {len} B)");
        assert_eq!(
            done.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
            vec![(1, wc_status::LOC_PROT_ERR)],
            "the Read fails (max_io {max_io}, {len} B)"
        );
    }
}

/// The same for an atomic (RFC 7306) whose local result buffer was deregistered while it was
/// outstanding: the original value is written nowhere, the atomic fails and the QP with it.
#[test]
fn an_atomic_whose_result_buffer_went_fails() {
    let (mem, mut a, mut b, a_addr, b_addr) = connected_pair(64 << 10, Crc::Off);
    b.qp_access |= access::REMOTE_ATOMIC;
    let target = b.mrs.register(PD, b_addr + 8192, 8, b_addr + 8192, access::LOCAL_WRITE | access::REMOTE_ATOMIC).unwrap();
    mem.set(b_addr + 8192, &7u64.to_ne_bytes());
    let result = a.mrs.register(PD, a_addr + 8192, 8, a_addr + 8192, access::LOCAL_WRITE).unwrap();
    let mut w = send_wqe(1, opcode::ATOMIC_FETCH_AND_ADD, Sge { addr: a_addr + 8192, length: 8, lkey: result.stag }, b_addr + 8192, target.stag);
    w.compare_add = 5;
    a.post_send(&mem, w);
    assert!(a.mrs.deregister(result.stag).is_some());
    drop(result);
    let (done, a_fatal) = pump_until_a_completes(&mem, &mut a, &mut b);
    assert_eq!(mem.get(b_addr + 8192, 8), 12u64.to_ne_bytes(), "the responder did add");
    assert_eq!(mem.get(a_addr + 8192, 8), vec![0u8; 8], "nothing may be written into a deregistered region");
    assert_eq!(done.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), vec![(1, wc_status::LOC_PROT_ERR)]);
    assert_eq!(a_fatal, Some(Fatal::LocalError), "the QP fails with its work request");
}

/// A region of ours is deregistered while a peer's Write into it is arriving (its header was
/// checked, its payload is still coming): nothing more is written into it, and the Write's
/// STag draws a Terminate (RFC 5041 §7.2, Invalid STag) instead of being dropped silently.
#[test]
fn a_write_into_a_region_deregistered_midway_draws_a_terminate() {
    let (mem, mut a, mut b, a_addr, b_addr) = connected_pair(7, Crc::Off);
    let target = b.mrs.register(PD, b_addr + 8192, 16 << 10, b_addr + 8192, access::LOCAL_WRITE | access::REMOTE_WRITE).unwrap();
    mem.set(a_addr, &pattern(16 << 10, 9));
    a.post_send(&mem, send_wqe(1, opcode::RDMA_WRITE, Sge { addr: a_addr, length: 16 << 10, lkey: a.mr.stag }, b_addr + 8192, target.stag));
    // Until the first payload bytes landed.
    for _ in 0..100_000 {
        a.pump(&mem);
        b.pump(&mem);
        if mem.get(b_addr + 8192, 1)[0] != 0 {
            break;
        }
    }
    assert_ne!(mem.get(b_addr + 8192, 1)[0], 0, "the Write began to land");
    assert!(b.mrs.deregister(target.stag).is_some());
    drop(target);
    let written = mem.get(b_addr + 8192, 16 << 10).iter().rposition(|&x| x != 0).unwrap_or(0) + 1;
    // Both pumped on after they failed: the Terminate goes out in 7-byte pieces.
    let (mut a_fatal, mut b_fatal) = (None, None);
    for _ in 0..100_000 {
        a_fatal = a_fatal.or(a.try_pump(&mem));
        b_fatal = b_fatal.or(b.try_pump(&mem));
        if a_fatal.is_some() && b_fatal.is_some() {
            break;
        }
    }
    assert_eq!(b_fatal, Some(Fatal::Terminated), "the target terminates the stream");
    assert_eq!(a_fatal, Some(Fatal::Terminated), "the requester gets the Terminate");
    assert!(written < 16 << 10, "the test deregistered before the end ({written} B)");
    assert_eq!(mem.get(b_addr + 8192 + written as u64, (16 << 10) - written), vec![0u8; (16 << 10) - written], "nothing lands after deregistration");
}

#[test]
fn crc_send_write_read_at_many_piece_sizes() {
    // Lengths around the small-copy and direct-placement sizes (512) and across several
    // FPDUs (the MSS is 1460); pieces from one byte to whole FPDUs.
    for crc in [Crc::Initiator, Crc::Responder] {
        for max_io in [1, 2, 3, 7, 13, 61, 511, 577, 1460, 4096, 64 << 10] {
            for len in [1, 100, 512, 513, 2049, 8192] {
                if max_io < 7 && len > 2049 {
                    continue; // byte by byte, 8 KiB adds time and no new boundary
                }
                transfer_crc(max_io, len, crc);
            }
        }
    }
}

/// A payload byte corrupted in flight under CRC: the receiver places what arrived but
/// completes nothing as success, fails with the MPA CRC error and tells the peer in a
/// Terminate (RFC 5044 §8, RFC 5040 §7.4.1 layer 2 error 0x02).
fn corrupted_in_flight(op: u32, max_io: usize, at: usize) {
    let mem = Arena::new(ARENA);
    let (a_addr, b_addr) = (BASE, BASE + (ARENA / 2) as u64);
    let half = (ARENA / 2) as u64;
    let mut a = Side::new(a_addr, half);
    let mut b = Side::new(b_addr, half);
    let (to_b, to_a, _) = connect(&mem, &mut a, &mut b, max_io, Crc::Initiator);
    let len = 4000;
    mem.set(a_addr, &pattern(len, 5));
    let recv = RecvWqe { wr_id: 7, sges: smallvec::smallvec![Sge { addr: b_addr, length: len as u32, lkey: b.mr.stag }] };
    assert_eq!(b.with(&mem, |dp, env| dp.post_recv(env, recv, false)), None);
    let wqe = send_wqe(1, op, Sge { addr: a_addr, length: len as u32, lkey: a.mr.stag }, b_addr + 8192, b.mr.stag);
    a.post_send(&mem, wqe);
    // A fills the wire (4096 bytes at most in flight); the first FPDU is whole there.
    for _ in 0..10_000 {
        a.pump(&mem);
        if to_b.bytes().len() >= 4096 {
            break;
        }
    }
    let wire = to_b.bytes();
    let (first, _) = parse_fpdu(&wire).expect("a whole FPDU in flight");
    assert!(first.crc_ok() && first.crc != 0, "the CRC computed over registered memory in place is right");
    assert!(at > 40 && at < first.payload.len(), "the flip lands in the first FPDU's payload");
    assert!(to_b.flip(at, 0x10));
    let mut fatal = None;
    let mut recvs = Vec::new();
    for _ in 0..200_000 {
        fatal = b.try_pump(&mem);
        recvs.extend(Side::completions(&b.rcq));
        if fatal.is_some() {
            break;
        }
        a.pump(&mem);
    }
    assert_eq!(fatal, Some(Fatal::Terminated), "a CRC error fails the receiver's stream");
    // The QP goes to ERROR: what the core has left to send (its Terminate) goes out, the
    // receive is flushed.
    let closing = b.with(&mem, |dp, env| dp.shutdown(env, true)).expect("a stream to close");
    let mut stream = closing.stream;
    stream.close_with(&closing.bytes, std::time::Duration::from_secs(1));
    recvs.extend(Side::completions(&b.rcq));
    if op == opcode::SEND {
        assert!(recvs.iter().any(|c| c.wr_id == 7), "the receive is completed in error");
    }
    assert!(recvs.iter().all(|c| c.status != wc_status::SUCCESS), "nothing completes as success: {recvs:?}");
    let wire = to_a.bytes();
    let (term, _) = parse_fpdu(&wire).expect("a Terminate on its way to the sender");
    assert!(term.crc_ok());
    let (t, _) = Terminate::parse(term.payload).expect("a Terminate");
    assert_eq!(t.code, TermCode::MPA_CRC);
    let mut fatal = None;
    for _ in 0..10_000 {
        fatal = a.try_pump(&mem);
        if fatal.is_some() {
            break;
        }
    }
    assert_eq!(fatal, Some(Fatal::Terminated), "the sender learns of it");
}

#[test]
fn crc_error_in_a_send_fails_the_stream() {
    for max_io in [64, 577, 4096] {
        for at in [100, 1000] {
            corrupted_in_flight(opcode::SEND, max_io, at);
        }
    }
}

#[test]
fn crc_error_in_a_write_fails_the_stream() {
    for max_io in [64, 577, 4096] {
        for at in [100, 1000] {
            corrupted_in_flight(opcode::RDMA_WRITE, max_io, at);
        }
    }
}

/// A Write bigger than the stream's buffer: the send that finds the buffer full leaves the
/// data path saying so (`tx_blocked`, which a poll of the QP's CQ reads: nothing can be sent
/// until the peer reads, so the poller gives its CPU away, `CqObj::drive`); once the peer
/// has read and the rest has gone, it no longer says so. The room news from the progress
/// thread (`writable`) clears it too.
#[test]
fn a_full_stream_is_reported_until_bytes_go_again() {
    let (mem, mut a, mut b, a_addr, b_addr) = connected_pair(1 << 20, Crc::Off);
    let len = 16 << 10;
    mem.set(a_addr, &pattern(len, 3));
    assert!(!a.dp.tx_blocked(), "an idle stream is not full");
    let wqe = send_wqe(1, opcode::RDMA_WRITE, Sge { addr: a_addr, length: len as u32, lkey: a.mr.stag }, b_addr, b.mr.stag);
    a.post_send(&mem, wqe);
    // The in-memory pipe holds 4 KiB: the doorbell's send filled it.
    assert!(a.dp.tx_blocked(), "the send that found the stream full was not reported");
    a.pump(&mem);
    assert!(a.dp.tx_blocked(), "still full: the peer has not read");
    a.dp.writable();
    assert!(!a.dp.tx_blocked(), "room news clears it");
    a.pump(&mem);
    assert!(a.dp.tx_blocked(), "the retry found it full again");
    let mut done = Vec::new();
    run(&mem, &mut a, &mut b, |a, _| {
        done.extend(Side::completions(&a.scq));
        !done.is_empty()
    });
    assert_eq!(done[0].status, wc_status::SUCCESS);
    assert!(!a.dp.tx_blocked(), "everything went: the stream is not full");
    assert_eq!(mem.get(b_addr, len), pattern(len, 3));
}

/// Send completions keep posting order when one waits for its bytes to leave: a Write whose
/// tail is still queued when the stream fills, then a small Write whose bytes leave together
/// with that tail (its completion is taken after that send, with nothing left queued).
#[test]
fn send_completions_keep_posting_order_across_a_full_stream() {
    let (mem, mut a, mut b, a_addr, b_addr) = connected_pair(1 << 20, Crc::Off);
    let big = 6 << 10;
    mem.set(a_addr, &pattern(big, 5));
    mem.set(a_addr + big as u64, &pattern(8, 9));
    let w = |id, off: usize, len: usize| {
        send_wqe(id, opcode::RDMA_WRITE, Sge { addr: a_addr + off as u64, length: len as u32, lkey: a.mr.stag }, b_addr + off as u64, b.mr.stag)
    };
    let (w1, w2) = (w(1, 0, big), w(2, big, 8));
    a.post_send(&mem, w1);
    assert!(a.dp.tx_blocked(), "the 4 KiB pipe took part of the first Write");
    b.pump(&mem);
    a.post_send(&mem, w2);
    let mut done = Vec::new();
    run(&mem, &mut a, &mut b, |a, _| {
        done.extend(Side::completions(&a.scq));
        done.len() == 2
    });
    assert_eq!(done.iter().map(|c| c.wr_id).collect::<Vec<_>>(), vec![1, 2], "completions out of posting order");
    assert!(done.iter().all(|c| c.status == wc_status::SUCCESS));
    assert_eq!(mem.get(b_addr, big + 8), [pattern(big, 5), pattern(8, 9)].concat());
}

/// Pumps both sides until A's send CQ has a completion; returns the first.
fn next_send_completion(mem: &Arena, a: &mut Side, b: &mut Side) -> Completion {
    let mut got = Vec::new();
    run(mem, a, b, |a, _| {
        got.extend(Side::completions(&a.scq));
        !got.is_empty()
    });
    got[0]
}

/// Pumps both sides `n` times.
fn pump_both(mem: &Arena, a: &mut Side, b: &mut Side, n: usize) {
    for _ in 0..n {
        a.pump(mem);
        b.pump(mem);
    }
}

/// A lone RDMA Write's completion, polled for, waits for the peer's answer (`answer`): placed at
/// the target, it is still not reported; the peer's Send arrives, and the Write's completion
/// comes with it.
#[test]
fn a_lone_writes_completion_waits_for_the_peers_answer() {
    let (mem, mut a, mut b, a_addr, b_addr) = connected_pair(4096, Crc::Off);
    let (a_key, b_key) = (a.mr.stag, b.mr.stag);
    set_poller_clock(Some(1_000));
    let data = pattern(64, 5);
    mem.set(a_addr, &data);
    a.post_send(&mem, send_wqe(1, opcode::RDMA_WRITE, Sge { addr: a_addr, length: 64, lkey: a_key }, b_addr, b_key));
    run(&mem, &mut a, &mut b, |_, _| mem.get(b_addr, 64) == data);
    pump_both(&mem, &mut a, &mut b, 100);
    assert!(Side::completions(&a.scq).is_empty(), "the Write's completion must wait for the answer");
    assert!(a.dp.link.as_ref().unwrap().awaits_answer());
    // The answer: a Send from B into a receive of A's.
    let recv = RecvWqe { wr_id: 9, sges: smallvec::smallvec![Sge { addr: a_addr + 4096, length: 64, lkey: a_key }] };
    assert_eq!(a.with(&mem, |dp, env| dp.post_recv(env, recv, false)), None);
    b.post_send(&mem, send_wqe(2, opcode::SEND, Sge { addr: b_addr + 1024, length: 8, lkey: b_key }, 0, 0));
    let (mut writes, mut recvs) = (Vec::new(), Vec::new());
    run(&mem, &mut a, &mut b, |a, _| {
        recvs.extend(Side::completions(&a.rcq));
        writes.extend(Side::completions(&a.scq));
        !writes.is_empty()
    });
    assert_eq!(recvs.len(), 1, "the answer arrived with (or before) the Write's completion");
    assert_eq!((writes[0].wr_id, writes[0].status, writes[0].opcode), (1, wc_status::SUCCESS, wc_opcode::RDMA_WRITE));
    let l = a.dp.link.as_mut().unwrap();
    assert!(!l.awaits_answer());
    assert!(!l.answer_gave_up());
    set_poller_clock(None);
}

/// Without an answer the completion goes at the bound, the wait reports it gave up (the poller
/// hands the QP back), and the next lone Write does not wait.
#[test]
fn a_wait_without_answer_ends_at_the_bound() {
    let (mem, mut a, mut b, a_addr, b_addr) = connected_pair(4096, Crc::Off);
    let (a_key, b_key) = (a.mr.stag, b.mr.stag);
    set_poller_clock(Some(1_000));
    let write = |id: u64| send_wqe(id, opcode::RDMA_WRITE, Sge { addr: a_addr, length: 32, lkey: a_key }, b_addr, b_key);
    a.post_send(&mem, write(1));
    pump_both(&mem, &mut a, &mut b, 200);
    assert!(Side::completions(&a.scq).is_empty());
    set_poller_clock(Some(1_000 + super::answer::ANSWER_WAIT_US - 1));
    a.pump(&mem);
    assert!(Side::completions(&a.scq).is_empty(), "still within the wait");
    set_poller_clock(Some(1_000 + super::answer::ANSWER_WAIT_US));
    a.pump(&mem);
    let got = Side::completions(&a.scq);
    assert_eq!((got.len(), got[0].wr_id, got[0].status), (1, 1, wc_status::SUCCESS));
    assert!(a.dp.link.as_mut().unwrap().answer_gave_up());
    // The next lone Write's completion is reported as soon as its bytes left.
    a.post_send(&mem, write(2));
    assert_eq!(next_send_completion(&mem, &mut a, &mut b).wr_id, 2);
    set_poller_clock(None);
}

/// Nobody polls (the CQ is armed, or not polled lately): the completion is reported at once;
/// and a completion left waiting when the QP stops reports the Write done, not flushed — its
/// bytes left.
#[test]
fn a_completion_waits_only_for_a_poller_and_survives_shutdown() {
    let (mem, mut a, mut b, a_addr, b_addr) = connected_pair(4096, Crc::Off);
    let (a_key, b_key) = (a.mr.stag, b.mr.stag);
    let write = |id: u64| send_wqe(id, opcode::RDMA_WRITE, Sge { addr: a_addr, length: 32, lkey: a_key }, b_addr, b_key);
    set_poller_clock(None);
    a.post_send(&mem, write(1));
    assert_eq!(next_send_completion(&mem, &mut a, &mut b).wr_id, 1);
    set_poller_clock(Some(5_000));
    a.post_send(&mem, write(2));
    pump_both(&mem, &mut a, &mut b, 200);
    assert!(Side::completions(&a.scq).is_empty());
    // The poller goes away (the CQ is armed): the next pump reports it.
    set_poller_clock(None);
    a.pump(&mem);
    assert_eq!(Side::completions(&a.scq).iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), vec![(2, wc_status::SUCCESS)]);
    set_poller_clock(Some(6_000));
    a.post_send(&mem, write(3));
    pump_both(&mem, &mut a, &mut b, 200);
    assert!(Side::completions(&a.scq).is_empty());
    assert!(a.with(&mem, |dp, env| dp.shutdown(env, true)).is_some());
    assert_eq!(Side::completions(&a.scq).iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), vec![(3, wc_status::SUCCESS)]);
    set_poller_clock(None);
}

/// A batch that alternates engine-owned runs with application memory (an SPDK target's 4 KiB
/// Writes, each with its response Send) empties one run per message: each is kept for the next
/// batch, up to one per `sendmsg` piece and `SPARE_BYTES` in all.
#[test]
fn emptied_transmit_runs_are_kept_for_reuse_within_bounds() {
    use super::{OWN_RUN_MIN, SPARE_BYTES, TX_PIECES, TX_RUN_MAX};
    let (sa, _sb) = memory::pair(4096, 4096);
    let mut l = Link::new(Connection::new(config(Role::Initiator, 4, 4, Vec::new(), sa.mss()), 0), Box::new(sa));
    for _ in 0..TX_PIECES + 10 {
        l.recycle(Vec::with_capacity(OWN_RUN_MIN));
    }
    assert_eq!(l.spare.len(), TX_PIECES, "one spare per piece a sendmsg takes, no more");
    assert_eq!(l.spare_bytes, l.spare.iter().map(Vec::capacity).sum::<usize>());
    let taken: Vec<Vec<u8>> = (0..TX_PIECES).map(|_| l.buffer(OWN_RUN_MIN)).collect();
    assert!(l.spare.is_empty() && l.spare_bytes == 0);
    assert!(taken.iter().all(|v| v.is_empty() && v.capacity() >= OWN_RUN_MIN), "spares come back empty, their capacity kept");
    l.recycle(Vec::with_capacity(TX_RUN_MAX + 1));
    assert!(l.spare.is_empty(), "a buffer larger than a run is let go");
    for _ in 0..4 {
        l.recycle(Vec::with_capacity(TX_RUN_MAX));
    }
    assert!(l.spare_bytes <= SPARE_BYTES, "{} bytes kept", l.spare_bytes);
    assert_eq!(l.spare.len(), SPARE_BYTES / TX_RUN_MAX);
}

/// A pump told that the stream has nothing to read (one `poll` of several QPs' sockets said
/// so, see `CqObj::drive`) makes no `recv`: a Send that is in fact waiting stays unread by it
/// and is taken in, whole, by the next ordinary pump.
#[test]
fn a_pump_told_the_input_is_quiet_reads_nothing() {
    let (mem, mut a, mut b, a_addr, b_addr) = connected_pair(4096, Crc::Off);
    let (a_key, b_key) = (a.mr.stag, b.mr.stag);
    let sent = pattern(64, 5);
    mem.set(a_addr, &sent);
    let recv = RecvWqe { wr_id: 7, sges: smallvec::smallvec![Sge { addr: b_addr, length: 64, lkey: b_key }] };
    assert_eq!(b.with(&mem, |dp, env| dp.post_recv(env, recv, false)), None);
    a.post_send(&mem, send_wqe(1, opcode::SEND, Sge { addr: a_addr, length: 64, lkey: a_key }, 0, 0));
    for _ in 0..10 {
        a.pump(&mem);
    }
    for _ in 0..3 {
        assert_eq!(b.with(&mem, |dp, env| dp.pump_with(env, true)).1, None);
        assert!(Side::completions(&b.rcq).is_empty(), "a quiet pump read the Send");
    }
    b.pump(&mem);
    let got = Side::completions(&b.rcq);
    assert_eq!(got.iter().map(|c| (c.wr_id, c.status, c.byte_len)).collect::<Vec<_>>(), vec![(7, wc_status::SUCCESS, 64)]);
    assert_eq!(mem.get(b_addr, 64), sent);
}

/// A pair joined over `max_io`-byte pieces, with its own arena and the wire from A to B.
fn tapped_pair(max_io: usize, crc: Crc) -> (Arena, Side, Side, Tap) {
    let mem = Arena::new(ARENA);
    let half = (ARENA / 2) as u64;
    // Fixed keys: both pairs' STags, and so their bytes on the wire, are the same.
    let side = |addr: u64| {
        let mrs = MrTable::with_fixed_keys(16, 0x5a);
        let mr = mrs.register(PD, addr, half, addr, access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ).unwrap();
        Side { dp: DataPath::default(), mrs, mr, scq: cq(), rcq: cq(), qp_access: access::REMOTE_WRITE | access::REMOTE_READ, holder: false }
    };
    let (mut a, mut b) = (side(BASE), side(BASE + half));
    let (a_to_b, _, _) = connect(&mem, &mut a, &mut b, max_io, crc);
    (mem, a, b, a_to_b)
}

/// A Send or RDMA Write of one FPDU posted behind nothing outstanding is framed as it is
/// posted (`DataPath::post_direct`): rung on its own on an idle stream, handed to the stream in
/// one call; in a chain, or behind a backlog, queued, and sent at the chain's doorbell. An RDMA
/// Read rung on its own goes through `post_lone_read`, and an FPDU that is all a pump has to
/// send (a small Read's response, a general-path WR's last FPDU) through `send_alone`. Two
/// pairs run one script of chains of
/// one to four WRs, rung by their last WR or by the doorbell alone — Sends (gathered from one
/// or two SGEs, or inline; signaled or not;
/// solicited), Writes and Reads of sizes around `TX_COPY_MAX` and up to two MSS (one FPDU, or
/// more, which the direct path leaves to the general one) — the second pair's QPs taking the
/// general path for every FPDU (`DataPath::general_only`). After every post the same bytes are in
/// flight, and the completions on both sides, the memory and the counters end up the same —
/// over pieces of 1 to 4096 bytes (a frame the stream takes only part of, a backlog behind a
/// full stream), with CRC off and on, with and without a poller that makes a lone Write's
/// completion wait for the peer's answer. Without a poller the completions come at the same
/// moments too; with one, a completion may wait for the answer on one path and not on the
/// other (the direct path reports a Write ahead of the rest of its chain, where the general
/// path reports the chain's completions together): they are compared once no poller holds
/// them back.
#[test]
fn a_direct_message_leaves_as_the_general_path_sends_it() {
    let (mut direct_posts, mut direct_large) = (0, 0);
    for (max_io, crc, polled) in [(4096, Crc::Off, false), (1, Crc::Off, false), (7, Crc::Initiator, false), (64, Crc::Responder, true), (4096, Crc::Initiator, true), (4096, Crc::Off, true), (97, Crc::Off, false)] {
        set_poller_clock(polled.then_some(1_000));
        let (mem1, mut a1, mut b1, tap1) = tapped_pair(max_io, crc);
        let (mem2, mut a2, mut b2, tap2) = tapped_pair(max_io, crc);
        a2.dp.general_only = true;
        b2.dp.general_only = true;
        let (a_key, b_key) = (a1.mr.stag, b1.mr.stag);
        assert_eq!((a_key, b_key), (a2.mr.stag, b2.mr.stag));
        let half = (ARENA / 2) as u64;
        let b_addr = BASE + half;
        let image = pattern(ARENA / 2, 9);
        mem1.set(BASE, &image);
        mem2.set(BASE, &image);
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let settle = |mem: &Arena, a: &mut Side, b: &mut Side| pump_both(mem, a, b, 8 * 4096 / max_io.min(64) + 64);
        let (mut done1, mut done2) = (Vec::new(), Vec::new());
        let (mut i, mut signaled) = (0u64, 0u64);
        while i < 160 {
            // B keeps receives posted for the Sends.
            for (mem, b) in [(&mem1, &mut b1), (&mem2, &mut b2)] {
                while b.dp.rq.len() < 8 {
                    let recv = RecvWqe { wr_id: 1000 + i, sges: smallvec::smallvec![Sge { addr: b_addr, length: 4096, lkey: b_key }] };
                    assert_eq!(b.with(mem, |dp, env| dp.post_recv(env, recv, false)), None);
                }
            }
            let chain = 1 + next(4) * next(2);
            // Most chains ring with their last WR (as `ibv_post_send` rings at the end of its
            // list); some ring later, by the doorbell alone (a doorbell the QP deferred to its
            // poller).
            let rung_alone = next(4) == 0;
            for k in 0..chain {
                let len = match next(6) {
                    0 => 0,
                    1 => super::TX_COPY_MAX as u64 - 2 + next(4),
                    2 => super::TX_COPY_MAX as u64 + next(2 * 1460),
                    _ => next(600),
                } as u32;
                let at = BASE + next(8192);
                let mut wqe = match next(6) {
                    0..=2 => send_wqe(i, opcode::SEND, Sge { addr: at, length: len, lkey: a_key }, 0, 0),
                    3 | 4 => send_wqe(i, opcode::RDMA_WRITE, Sge { addr: at, length: len, lkey: a_key }, b_addr + 4096 + next(4096), b_key),
                    _ => send_wqe(i, opcode::RDMA_READ, Sge { addr: BASE + 16384 + next(4096), length: len.min(1024), lkey: a_key }, b_addr + next(8192), b_key),
                };
                if next(3) == 0 {
                    wqe.flags &= !send_flags::SIGNALED;
                }
                if next(4) == 0 {
                    wqe.flags |= send_flags::SOLICITED;
                }
                if wqe.opcode != opcode::RDMA_READ && len > 1 && next(3) == 0 {
                    // Two SGEs: the payload in two runs.
                    let cut = 1 + next(u64::from(len) - 1) as u32;
                    wqe.payload = Payload::Sges(smallvec::smallvec![
                        Sge { addr: at, length: cut, lkey: a_key },
                        Sge { addr: at + 20_000, length: len - cut, lkey: a_key },
                    ]);
                } else if wqe.opcode == opcode::SEND && len <= 64 && next(2) == 0 {
                    wqe.payload = Payload::Inline(mem1.get(at, len as usize).as_slice().into());
                }
                let large = len as usize > super::TX_COPY_MAX;
                signaled += u64::from(wqe.flags & send_flags::SIGNALED != 0);
                let ring = k + 1 == chain && !rung_alone;
                let before = a1.dp.link.as_ref().unwrap().direct_sent;
                let r1 = a1.with(&mem1, |dp, env| dp.post_send(env, wqe.clone(), 16, ring));
                let r2 = a2.with(&mem2, |dp, env| dp.post_send(env, wqe, 16, ring));
                assert_eq!((r1.unwrap(), r2.unwrap()), (None, None));
                if large && a1.dp.link.as_ref().unwrap().direct_sent > before {
                    direct_large += 1;
                }
                assert_eq!(tap1.bytes(), tap2.bytes(), "{max_io}-byte pieces, {crc:?}: WR {i} (chain of {chain}) put different bytes in flight");
                i += 1;
            }
            if rung_alone {
                assert_eq!(a1.with(&mem1, |dp, env| dp.doorbell(env)), None);
                assert_eq!(a2.with(&mem2, |dp, env| dp.doorbell(env)), None);
                assert_eq!(tap1.bytes(), tap2.bytes(), "{max_io}-byte pieces, {crc:?}: the doorbell after WR {i} put different bytes in flight");
            }
            if next(3) != 0 {
                settle(&mem1, &mut a1, &mut b1);
                settle(&mem2, &mut a2, &mut b2);
            }
            done1.extend(Side::completions(&a1.scq));
            done2.extend(Side::completions(&a2.scq));
            if !polled {
                assert_eq!(done1, done2, "WR {i}: A's send completions");
            }
            assert_eq!(Side::completions(&b1.rcq), Side::completions(&b2.rcq), "WR {i}: B's receive completions");
        }
        set_poller_clock(None);
        settle(&mem1, &mut a1, &mut b1);
        settle(&mem2, &mut a2, &mut b2);
        done1.extend(Side::completions(&a1.scq));
        done2.extend(Side::completions(&a2.scq));
        assert_eq!(done1, done2, "{max_io}-byte pieces, {crc:?}: A's send completions");
        assert_eq!(done1.len() as u64, signaled, "every signaled WR completed");
        assert!(done1.iter().all(|c| c.status == wc_status::SUCCESS));
        assert_eq!(Side::completions(&b1.rcq), Side::completions(&b2.rcq));
        assert_eq!(mem1.get(BASE, ARENA), mem2.get(BASE, ARENA), "{max_io}-byte pieces, {crc:?}: memory differs");
        direct_posts += a1.dp.link.as_ref().unwrap().direct_sent;
        assert_eq!(a2.dp.link.as_ref().unwrap().direct_sent, 0, "the reference never takes the direct path");
        for (x, y) in [(&a1, &a2), (&b1, &b2)] {
            let (cx, cy) = (x.dp.link.as_ref().unwrap(), y.dp.link.as_ref().unwrap());
            assert_eq!(cx.conn.counters(), cy.conn.counters());
            assert!(cx.conn.is_established());
        }
    }
    set_poller_clock(None);
    assert!(direct_posts > 300, "only {direct_posts} WRs took the direct path");
    assert!(direct_large > 20, "only {direct_large} payloads above TX_COPY_MAX took the direct path");
}

/// A small Send or Write rung alone whose SGE does not check out — an unknown lkey, a range
/// past its region, a region of another protection domain, a region deregistered — fails as
/// it would on the general path: `IBV_WC_LOC_PROT_ERR`, the QP failed, nothing on the wire.
/// (The lone path reads such an SGE through the QP's hint, and leaves it to the general path
/// when it does not check out.) A good one, after the same region was hinted, goes out alone.
#[test]
fn a_lone_message_whose_memory_does_not_check_out_fails_as_any() {
    let half = (ARENA / 2) as u32;
    for (case, op) in [0, 1, 2, 3].into_iter().flat_map(|c| [(c, opcode::SEND), (c, opcode::RDMA_WRITE)]) {
        let (mem, mut a, _b, tap) = tapped_pair(4096, Crc::Off);
        let good = Sge { addr: BASE, length: 8, lkey: a.mr.stag };
        let sge = match case {
            0 => Sge { lkey: a.mr.stag ^ 0x100, ..good },
            1 => Sge { addr: BASE + u64::from(half) - 4, ..good },
            2 => {
                let other = a.mrs.register(PD + 1, BASE, 64, BASE, access::LOCAL_WRITE).unwrap();
                Sge { lkey: other.stag, ..good }
            }
            _ => {
                // Hinted first (a good post), then deregistered.
                let r = a.mrs.register(PD, BASE + 64, 64, BASE + 64, access::LOCAL_WRITE).unwrap();
                let ok = a.with(&mem, |dp, env| dp.post_send(env, send_wqe(9, op, Sge { addr: BASE + 64, length: 8, lkey: r.stag }, BASE, 0), 16, true));
                assert_eq!(ok.unwrap(), None, "case {case}: the good post");
                assert_eq!(a.dp.link.as_ref().unwrap().direct_sent, 1, "case {case}: it went alone");
                Side::completions(&a.scq);
                a.mrs.deregister(r.stag);
                Sge { addr: BASE + 64, length: 8, lkey: r.stag }
            }
        };
        let before = tap.bytes().len();
        let r = a.with(&mem, |dp, env| dp.post_send(env, send_wqe(1, op, sge, BASE, 0), 16, true));
        assert_eq!(r.unwrap(), Some(Fatal::LocalError), "case {case}, opcode {op}");
        let done = Side::completions(&a.scq);
        assert_eq!(done.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), vec![(1, wc_status::LOC_PROT_ERR)], "case {case}, opcode {op}");
        assert_eq!(tap.bytes().len(), before, "case {case}, opcode {op}: nothing on the wire");
    }
}

/// A Send's payload lands across the SGEs of the receive it takes, each piece in its own
/// run and nowhere past it, whether the FPDU came whole into the staging buffer or in pieces
/// of a few bytes (placement into a receive's runs borrows them: `Dst::Run`).
#[test]
fn a_send_lands_across_the_sges_of_its_receive() {
    for max_io in [4096, 3] {
        let (mem, mut a, mut b, a_addr, b_addr) = connected_pair(max_io, Crc::Off);
        let payload = pattern(40, 5);
        mem.set(a_addr, &payload);
        // 7 bytes, then 13 bytes elsewhere, then the rest: three runs of one receive.
        let runs = [(b_addr + 100, 7u32), (b_addr + 300, 13), (b_addr + 500, 64)];
        let sges = runs.iter().map(|&(addr, length)| Sge { addr, length, lkey: b.mr.stag }).collect();
        let recv = RecvWqe { wr_id: 77, sges };
        assert_eq!(b.with(&mem, |dp, env| dp.post_recv(env, recv, false)), None);
        a.post_send(&mem, send_wqe(1, opcode::SEND, Sge { addr: a_addr, length: 40, lkey: a.mr.stag }, 0, 0));
        pump_both(&mem, &mut a, &mut b, 200);
        let done = Side::completions(&b.rcq);
        assert_eq!(done.iter().map(|c| (c.wr_id, c.status, c.byte_len)).collect::<Vec<_>>(), vec![(77, wc_status::SUCCESS, 40)], "{max_io}-byte pieces");
        assert_eq!(mem.get(b_addr + 100, 7), payload[..7], "{max_io}-byte pieces: first run");
        assert_eq!(mem.get(b_addr + 300, 13), payload[7..20], "{max_io}-byte pieces: second run");
        assert_eq!(mem.get(b_addr + 500, 20), payload[20..], "{max_io}-byte pieces: third run");
        assert_eq!(mem.get(b_addr + 107, 8), vec![0u8; 8], "{max_io}-byte pieces: nothing past the first run");
        assert_eq!(mem.get(b_addr + 313, 8), vec![0u8; 8], "{max_io}-byte pieces: nothing past the second run");
        assert_eq!(mem.get(b_addr + 520, 8), vec![0u8; 8], "{max_io}-byte pieces: nothing past the payload");
    }
}

/// A Send or Write whose SGEs add up to 4 GiB or more (each below it, as `ibv_sge` allows) is
/// refused at post time, before any path frames it: a message length is 32 bits on the wire
/// (RFC 5040's Read size, the receive's byte count), and one framed with its length cut to 32
/// bits would put more payload on the stream than its header announces.
#[test]
fn a_payload_of_4_gib_or_more_is_refused_before_it_is_framed() {
    for op in [opcode::SEND, opcode::RDMA_WRITE] {
        let (mem, mut a, _b, a_addr, b_addr) = connected_pair(4096, Crc::Off);
        // A region that spans both SGEs (registered, never read here): the length alone
        // refuses the WR.
        let lkey = a.mrs.register(PD, a_addr, 1 << 33, a_addr, access::LOCAL_WRITE).unwrap().stag;
        let mut wqe = send_wqe(1, op, Sge { addr: a_addr, length: u32::MAX, lkey }, b_addr, 0);
        wqe.payload = Payload::Sges(smallvec::smallvec![Sge { addr: a_addr, length: u32::MAX, lkey }, Sge { addr: a_addr, length: 2, lkey }]);
        let r = a.with(&mem, |dp, env| dp.post_send(env, wqe, 16, true));
        assert_eq!(r.unwrap_err(), crate::engine::wr::PostError::TooManySges, "opcode {op}");
        assert!(a.dp.sq.is_empty(), "opcode {op}: nothing queued");
        assert_eq!(a.dp.link.as_ref().unwrap().direct_sent, 0, "opcode {op}: nothing framed");
        assert!(Side::completions(&a.scq).is_empty(), "opcode {op}: no completion");
    }
}

/// A post or a pump that completes many work requests delivers their completions in order, all
/// of them by the time it returns: a chain of 40 signaled Sends rung once completes 40 Sends as
/// its doorbell returns, and the pumps that read them complete 40 receives, nothing of a pump's
/// left for later — on one CQ shared by the send and receive queues, as on separate ones.
#[test]
fn completions_of_one_call_arrive_in_order_when_it_returns() {
    for shared in [false, true] {
        let (mem, mut a, mut b, a_addr, b_addr) = connected_pair(64 << 10, Crc::Off);
        for i in 0..40u64 {
            let recv = RecvWqe { wr_id: 100 + i, sges: smallvec::smallvec![Sge { addr: b_addr + 64 * i, length: 64, lkey: b.mr.stag }] };
            assert_eq!(b.with(&mem, |dp, env| dp.post_recv(env, recv, false)), None);
        }
        mem.set(a_addr, &pattern(64, 1));
        let a_key = a.mr.stag;
        a.with(&mem, |dp, env| {
            for i in 0..40u64 {
                let r = dp.post_send(env, send_wqe(i, opcode::SEND, Sge { addr: a_addr, length: 8 + i as u32, lkey: a_key }, 0, 0), 64, i == 39);
                assert_eq!(r.unwrap(), None);
            }
        });
        let sent: Vec<u64> = Side::completions(&a.scq).iter().map(|c| c.wr_id).collect();
        assert_eq!(sent, (0..40).collect::<Vec<_>>(), "the chain's completions as its doorbell returned (shared CQ: {shared})");
        // B's pumps, with its send and receive queues on one CQ or two.
        let mut got = Vec::new();
        for _ in 0..100 {
            // Delivered as the pump returned, its environment still alive: its end delivers
            // nothing.
            let (fatal, now) = b.with_cqs(&mem, shared, |dp, env| (dp.pump(env).1, Side::completions(env.recv_cq)));
            assert_eq!(fatal, None);
            got.extend(now);
            assert!(Side::completions(if shared { &b.scq } else { &b.rcq }).is_empty(), "a completion delivered after its pump returned (shared CQ: {shared})");
            if got.len() == 40 {
                break;
            }
        }
        let received: Vec<(u64, u32)> = got.iter().map(|c| (c.wr_id, c.byte_len)).collect();
        assert_eq!(received, (0..40u64).map(|i| (100 + i, 8 + i as u32)).collect::<Vec<_>>(), "shared CQ: {shared}");
    }
}

/// A transmit pass that sends again after a `sendmsg` took part of its backlog tells the QP's
/// holder each time (`Holder::still_sending`: an application thread inside a pass that goes on
/// for milliseconds keeps its lease and the lease alarm away, see `lease`); a pass that one
/// `sendmsg` settles tells it nothing, and neither does a pass the stream stops.
#[test]
fn a_transmit_pass_that_goes_on_tells_the_holder() {
    // A stream that takes 512 bytes a call and holds 4 KiB.
    let (mem, mut a, mut b, a_addr, b_addr) = connected_pair(512, Crc::Off);
    let a_key = a.mr.stag;
    let b_key = b.mr.stag;
    a.holder = true;
    still_sending_heard();
    let write = |a: &mut Side, wr_id: u64, len: u32| {
        let wqe = send_wqe(wr_id, opcode::RDMA_WRITE, Sge { addr: a_addr, length: len, lkey: a_key }, b_addr, b_key);
        a.post_send(&mem, wqe);
    };
    // 8 bytes: one FPDU, one call.
    write(&mut a, 1, 8);
    a.pump(&mem);
    assert_eq!(still_sending_heard(), 0, "a pass one sendmsg settles");
    run(&mem, &mut a, &mut b, |a, _| !Side::completions(&a.scq).is_empty());
    still_sending_heard();
    // 3 KiB: six calls of 512 bytes and more, in the passes that post and pump it.
    write(&mut a, 2, 3 << 10);
    a.pump(&mem);
    let heard = still_sending_heard();
    assert!(heard >= 5, "a pass of 3 KiB in 512-byte calls told its holder {heard} times");
    run(&mem, &mut a, &mut b, |a, _| !Side::completions(&a.scq).is_empty());
}
