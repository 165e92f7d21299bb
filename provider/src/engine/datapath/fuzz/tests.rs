//! The harness on known streams (the seeds of the fuzz corpus, each checked for what it must
//! do), and the committed corpus of `provider/fuzz` replayed through it: the fuzz target's
//! invariants hold in every `cargo test`, without libFuzzer.
//!
//! `UIW_FUZZ_WRITE_SEEDS=<dir> cargo test -p uiw-provider every_seed_gets_past_mpa` also writes the
//! seeds to `<dir>` (how `provider/fuzz/corpus/datapath_stream` was seeded).

use uiw_wire::ddp::{qn, DdpHeader};
use uiw_wire::mpa::{encode_rr, FrameKind, IrdOrd, FLAG_UIW_EXT};
use uiw_wire::rdmap::{AtomicRequest, Opcode, RdmapCtrl, ReadRequest};
use uiw_wire::segment::encode_fpdu;

use super::*;

/// The three header bytes.
fn header(m: u8, dereg_at: u8, o: u8) -> Vec<u8> {
    vec![m, dereg_at, o]
}

/// `data` as chunks of at most `piece` bytes.
fn chunks(out: &mut Vec<u8>, data: &[u8], piece: usize) {
    for c in data.chunks(piece) {
        out.push(chunk::len_byte(c.len()));
        out.extend_from_slice(c);
    }
}

fn untagged(q: u32, msn: u32, op: Opcode, inv: u32) -> DdpHeader {
    DdpHeader::untagged(q, msn, 0, inv, true, RdmapCtrl::new(op))
}

fn send(msn: u32, payload: &[u8], crc: bool) -> Vec<u8> {
    let mut out = Vec::new();
    encode_fpdu(&untagged(qn::SEND, msn, Opcode::Send, 0), &[], payload, crc, &mut out);
    out
}

fn send_inv(msn: u32, stag: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_fpdu(&untagged(qn::SEND, msn, Opcode::SendInv, stag), &[], payload, false, &mut out);
    out
}

fn write(stag: u32, to: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_fpdu(&DdpHeader::tagged(stag, to, true, RdmapCtrl::new(Opcode::Write)), &[], payload, false, &mut out);
    out
}

fn read_request(msn: u32, size: u32, src_stag: u32, src_to: u64) -> Vec<u8> {
    let rr = ReadRequest { sink_stag: 0x7700, sink_to: 0, size, src_stag, src_to };
    let mut body = [0u8; 28];
    rr.encode(&mut body);
    let mut out = Vec::new();
    encode_fpdu(&untagged(qn::READ_REQUEST, msn, Opcode::ReadRequest, 0), &body, &[], false, &mut out);
    out
}

fn read_response(stag: u32, to: u64, payload: &[u8], last: bool) -> Vec<u8> {
    let mut out = Vec::new();
    encode_fpdu(&DdpHeader::tagged(stag, to, last, RdmapCtrl::new(Opcode::ReadResponse)), &[], payload, false, &mut out);
    out
}

fn fetch_add(msn: u32, stag: u32, to: u64, add: u64) -> Vec<u8> {
    let req = AtomicRequest { op_word: 0, req_id: 7, stag, to, add_swap: add, add_swap_mask: 0, compare: 0, compare_mask: 0 };
    let mut body = [0u8; 52];
    let n = req.encode(&mut body);
    let mut out = Vec::new();
    encode_fpdu(&untagged(qn::ATOMIC_REQUEST, msn, Opcode::AtomicRequest, 0), &body[..n], &[], false, &mut out);
    out
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// The seeds of the corpus, by name.
fn seed_inputs() -> Vec<(&'static str, Vec<u8>)> {
    let p = mode::PREFIX;
    let mut v = Vec::new();
    let mut s = header(p, 0xff, 0);
    chunks(&mut s, &send(1, b"hello, uiw", false), 100);
    v.push(("send", s));
    for (name, o) in [("write", 0), ("write_byte_by_byte", 1), ("write_short_reads", 4)] {
        let mut s = header(p, 0xff, o);
        chunks(&mut s, &write(stag(RW), iova(RW) + 100, &pattern(1000, 1)), 100);
        v.push((name, s));
    }
    let mut s = header(p, 0xff, 0);
    chunks(&mut s, &write(stag(RO), iova(RO), &pattern(600, 2)), 127);
    v.push(("write_read_only", s));
    let mut s = header(p, 0xff, 0);
    chunks(&mut s, &write(stag(OTHER), iova(OTHER), &pattern(100, 2)), 127);
    v.push(("write_other_pd", s));
    let mut s = header(p, 0xff, 0);
    chunks(&mut s, &write(stag(ZB), 10, &pattern(700, 3)), 64);
    v.push(("write_zero_based", s));
    let mut s = header(p, 0xff, 0);
    chunks(&mut s, &read_request(1, 600, stag(RO), iova(RO) + 8), 100);
    v.push(("read_request", s));
    let mut s = header(p | mode::READ, 0xff, 0);
    chunks(&mut s, &read_response(SINK_STAG, 0, &pattern(1200, 4), false), 127);
    chunks(&mut s, &read_response(SINK_STAG, 1200, &pattern(READ_LEN as usize - 1200, 5), true), 127);
    v.push(("read_response", s));
    let mut s = header(p | mode::INITIATOR | mode::SEND, 0xff, 0);
    chunks(&mut s, &send(1, &pattern(900, 6), false), 127);
    v.push(("initiator_send", s));
    let mut s = header(p | mode::SRQ, 0xff, 0);
    // Sized for the receives in order (64, 1, 1000, 716, 0, 1900 bytes).
    for (msn, len) in [(1, 50), (2, 1), (3, 1000), (4, 716), (5, 0)] {
        chunks(&mut s, &send(msn, &pattern(len, 7), false), 127);
    }
    s.push(chunk::REPOST);
    chunks(&mut s, &send(6, b"again", false), 127);
    chunks(&mut s, &send(7, b"and again", false), 127);
    v.push(("srq_sends", s));
    // The Write's header and first bytes arrive, the region is deregistered, the rest comes.
    let w = write(stag(DEREG), iova(DEREG), &pattern(1500, 8));
    let mut s = header(p, 1, 0);
    s.push(chunk::len_byte(640));
    s.extend_from_slice(&w[..640]);
    chunks(&mut s, &w[640..], 127);
    v.push(("dereg_mid_write", s));
    let mut s = header(p | mode::CRC, 0xff, 0);
    chunks(&mut s, &send(1, b"checked", true), 127);
    v.push(("crc_send", s));
    let mut s = header(p, 0xff, 0);
    chunks(&mut s, &send_inv(1, stag(RW), b"x"), 127);
    chunks(&mut s, &write(stag(RW), iova(RW), &pattern(64, 9)), 127);
    v.push(("invalidate_then_write", s));
    let mut s = header(0, 0xff, 0);
    let mut req = Vec::new();
    encode_rr(FrameKind::Request, FLAG_UIW_EXT, 2, Some(IrdOrd { ird: 2, ord: 2, ..Default::default() }), b"raw", &mut req);
    chunks(&mut s, &req, 7);
    chunks(&mut s, &send(1, b"raw", false), 127);
    v.push(("raw_request", s));
    let mut s = header(p, 0xff, 0);
    chunks(&mut s, &send(1, b"bye", false), 127);
    s.extend_from_slice(&[chunk::FIN, chunk::TICK]);
    v.push(("fin", s));
    let mut s = header(p, 0xff, 0);
    for msn in 1..=7 {
        chunks(&mut s, &send(msn, &[], false), 127);
    }
    // The first deadline starts the wait for a receive, the second ends it.
    s.extend_from_slice(&[chunk::TICK, chunk::TICK]);
    v.push(("no_receive_left", s));
    let mut s = header(p, 0xff, opts::EXTENSIONS);
    chunks(&mut s, &fetch_add(1, stag(RW), iova(RW) + 8, 5), 127);
    v.push(("fetch_add", s));
    let mut s = header(p, 0xff, opts::EXTENSIONS);
    chunks(&mut s, &fetch_add(1, stag(RW), iova(RW) + 12, 5), 127);
    v.push(("fetch_add_misaligned", s));
    let mut s = header(p | mode::BAD_RECV, 0xff, 0);
    chunks(&mut s, &send(1, b"nowhere", false), 127);
    v.push(("bad_receive", s));
    let mut s = header(p | mode::PUMP_AFTER_FATAL, 0xff, 0);
    chunks(&mut s, &write(stag(RO), iova(RO), &pattern(16, 10)), 127);
    chunks(&mut s, &write(stag(RW), iova(RW), &pattern(16, 11)), 127);
    chunks(&mut s, &send(1, b"late", false), 127);
    v.push(("pump_after_fatal", s));
    let mut s = header(p, 0xff, opts::NO_QP_WRITE);
    chunks(&mut s, &write(stag(RW), iova(RW), &pattern(16, 12)), 127);
    v.push(("qp_without_remote_write", s));
    v
}

fn seed(name: &str) -> Vec<u8> {
    seed_inputs().into_iter().find(|(n, _)| *n == name).unwrap().1
}

fn completion(r: &Report, wr_id: u64) -> Completion {
    *r.completions.iter().find(|c| c.wr_id == wr_id).unwrap_or_else(|| panic!("no completion of {wr_id}: {r:?}"))
}

fn region(r: &Report, i: usize, off: usize, len: usize) -> &[u8] {
    &r.regions[i][off..off + len]
}

#[test]
fn every_seed_gets_past_mpa() {
    let dir = std::env::var_os("UIW_FUZZ_WRITE_SEEDS");
    for (name, data) in seed_inputs() {
        let r = run(&data);
        assert!(r.established, "seed {name} does not get past MPA");
        if let Some(d) = &dir {
            std::fs::write(std::path::Path::new(d).join(format!("seed_{name}")), &data).unwrap();
        }
    }
}

#[test]
fn a_send_lands_in_the_first_receive_and_nothing_else_moves() {
    let r = run(&seed("send"));
    let c = completion(&r, 101);
    assert_eq!((c.status, c.byte_len, c.opcode), (wc_status::SUCCESS, 10, wc_opcode::RECV));
    assert_eq!(region(&r, RECV, 0, 10), b"hello, uiw");
    assert_eq!(r.placed, 10);
    // The QP was destroyed at the end: the other receives are flushed.
    assert_eq!(completion(&r, 106).status, wc_status::WR_FLUSH_ERR);
    assert_eq!(r.fatal, None);
}

#[test]
fn a_write_lands_whatever_the_read_sizes() {
    for name in ["write", "write_byte_by_byte", "write_short_reads"] {
        let r = run(&seed(name));
        assert_eq!(region(&r, RW, 100, 1000), pattern(1000, 1), "{name}");
        assert_eq!(r.placed, 1000, "{name}");
        assert_eq!(r.fatal, None, "{name}");
    }
    let r = run(&seed("write_zero_based"));
    assert_eq!(region(&r, ZB, 10, 700), pattern(700, 3));
}

#[test]
fn writes_without_the_rights_terminate_and_place_nothing() {
    for name in ["write_read_only", "write_other_pd", "invalidate_then_write", "qp_without_remote_write", "bad_receive"] {
        let r = run(&seed(name));
        assert_eq!(r.fatal, Some(Fatal::Terminated), "{name}");
        let expect = if name == "invalidate_then_write" { 1 } else { 0 };
        assert_eq!(r.placed, expect, "{name}: only the Send with Invalidate's byte");
        assert!(r.sent > 0, "{name}: the Terminate goes out");
    }
    let r = run(&seed("bad_receive"));
    assert_eq!(completion(&r, BAD_RECV_ID).status, wc_status::LOC_PROT_ERR);
}

#[test]
fn nothing_is_placed_after_a_failure_even_if_pumped_on() {
    let r = run(&seed("pump_after_fatal"));
    assert_eq!((r.fatal, r.placed), (Some(Fatal::Terminated), 0));
    assert!(r.completions.iter().all(|c| c.status != wc_status::SUCCESS), "{r:?}");
}

#[test]
fn reads_answered_and_read_responses_placed() {
    let r = run(&seed("read_request"));
    assert_eq!(r.fatal, None);
    assert!(r.sent > 600, "the Read Response carries 600 bytes: {} sent", r.sent);
    let r = run(&seed("read_response"));
    let c = completion(&r, READ_ID);
    assert_eq!((c.status, c.byte_len), (wc_status::SUCCESS, READ_LEN));
    // Two SGEs: 1000 bytes at READ_AT, the rest at 2048.
    let mut all = pattern(1200, 4);
    all.extend(pattern(READ_LEN as usize - 1200, 5));
    assert_eq!(region(&r, SINK, READ_AT as usize, 1000), &all[..1000]);
    assert_eq!(region(&r, SINK, 2048, 1000), &all[1000..]);
}

#[test]
fn an_atomic_adds_in_place() {
    let r = run(&seed("fetch_add"));
    assert_eq!(r.fatal, None);
    let off = addr(RW) - BASE + 8;
    let before = u64::from_ne_bytes(std::array::from_fn(|k| fill_byte(off + k as u64)));
    assert_eq!(u64::from_ne_bytes(region(&r, RW, 8, 8).try_into().unwrap()), before + 5);
}

#[test]
fn a_misaligned_atomic_terminates_and_changes_nothing() {
    // RFC 7306 §8.2: a target not 64-bit aligned is an error (Terminate), memory untouched.
    let r = run(&seed("fetch_add_misaligned"));
    assert_eq!(r.fatal, Some(Fatal::Terminated));
    let off = addr(RW) - BASE;
    let before: Vec<u8> = (0..32).map(|k| fill_byte(off + k)).collect();
    assert_eq!(region(&r, RW, 0, 32), &before[..]);
}

#[test]
fn a_region_deregistered_mid_write_gets_no_more_bytes() {
    let r = run(&seed("dereg_mid_write"));
    let w = pattern(1500, 8);
    // What arrived before the deregistration is there; nothing after it (the harness checks
    // every write), and the QP carries on.
    let got = region(&r, DEREG, 0, 1500);
    let placed = got.iter().zip(&w).take_while(|(a, b)| a == b).count();
    assert!(placed > 0 && placed < 1500, "{placed} bytes placed");
    assert_eq!(r.placed as usize, placed);
}

#[test]
fn srq_receives_and_reposts() {
    let r = run(&seed("srq_sends"));
    assert_eq!(r.fatal, None);
    let ok: Vec<u64> = r.completions.iter().filter(|c| c.status == wc_status::SUCCESS).map(|c| c.wr_id).collect();
    assert_eq!(ok, [101, 102, 103, 104, 105, 106, REPOST_ID + 1], "{r:?}");
}

#[test]
fn the_peers_fin_and_an_unmatched_send_end_the_qp() {
    assert_eq!(run(&seed("fin")).fatal, Some(Fatal::Closed));
    let r = run(&seed("no_receive_left"));
    assert_eq!(r.fatal, Some(Fatal::Terminated));
    assert_eq!(r.completions.iter().filter(|c| c.status == wc_status::SUCCESS).count(), 6);
}

#[test]
fn a_checked_memory_catches_a_stray_write() {
    // The harness itself: a write the peer may not make must be a finding.
    let mem = Checked {
        arena: Arena::new(ARENA_LEN as usize),
        mrs: Arc::new(MrTable::with_fixed_keys(16, KEY)),
        qp_access: REMOTE_WRITE,
        watch: StdMutex::new(Watch::default()),
    };
    for (i, r) in REGIONS.iter().enumerate() {
        mem.mrs.register(r.pd, addr(i), r.len, addr(i), r.access).unwrap();
    }
    let span = mem.mrs.lookup(stag(RO)).unwrap().span(PD, addr(RO), 8, 0).unwrap();
    let ro = span.pin().unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| mem.write(&ro, &[1; 8])));
    assert!(r.is_err(), "a write into a read-only region passed the harness");
}

/// Every input of the committed corpus through the harness (and each without its first byte,
/// another mode for the same stream).
#[test]
fn replay_fuzz_corpus() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/datapath_stream");
    let files = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut n = 0;
    for f in files {
        let data = std::fs::read(f.unwrap().path()).unwrap();
        run(&data);
        if !data.is_empty() {
            run(&data[1..]);
        }
        n += 1;
    }
    assert!(n > 0, "the corpus is empty");
    eprintln!("replayed {n} corpus inputs");
}
