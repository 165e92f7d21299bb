//! Two `Connection`s wired back to back in memory (no sockets): every
//! operation end to end with data checked, and every error path asserting
//! the exact Terminate (RFC 5040 §7 / RFC 5041 §7 codes, as siw produces
//! them) and completion status.

use std::collections::HashMap;
use uiw_wire::conn::{Counters, LoneMsg, 
    Completion, Config, Connection, Event, Failure, Role, RxWant, SendFlags, State, Tx, WcOpcode,
};
use uiw_wire::ddp::{qn, DdpHeader};
use uiw_wire::mpa;
use uiw_wire::placement::{Access, Memory, MemoryIo, Placement, Source};
use uiw_wire::rdmap::{AtomicOperation, Opcode, RdmapCtrl, ReadRequest, TermLayout, Terminate};
use uiw_wire::segment::{encode_fpdu, parse_fpdu};
use uiw_wire::{TaggedError, TermCode, WcStatus};

struct Region {
    base: u64,
    data: Vec<u8>,
    access: Vec<Access>,
    valid: bool,
}

#[derive(Default)]
struct Mem {
    regions: HashMap<u32, Region>,
    sends: HashMap<u64, Vec<u8>>,
    recvs: HashMap<u64, Vec<u8>>,
}

impl Mem {
    fn region(&mut self, stag: u32, base: u64, len: usize, access: &[Access]) {
        self.regions.insert(
            stag,
            Region {
                base,
                data: vec![0; len],
                access: access.to_vec(),
                valid: true,
            },
        );
    }
    fn fill(&mut self, stag: u32, pat: u8) {
        let r = self.regions.get_mut(&stag).unwrap();
        for (i, b) in r.data.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(31).wrapping_add(pat);
        }
    }
    fn bytes(&self, stag: u32) -> &[u8] {
        &self.regions[&stag].data
    }
}

const ALL: &[Access] = &[
    Access::LocalWrite,
    Access::RemoteWrite,
    Access::RemoteRead,
    Access::RemoteAtomic,
];

impl Memory for Mem {
    fn check_tagged(
        &self,
        stag: u32,
        to: u64,
        len: u32,
        access: Access,
    ) -> Result<(), TaggedError> {
        let r = self
            .regions
            .get(&stag)
            .filter(|r| r.valid)
            .ok_or(TaggedError::InvalidStag)?;
        if !r.access.contains(&access) {
            return Err(TaggedError::AccessRights);
        }
        let end = to.checked_add(len as u64).ok_or(TaggedError::ToWrap)?;
        if to < r.base || end > r.base + r.data.len() as u64 {
            return Err(TaggedError::BaseBounds);
        }
        // RFC 7306 §8.2: the atomic's target address must be 64-bit aligned.
        if access == Access::RemoteAtomic && !to.is_multiple_of(8) {
            return Err(TaggedError::Misaligned);
        }
        Ok(())
    }
    fn invalidate(&mut self, stag: u32) -> Result<(), TaggedError> {
        let r = self
            .regions
            .get_mut(&stag)
            .filter(|r| r.valid)
            .ok_or(TaggedError::InvalidStag)?;
        r.valid = false;
        Ok(())
    }
    fn atomic(&mut self, stag: u32, to: u64, op: AtomicOperation) -> Result<u64, TaggedError> {
        let r = self.regions.get_mut(&stag).unwrap();
        let o = (to - r.base) as usize;
        let cur = u64::from_ne_bytes(r.data[o..o + 8].try_into().unwrap());
        r.data[o..o + 8].copy_from_slice(&op.apply(cur).to_ne_bytes());
        Ok(cur)
    }
}

impl MemoryIo for Mem {
    fn read(&self, src: Source, out: &mut [u8]) {
        match src {
            Source::Wr { wr_id, offset } => {
                out.copy_from_slice(&self.sends[&wr_id][offset as usize..][..out.len()])
            }
            Source::Tagged { stag, to } => {
                let r = &self.regions[&stag];
                let o = (to - r.base) as usize;
                out.copy_from_slice(&r.data[o..o + out.len()]);
            }
            Source::None => {}
        }
    }
    fn write(&mut self, dst: Placement, data: &[u8]) {
        match dst {
            Placement::Recv { wr_id, offset } => self.recvs.get_mut(&wr_id).unwrap()
                [offset as usize..][..data.len()]
                .copy_from_slice(data),
            Placement::Tagged { stag, to } => {
                let r = self.regions.get_mut(&stag).unwrap();
                let o = (to - r.base) as usize;
                r.data[o..o + data.len()].copy_from_slice(data);
            }
            Placement::Discard => {}
        }
    }
}

struct Peer {
    c: Connection,
    m: Mem,
    ev: Vec<Event>,
}

impl Peer {
    fn new(cfg: Config) -> Peer {
        Peer {
            c: Connection::new(cfg, 0),
            m: Mem::default(),
            ev: Vec::new(),
        }
    }
    fn drain(&mut self) {
        while let Some(e) = self.c.poll_event() {
            self.ev.push(e);
        }
    }
    fn completions(&mut self) -> Vec<Completion> {
        self.drain();
        let v = self
            .ev
            .iter()
            .filter_map(|e| {
                if let Event::Completion(c) = e {
                    Some(*c)
                } else {
                    None
                }
            })
            .collect();
        self.ev.retain(|e| !matches!(e, Event::Completion(_)));
        v
    }
    fn terminate(&mut self) -> Option<(bool, Terminate)> {
        self.drain();
        self.ev.iter().find_map(|e| {
            if let Event::Terminated { sent, term } = e {
                Some((*sent, *term))
            } else {
                None
            }
        })
    }
    fn post_recv(&mut self, wr_id: u64, len: usize) {
        self.m.recvs.insert(wr_id, vec![0; len]);
        self.c.post_recv(wr_id, len as u32).unwrap();
    }
    fn post_send(&mut self, wr_id: u64, data: &[u8], flags: SendFlags) {
        self.m.sends.insert(wr_id, data.to_vec());
        self.c.post_send(wr_id, flags, data.len() as u32).unwrap();
    }
}

/// Move bytes both ways until quiet. `tamper` may modify a→b bytes.
/// Returns FPDU-transmit-unit counts (a→b, b→a).
fn pump_with(a: &mut Peer, b: &mut Peer, tamper: &mut dyn FnMut(&mut Vec<u8>)) -> (usize, usize) {
    let (mut na, mut nb) = (0, 0);
    loop {
        // A connection that says nothing is pending hands out nothing.
        for p in [&mut *a, &mut *b] {
            if !p.c.tx_pending() {
                assert!(p.c.next_tx().is_none(), "tx_pending said no, next_tx had something ({:?})", p.c.state());
            }
        }
        let mut moved = false;
        let mut buf = Vec::new();
        while a.c.poll_transmit(&mut buf, &a.m) {
            na += 1;
        }
        if !buf.is_empty() {
            tamper(&mut buf);
            moved = true;
            let mut off = 0;
            while off < buf.len() {
                off += b.c.handle_bytes(&buf[off..], &mut b.m);
            }
        }
        let mut buf = Vec::new();
        while b.c.poll_transmit(&mut buf, &b.m) {
            nb += 1;
        }
        if !buf.is_empty() {
            moved = true;
            let mut off = 0;
            while off < buf.len() {
                off += a.c.handle_bytes(&buf[off..], &mut a.m);
            }
        }
        if !moved {
            return (na, nb);
        }
    }
}

fn pump(a: &mut Peer, b: &mut Peer) -> (usize, usize) {
    pump_with(a, b, &mut |_| {})
}

fn pair(ca: Config, cb: Config) -> (Peer, Peer) {
    let (mut a, mut b) = (Peer::new(ca), Peer::new(cb));
    pump(&mut a, &mut b);
    assert_eq!(a.c.state(), State::Established, "{:?}", a.ev);
    assert_eq!(b.c.state(), State::Established, "{:?}", b.ev);
    a.drain();
    b.drain();
    assert!(matches!(a.ev.remove(0), Event::Established(_)));
    assert!(matches!(b.ev.remove(0), Event::Established(_)));
    (a, b)
}

fn default_pair() -> (Peer, Peer) {
    pair(Config::new(Role::Initiator), Config::new(Role::Responder))
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect()
}

/// Assert the responder sent exactly `code` and the other side received it.
fn assert_term(sender: &mut Peer, receiver: &mut Peer, code: TermCode) -> Terminate {
    let (sent, t) = sender.terminate().expect("no Terminate sent");
    assert!(sent);
    assert_eq!(t.code, code, "sent {}", t.code);
    assert_eq!(sender.c.state(), State::Error);
    let (sent, r) = receiver.terminate().expect("no Terminate received");
    assert!(!sent);
    assert_eq!(r.code, code);
    assert_eq!(receiver.c.state(), State::Error);
    assert_eq!(r, t, "Terminate changed in transit");
    t
}

// ---------------------------------------------------------------------------

#[test]
fn send_variants() {
    let (mut a, mut b) = default_pair();
    b.m.region(0x500, 0x1000, 64, ALL);
    for i in 0..4 {
        b.post_recv(10 + i, 100);
    }
    a.post_send(1, &pattern(100, 1), SendFlags::default());
    a.post_send(
        2,
        &pattern(0, 0),
        SendFlags {
            solicited: true,
            invalidate: None,
        },
    );
    a.post_send(
        3,
        &pattern(33, 3),
        SendFlags {
            solicited: false,
            invalidate: Some(0x500),
        },
    );
    a.post_send(
        4,
        &pattern(5, 4),
        SendFlags {
            solicited: true,
            invalidate: Some(0x777),
        },
    );
    pump(&mut a, &mut b);
    let ca = a.completions();
    assert_eq!(ca.len(), 4);
    assert!(ca
        .iter()
        .all(|c| c.status == WcStatus::Success && c.opcode == WcOpcode::Send));
    let cb = b.completions();
    assert_eq!(cb[0].byte_len, 100);
    assert_eq!(b.m.recvs[&10], pattern(100, 1));
    assert_eq!((cb[1].byte_len, cb[1].solicited), (0, true));
    assert_eq!(cb[2].invalidated, Some(0x500));
    assert_eq!(&b.m.recvs[&12][..33], &pattern(33, 3)[..]);
    assert!(!b.m.regions[&0x500].valid);
    // 0x777 does not exist: data delivered, then "STag cannot be invalidated".
    assert_eq!(cb[3].status, WcStatus::Success);
    assert_term(&mut b, &mut a, TermCode::RDMAP_CANNOT_INVALIDATE);
}

#[test]
fn write_and_read() {
    let (mut a, mut b) = default_pair();
    a.m.region(0xa00, 0x10000, 4096, ALL);
    b.m.region(0xb00, 0x7000_0000, 4096, ALL);
    b.m.fill(0xb00, 9);
    a.m.sends.insert(1, pattern(3000, 5));
    a.c.post_write(1, 0xb00, 0x7000_0000 + 100, 3000, None)
        .unwrap();
    a.c.post_read(2, 0xa00, 0x10000, 0xb00, 0x7000_0000 + 200, 2000)
        .unwrap();
    a.c.post_read(3, 0xa00, 0x10000 + 2048, 0xb00, 0x7000_0000, 0)
        .unwrap();
    pump(&mut a, &mut b);
    let c = a.completions();
    assert_eq!(c.len(), 3);
    assert_eq!(
        (c[0].wr_id, c[0].opcode, c[0].status, c[0].byte_len),
        (1, WcOpcode::RdmaWrite, WcStatus::Success, 3000)
    );
    assert_eq!(
        (c[1].wr_id, c[1].opcode, c[1].status, c[1].byte_len),
        (2, WcOpcode::RdmaRead, WcStatus::Success, 2000)
    );
    assert_eq!((c[2].wr_id, c[2].byte_len), (3, 0));
    assert_eq!(&b.m.bytes(0xb00)[100..3100], &pattern(3000, 5)[..]);
    // The read saw the data the write had put there (ordering).
    assert_eq!(&a.m.bytes(0xa00)[..2000], &b.m.bytes(0xb00)[200..2200]);
    assert!(
        b.completions().is_empty(),
        "writes and reads complete nothing at the target"
    );
}

#[test]
fn ord_limits_outstanding_reads() {
    let mut ca = Config::new(Role::Initiator);
    ca.ord = 2;
    let (mut a, mut b) = pair(ca, Config::new(Role::Responder));
    assert_eq!(a.c.negotiated().unwrap().ord, 2);
    a.m.region(0xa00, 0, 1 << 16, ALL);
    b.m.region(0xb00, 0, 1 << 16, ALL);
    b.m.fill(0xb00, 1);
    for i in 0..6u64 {
        a.c.post_read(i, 0xa00, i * 1000, 0xb00, i * 500, 1000)
            .unwrap();
    }
    // Only ORD read requests leave before any response came back.
    let mut buf = Vec::new();
    let mut n = 0;
    while a.c.poll_transmit(&mut buf, &a.m) {
        n += 1;
    }
    assert_eq!(n, 2);
    let mut off = 0;
    while off < buf.len() {
        off += b.c.handle_bytes(&buf[off..], &mut b.m);
    }
    pump(&mut a, &mut b);
    let c = a.completions();
    assert_eq!(
        c.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 4, 5]
    );
    for i in 0..6usize {
        assert_eq!(
            &a.m.bytes(0xa00)[i * 1000..i * 1000 + 1000],
            &b.m.bytes(0xb00)[i * 500..i * 500 + 1000]
        );
    }
}

#[test]
fn inbound_reads_over_ird_terminate() {
    let mut cb = Config::new(Role::Responder);
    cb.ird = 1;
    let (a, mut b) = pair(Config::new(Role::Initiator), cb);
    assert_eq!(a.c.negotiated().unwrap().ord, 1);
    b.m.region(0xb00, 0, 4096, ALL);
    // A misbehaving peer: two Read Requests back to back.
    let mut raw = Vec::new();
    for msn in 1..=2 {
        let rr = ReadRequest {
            sink_stag: 0xa00,
            sink_to: 0,
            size: 100,
            src_stag: 0xb00,
            src_to: 0,
        };
        let mut body = [0u8; 28];
        rr.encode(&mut body);
        let d = DdpHeader::untagged(
            qn::READ_REQUEST,
            msn,
            0,
            0,
            true,
            RdmapCtrl::new(Opcode::ReadRequest),
        );
        encode_fpdu(&d, &body, &[], false, &mut raw);
    }
    let mut off = 0;
    while off < raw.len() {
        off += b.c.handle_bytes(&raw[off..], &mut b.m);
    }
    let (sent, t) = b.terminate().unwrap();
    assert!(sent);
    assert_eq!(t.code, TermCode::RDMAP_CATASTROPHIC_STREAM);
    assert!(t.r && t.d && t.m);
    assert_eq!(t.rdmap_hdr.unwrap().size, 100);
}

#[test]
fn large_messages_segmented_by_mss() {
    const N: usize = 8 << 20;
    let (mut a, mut b) = default_pair();
    let mss = 1460;
    let seg_payload = mpa::mulpdu(mss) - 14;
    assert_eq!(seg_payload, 1436);
    b.m.region(0xb00, 0x4000_0000, N, ALL);
    a.m.region(0xa00, 0x5000_0000, N, ALL);
    a.m.sends.insert(1, pattern(N, 3));
    a.c.post_write(1, 0xb00, 0x4000_0000, N as u32, None)
        .unwrap();
    let (na, _) = pump(&mut a, &mut b);
    assert_eq!(na, N.div_ceil(seg_payload));
    assert!(b.m.bytes(0xb00) == &pattern(N, 3)[..]);
    // Read it back.
    a.c.post_read(2, 0xa00, 0x5000_0000, 0xb00, 0x4000_0000, N as u32)
        .unwrap();
    let (_, nb) = pump(&mut a, &mut b);
    assert_eq!(nb, N.div_ceil(seg_payload));
    assert!(a.m.bytes(0xa00) == &pattern(N, 3)[..]);
    // And as a Send (untagged header: 1432 per FPDU).
    b.post_recv(9, N);
    a.post_send(3, &pattern(N, 4), SendFlags::default());
    let (na, _) = pump(&mut a, &mut b);
    assert_eq!(na, N.div_ceil(seg_payload - 4));
    assert!(b.m.recvs[&9] == pattern(N, 4));
    let c = b.completions();
    assert_eq!(c[0].byte_len as usize, N);
    assert_eq!(a.completions().len(), 3);
}

#[test]
fn write_errors_match_siw() {
    // (STag, TO, len, region access) → DDP tagged error
    let cases: &[(u32, u64, u32, &[Access], TermCode)] = &[
        (0xdead00, 0x1000, 10, ALL, TermCode::DDP_T_INVALID_STAG),
        (0xb00, 0x1000 + 4090, 10, ALL, TermCode::DDP_T_BASE_BOUNDS),
        (0xb00, 0x0fff, 10, ALL, TermCode::DDP_T_BASE_BOUNDS),
        // No remote write right: DDP has no access code, siw reports base/bounds.
        (
            0xb00,
            0x1000,
            10,
            &[Access::LocalWrite, Access::RemoteRead],
            TermCode::DDP_T_BASE_BOUNDS,
        ),
    ];
    for &(stag, to, len, acc, code) in cases {
        let (mut a, mut b) = default_pair();
        b.m.region(0xb00, 0x1000, 4096, acc);
        b.post_recv(5, 10);
        a.m.sends.insert(1, vec![1; len as usize]);
        a.c.post_write(1, stag, to, len, None).unwrap();
        pump(&mut a, &mut b);
        let t = assert_term(&mut b, &mut a, code);
        // Header echo: M, D with the offending tagged header.
        assert!(t.m && t.d && !t.r);
        assert_eq!(t.seg_len as u32, 14 + len);
        let (h, _) = DdpHeader::parse(t.echoed_ddp().unwrap()).unwrap();
        assert_eq!(
            h,
            DdpHeader::tagged(stag, to, true, RdmapCtrl::new(Opcode::Write))
        );
        // Nothing was placed; the posted receive is flushed.
        assert!(b.m.bytes(0xb00).iter().all(|&x| x == 0));
        let cb = b.completions();
        assert_eq!((cb[0].wr_id, cb[0].status), (5, WcStatus::WrFlushErr));
        // The Write itself had completed at the requester (iWARP semantics).
        assert_eq!(a.completions()[0].status, WcStatus::Success);
    }
}

#[test]
fn read_errors_match_siw() {
    let cases: &[(u32, u64, &[Access], TermCode)] = &[
        (0xdeadbe00, 0x1000, ALL, TermCode::RDMAP_INVALID_STAG),
        (0xb00, 0x2000, ALL, TermCode::RDMAP_BASE_BOUNDS),
        (
            0xb00,
            0x1000,
            &[Access::RemoteWrite],
            TermCode::RDMAP_ACCESS_RIGHTS,
        ),
    ];
    for &(stag, to, acc, code) in cases {
        let (mut a, mut b) = default_pair();
        a.m.region(0xa00, 0, 4096, ALL);
        b.m.region(0xb00, 0x1000, 100, acc);
        a.post_recv(7, 10);
        a.c.post_read(1, 0xa00, 0, stag, to, 64).unwrap();
        a.c.post_read(2, 0xa00, 0, 0xb00, 0x1000, 8).unwrap();
        pump(&mut a, &mut b);
        let t = assert_term(&mut b, &mut a, code);
        // As in h2g-badread: M, D and R with the Read Request echoed.
        assert!(t.m && t.d && t.r);
        let rr = t.rdmap_hdr.unwrap();
        assert_eq!((rr.src_stag, rr.src_to, rr.size), (stag, to, 64));
        let (h, _) = DdpHeader::parse(t.echoed_ddp().unwrap()).unwrap();
        assert_eq!(
            h,
            DdpHeader::untagged(1, 1, 0, 0, true, RdmapCtrl::new(Opcode::ReadRequest))
        );
        let c = a.completions();
        let st: Vec<_> = c.iter().map(|c| (c.wr_id, c.status)).collect();
        assert!(st.contains(&(1, WcStatus::RemAccessErr)), "{st:?}");
        assert!(st.contains(&(2, WcStatus::WrFlushErr)), "{st:?}");
        assert!(st.contains(&(7, WcStatus::WrFlushErr)), "{st:?}");
    }
}

/// The engine found a Read Response's source region gone (deregistered after the Read
/// Request was checked) before sending the segment: a Terminate goes out instead (RFC 5040
/// §7.2 Invalid STag), and the reader gets an error completion, never bytes of nothing.
#[test]
fn read_response_whose_source_is_gone_becomes_a_terminate() {
    let (mut a, mut b) = default_pair();
    a.m.region(0xa00, 0, 4096, ALL);
    b.m.region(0xb00, 0x1000, 100, ALL);
    a.c.post_read(1, 0xa00, 0, 0xb00, 0x1000, 64).unwrap();
    let mut buf = Vec::new();
    while a.c.poll_transmit(&mut buf, &a.m) {}
    let mut off = 0;
    while off < buf.len() {
        off += b.c.handle_bytes(&buf[off..], &mut b.m);
    }
    match b.c.next_tx() {
        Some(Tx::Segment(s)) => assert_eq!(s.source, Source::Tagged { stag: 0xb00, to: 0x1000 }),
        _ => panic!("expected the Read Response's first segment"),
    }
    b.c.abort_source();
    pump(&mut a, &mut b);
    assert_term(&mut b, &mut a, TermCode::RDMAP_INVALID_STAG);
    let st: Vec<_> = a.completions().iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(st, [(1, WcStatus::RemAccessErr)]);
}

/// Two Writes posted, the first `len` bytes long; the engine hands out the first Write's first
/// segment (its only one, or not: `only`) and then finds its memory gone (the region was
/// deregistered after the WR was posted). Returns both peers, with everything pumped since.
fn abort_first_write(len: u32, only: bool) -> (Peer, Peer) {
    let (mut a, mut b) = default_pair();
    b.m.region(0xb00, 0x1000, 200_000, ALL);
    a.m.sends.insert(1, pattern(len as usize, 1));
    a.m.sends.insert(2, pattern(64, 2));
    a.c.post_write(1, 0xb00, 0x1000, len, None).unwrap();
    a.c.post_write(2, 0xb00, 0x1000 + 150_000, 64, None).unwrap();
    match a.c.next_tx() {
        Some(Tx::Segment(s)) => assert_eq!(s.payload_len == len, only, "{} of {len} bytes", s.payload_len),
        _ => panic!("expected the first Write's segment"),
    }
    a.c.abort_source();
    pump(&mut a, &mut b);
    assert!(b.m.bytes(0xb00).iter().all(|&x| x == 0), "nothing of either Write lands");
    (a, b)
}

/// The memory of a Write's segment is gone as the engine frames it: the Write fails with a
/// local protection error — also when handing out its last segment had completed it already
/// — later WRs are flushed, and a Terminate goes out in its place.
#[test]
fn write_whose_source_is_gone_fails_its_completion() {
    // The Write's only segment: completed as it was handed out, queued already.
    let (mut a, mut b) = abort_first_write(64, true);
    assert_term(&mut a, &mut b, TermCode::RDMAP_INVALID_STAG);
    let st: Vec<_> = a.completions().iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(st, [(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)]);

    // The first of several segments: not completed yet.
    let (mut a, _) = abort_first_write(100_000, false);
    let st: Vec<_> = a.completions().iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(st, [(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)]);

    // Behind an outstanding Read, whose completion the Write's waits for.
    let (mut a, mut b) = default_pair();
    a.m.region(0xa00, 0, 4096, ALL);
    b.m.region(0xb00, 0x1000, 4096, ALL);
    a.m.sends.insert(2, pattern(64, 2));
    a.c.post_read(1, 0xa00, 0, 0xb00, 0x1000, 64).unwrap();
    a.c.post_write(2, 0xb00, 0x1100, 64, None).unwrap();
    assert!(matches!(a.c.next_tx(), Some(Tx::Bytes(_))), "expected the Read Request");
    match a.c.next_tx() {
        Some(Tx::Segment(s)) => assert_eq!(s.payload_len, 64),
        _ => panic!("expected the Write's segment"),
    }
    a.c.abort_source();
    pump(&mut a, &mut b);
    let st: Vec<_> = a.completions().iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(st, [(1, WcStatus::WrFlushErr), (2, WcStatus::LocProtErr)], "the Read is flushed, not failed");
}

#[test]
fn send_without_receive_and_too_long() {
    let (mut a, mut b) = default_pair();
    a.post_send(1, b"no buffer", SendFlags::default());
    pump(&mut a, &mut b);
    let t = assert_term(&mut b, &mut a, TermCode::DDP_U_NO_BUFFER);
    assert!(t.m && t.d && !t.r);
    let (h, _) = DdpHeader::parse(t.echoed_ddp().unwrap()).unwrap();
    assert_eq!(
        h,
        DdpHeader::untagged(0, 1, 0, 0, true, RdmapCtrl::new(Opcode::Send))
    );

    // A Send longer than the posted buffer: same code, LOC_LEN_ERR locally.
    let (mut a, mut b) = default_pair();
    b.post_recv(5, 10);
    b.post_recv(6, 10);
    a.post_send(1, &[7; 11], SendFlags::default());
    pump(&mut a, &mut b);
    assert_term(&mut b, &mut a, TermCode::DDP_U_NO_BUFFER);
    let c = b.completions();
    assert_eq!((c[0].wr_id, c[0].status), (5, WcStatus::LocLenErr));
    assert_eq!((c[1].wr_id, c[1].status), (6, WcStatus::WrFlushErr));
}

#[test]
fn crc_negotiated_and_mismatch_detected() {
    let mut ca = Config::new(Role::Initiator);
    ca.crc = true;
    let (mut a, mut b) = pair(ca, Config::new(Role::Responder));
    assert!(a.c.negotiated().unwrap().crc && b.c.negotiated().unwrap().crc);
    b.post_recv(1, 100);
    b.post_recv(2, 100);
    a.post_send(1, &pattern(100, 1), SendFlags::default());
    pump(&mut a, &mut b);
    assert_eq!(b.completions()[0].status, WcStatus::Success);
    // The FPDU on the wire carries a valid CRC32c.
    a.post_send(2, &pattern(50, 2), SendFlags::default());
    let mut flipped = false;
    pump_with(&mut a, &mut b, &mut |buf| {
        let (f, _) = parse_fpdu(buf).unwrap();
        assert!(f.crc_ok() && f.crc != 0);
        buf[30] ^= 0x40; // a payload byte
        flipped = true;
    });
    assert!(flipped);
    let t = assert_term(&mut b, &mut a, TermCode::MPA_CRC);
    assert!(!t.m && !t.d && !t.r);
    assert_eq!(b.completions()[0].status, WcStatus::GeneralErr);
}

#[test]
fn unexpected_extension_opcode() {
    let mut ca = Config::new(Role::Initiator);
    ca.extensions = true;
    let (mut a, mut b) = pair(ca, Config::new(Role::Responder));
    assert!(!a.c.negotiated().unwrap().extensions);
    b.post_recv(1, 16);
    assert_eq!(
        a.c.post_immediate(1, 5, false),
        Err(uiw_wire::PostError::NotSupported)
    );
    a.c.post_immediate_unchecked(1, 5);
    pump(&mut a, &mut b);
    let t = assert_term(&mut b, &mut a, TermCode::RDMAP_UNEXPECTED_OPCODE);
    assert!(t.d);
    assert_eq!(t.echoed_ddp().unwrap()[1], 0x48);
}

#[test]
fn extensions_between_uiw_peers() {
    let mut ca = Config::new(Role::Initiator);
    ca.extensions = true;
    let mut cb = Config::new(Role::Responder);
    cb.extensions = true;
    let (mut a, mut b) = pair(ca, cb);
    assert!(b.c.negotiated().unwrap().extensions);
    a.m.region(0xa00, 0, 64, ALL);
    b.m.region(0xb00, 0x100, 64, ALL);
    b.m.regions.get_mut(&0xb00).unwrap().data[..8].copy_from_slice(&40u64.to_ne_bytes());
    a.c.post_atomic(1, AtomicOperation::fetch_add(2), (0xa00, 0), 0xb00, 0x100)
        .unwrap();
    a.c.post_atomic(2, AtomicOperation::cmp_swap(42, 99), (0xa00, 8), 0xb00, 0x100)
        .unwrap();
    a.c.post_atomic(3, AtomicOperation::cmp_swap(42, 7), (0xa00, 16), 0xb00, 0x100)
        .unwrap();
    // Write with Immediate: data, then an Immediate Data message.
    b.post_recv(5, 0);
    a.m.sends.insert(4, pattern(20, 1));
    a.c.post_write(4, 0xb00, 0x110, 20, Some(0x1122334455667788))
        .unwrap();
    pump(&mut a, &mut b);
    let c = a.completions();
    assert_eq!(
        (c[0].opcode, c[0].atomic_result),
        (WcOpcode::FetchAdd, Some(40))
    );
    assert_eq!(
        (c[1].opcode, c[1].atomic_result),
        (WcOpcode::CompSwap, Some(42))
    );
    assert_eq!(c[2].atomic_result, Some(99));
    assert_eq!(&a.m.bytes(0xa00)[0..8], &40u64.to_ne_bytes());
    assert_eq!(&a.m.bytes(0xa00)[8..16], &42u64.to_ne_bytes());
    assert_eq!(&b.m.bytes(0xb00)[..8], &99u64.to_ne_bytes());
    let cb = b.completions();
    assert_eq!(cb.len(), 1);
    assert_eq!(
        (cb[0].wr_id, cb[0].opcode, cb[0].imm),
        (5, WcOpcode::RecvRdmaWithImm, Some(0x1122334455667788))
    );
    assert_eq!(
        cb[0].byte_len, 20,
        "byte_len of a Write with Immediate: the Write's length"
    );
    assert_eq!(&b.m.bytes(0xb00)[0x10..0x24], &pattern(20, 1)[..]);
    // Send with Immediate: one receive consumed, one completion with the
    // payload and the 32-bit immediate; a plain Send after it carries none.
    b.post_recv(7, 64);
    b.post_recv(8, 64);
    a.m.sends.insert(9, pattern(33, 2));
    a.c.post_send_imm(9, SendFlags::default(), 33, 0xdead_beef)
        .unwrap();
    a.post_send(10, &pattern(5, 3), SendFlags::default());
    pump(&mut a, &mut b);
    let ca = a.completions();
    assert_eq!(
        ca.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(9, WcStatus::Success), (10, WcStatus::Success)]
    );
    let cb = b.completions();
    assert_eq!(
        cb.iter()
            .map(|c| (c.wr_id, c.opcode, c.byte_len, c.imm))
            .collect::<Vec<_>>(),
        vec![
            (7, WcOpcode::Recv, 33, Some(0xdead_beef)),
            (8, WcOpcode::Recv, 5, None)
        ]
    );
    assert_eq!(&b.m.recvs[&7][..33], &pattern(33, 2)[..]);
    // Atomic to a bad STag: remote protection error at the requester.
    a.c.post_atomic(6, AtomicOperation::fetch_add(1), (0xa00, 0), 0xbad, 0)
        .unwrap();
    pump(&mut a, &mut b);
    assert_term(&mut b, &mut a, TermCode::RDMAP_INVALID_STAG);
    assert_eq!(a.completions()[0].status, WcStatus::RemAccessErr);
}

/// Two uiw peers that negotiated RFC 7306.
fn ext_pair() -> (Peer, Peer) {
    let mut ca = Config::new(Role::Initiator);
    ca.extensions = true;
    let mut cb = Config::new(Role::Responder);
    cb.extensions = true;
    pair(ca, cb)
}

#[test]
fn masked_atomics_end_to_end() {
    // RFC 7306 §5.1.1, §5.1.2: the responder applies the masks the requester sends.
    let (mut a, mut b) = ext_pair();
    a.m.region(0xa00, 0, 64, ALL);
    b.m.region(0xb00, 0x100, 64, ALL);
    b.m.regions.get_mut(&0xb00).unwrap().data[..8].copy_from_slice(&0x0000_0001_ffff_ffffu64.to_ne_bytes());
    b.m.regions.get_mut(&0xb00).unwrap().data[8..16].copy_from_slice(&0x1100_0000_0000_1277u64.to_ne_bytes());
    // Two 32-bit fields: the low one wraps without carrying into the high one.
    let add = AtomicOperation::FetchAdd { add: 1, add_mask: 0x8000_0000_8000_0000 };
    a.c.post_atomic(1, add, (0xa00, 0), 0xb00, 0x100).unwrap();
    // Compare the low byte, swap the high byte.
    let cs = AtomicOperation::CmpSwap {
        compare: 0x77,
        compare_mask: 0xff,
        swap: 0xab00_0000_0000_0000,
        swap_mask: 0xff00_0000_0000_0000,
    };
    a.c.post_atomic(2, cs, (0xa00, 8), 0xb00, 0x108).unwrap();
    pump(&mut a, &mut b);
    let c = a.completions();
    assert_eq!(c.iter().map(|c| (c.status, c.atomic_result)).collect::<Vec<_>>(), [
        (WcStatus::Success, Some(0x0000_0001_ffff_ffff)),
        (WcStatus::Success, Some(0x1100_0000_0000_1277))
    ]);
    assert_eq!(&b.m.bytes(0xb00)[..8], &0x0000_0001_0000_0000u64.to_ne_bytes());
    assert_eq!(&b.m.bytes(0xb00)[8..16], &0xab00_0000_0000_1277u64.to_ne_bytes());
}

/// The staged copying convenience (`handle_staged`) places what `handle_bytes` places: a
/// Write's payload at the responder, and at the requester an Atomic Response's original value
/// in the result buffer (the copying API's store, which the zero-copy one leaves to the
/// completion).
#[test]
fn staged_copying_api_stores_payload_and_atomic_results() {
    let (mut a, mut b) = ext_pair();
    a.m.region(0xa00, 0, 64, ALL);
    b.m.region(0xb00, 0x100, 64, ALL);
    b.m.regions.get_mut(&0xb00).unwrap().data[16..24].copy_from_slice(&41u64.to_ne_bytes());
    a.m.sends.insert(1, pattern(16, 3));
    a.c.post_write(1, 0xb00, 0x100, 16, None).unwrap();
    let add = AtomicOperation::FetchAdd { add: 1, add_mask: 0 };
    a.c.post_atomic(2, add, (0xa00, 8), 0xb00, 0x110).unwrap();
    // Every byte through handle_staged (events taken between calls: one waiting stops it).
    let feed = |p: &mut Peer, bytes: &[u8]| {
        let mut rest = bytes;
        while !rest.is_empty() {
            p.drain();
            let n = p.c.handle_staged(rest, &mut p.m);
            assert!(n > 0, "handle_staged took nothing of {} bytes", rest.len());
            rest = &rest[n..];
        }
    };
    let request = wire_bytes(&mut a);
    feed(&mut b, &request);
    let mut response = Vec::new();
    while b.c.poll_transmit(&mut response, &b.m) {}
    feed(&mut a, &response);
    assert_eq!(&b.m.bytes(0xb00)[..16], &pattern(16, 3)[..]);
    assert_eq!(&b.m.bytes(0xb00)[16..24], &42u64.to_ne_bytes());
    assert_eq!(&a.m.bytes(0xa00)[8..16], &41u64.to_ne_bytes(), "the original value in the result buffer");
    let c = a.completions();
    assert_eq!(c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), [(1, WcStatus::Success), (2, WcStatus::Success)]);
}

#[test]
fn misaligned_atomic_is_a_remote_operation_error() {
    // RFC 7306 §8.2: a target that is not 64-bit aligned draws RDMAP / Remote Operation
    // Error / "Catastrophic error, localized to RDMAP Stream", memory untouched.
    let (mut a, mut b) = ext_pair();
    a.m.region(0xa00, 0, 64, ALL);
    b.m.region(0xb00, 0x100, 64, ALL);
    a.c.post_atomic(1, AtomicOperation::fetch_add(1), (0xa00, 0), 0xb00, 0x104).unwrap();
    pump(&mut a, &mut b);
    let t = assert_term(&mut b, &mut a, TermCode::RDMAP_CATASTROPHIC_STREAM);
    // §8.1 rule 2: the Terminated DDP Header, no Terminated RDMA Header.
    assert!(t.d && !t.r);
    assert_eq!(t.echoed_ddp().unwrap()[1], 0x4a);
    assert_eq!(a.completions()[0].status, WcStatus::RemOpErr);
    assert_eq!(b.m.bytes(0xb00), &[0u8; 64][..]);
}

#[test]
fn reserved_atomic_opcode_is_refused() {
    // RFC 7306 §5.2.1 rule 4 and §10.1: AOpCode 0x1 is reserved (there is no Swap).
    let (_a, mut b) = ext_pair();
    b.m.region(0xb00, 0, 64, ALL);
    let ar = uiw_wire::rdmap::AtomicRequest { op_word: 1, req_id: 7, stag: 0xb00, to: 8, add_swap: 5, ..Default::default() };
    let mut body = [0u8; 52];
    ar.encode(&mut body);
    let d = DdpHeader::untagged(qn::ATOMIC_REQUEST, 1, 0, 0, true, RdmapCtrl::new(Opcode::AtomicRequest));
    let mut raw = Vec::new();
    encode_fpdu(&d, &body, &[], false, &mut raw);
    let mut off = 0;
    while off < raw.len() {
        off += b.c.handle_bytes(&raw[off..], &mut b.m);
    }
    let (sent, t) = b.terminate().expect("no Terminate for a reserved AOpCode");
    assert!(sent);
    assert_eq!(t.code, TermCode::RDMAP_UNEXPECTED_OPCODE);
    assert_eq!(b.m.bytes(0xb00), &[0u8; 64][..]);
}

#[test]
fn mpa_revision1_and_ird_ord() {
    let mut ca = Config::new(Role::Initiator);
    ca.revision = 1;
    let (a, b) = pair(ca, Config::new(Role::Responder));
    assert_eq!(a.c.negotiated().unwrap().revision, 1);
    assert_eq!(b.c.negotiated().unwrap().revision, 1);
    // Revision 2: responder clamps to the initiator's words.
    let mut ca = Config::new(Role::Initiator);
    ca.ird = 4;
    ca.ord = 8;
    let mut cb = Config::new(Role::Responder);
    cb.ird = 6;
    cb.ord = 10;
    let (a, b) = pair(ca, cb);
    let (na, nb) = (a.c.negotiated().unwrap(), b.c.negotiated().unwrap());
    assert_eq!((nb.ird, nb.ord), (6, 4));
    assert_eq!(na.ord, 6);
    assert!(na.ord <= nb.ird && nb.ord <= na.ird);
}

#[test]
fn initiator_request_matches_siw_bytes() {
    let mut c = Config::new(Role::Initiator);
    c.ird = 128;
    c.ord = 128;
    let mut a = Peer::new(c);
    let mut out = Vec::new();
    assert!(a.c.poll_transmit(&mut out, &a.m));
    // siw-read.pcap frame 21
    assert_eq!(
        &out[16..],
        &[0x10, 0x02, 0x00, 0x04, 0x00, 0x80, 0x00, 0x80]
    );
    assert_eq!(&out[..16], b"MPA ID Req Frame");
}

#[test]
fn markers_request_is_rejected_like_siw() {
    let mut b = Peer::new(Config::new(Role::Responder));
    let mut req = Vec::new();
    mpa::encode_rr(
        mpa::FrameKind::Request,
        mpa::FLAG_MARKERS,
        2,
        Some(Default::default()),
        &[],
        &mut req,
    );
    let mut off = 0;
    while off < req.len() {
        off += b.c.handle_bytes(&req[off..], &mut b.m);
    }
    let mut rep = Vec::new();
    b.c.poll_transmit(&mut rep, &b.m);
    // h2g-markers.pcap frame 6
    let mut want = b"MPA ID Rep Frame".to_vec();
    want.extend_from_slice(&[0x30, 0x02, 0x00, 0x04, 0, 0, 0, 0]);
    assert_eq!(rep, want);
    assert_eq!(b.c.state(), State::Rejected);
    // And the initiator side sees the rejection.
    let mut a = Peer::new(Config::new(Role::Initiator));
    let mut out = Vec::new();
    a.c.poll_transmit(&mut out, &a.m);
    let mut off = 0;
    while off < rep.len() {
        off += a.c.handle_bytes(&rep[off..], &mut a.m);
    }
    a.drain();
    assert!(matches!(a.ev[0], Event::Rejected { by_peer: true, .. }));
    assert_eq!(a.c.state(), State::Rejected);
}

#[test]
fn p2p_rtr_variants() {
    for (w, r, s) in [
        (true, true, false),
        (false, true, false),
        (false, false, true),
    ] {
        let mut ca = Config::new(Role::Initiator);
        ca.p2p = true;
        ca.rtr = uiw_wire::conn::Rtr {
            write: w,
            read: r,
            send: s,
        };
        let mut cb = Config::new(Role::Responder);
        cb.p2p = true;
        cb.rtr = uiw_wire::conn::Rtr {
            write: true,
            read: true,
            send: true,
        };
        let (mut a, mut b) = (Peer::new(ca), Peer::new(cb));
        // Responder must not send before the RTR: it is in WaitRtr after the Request.
        let mut buf = Vec::new();
        a.c.poll_transmit(&mut buf, &a.m);
        let mut off = 0;
        while off < buf.len() {
            off += b.c.handle_bytes(&buf[off..], &mut b.m);
        }
        assert_eq!(b.c.state(), State::WaitRtr);
        b.post_send(1, b"early", SendFlags::default());
        a.post_recv(3, 10);
        pump(&mut a, &mut b);
        b.drain();
        a.drain();
        assert_eq!(
            b.c.state(),
            State::Established,
            "rtr {w}{r}{s}: {:?} {:?}",
            b.ev,
            a.ev
        );
        assert!(a.c.negotiated().unwrap().p2p);
        // The early Send went out after the RTR.
        let c = a.completions();
        assert_eq!(
            (c[0].wr_id, c[0].byte_len),
            (3, 5),
            "rtr {w}{r}{s}: {:?}",
            a.ev
        );
        assert_eq!(&a.m.recvs[&3][..5], b"early");
        // A later Send from a uses the right MSN (after a Send RTR).
        b.post_recv(4, 10);
        a.post_send(9, b"x", SendFlags::default());
        pump(&mut a, &mut b);
        assert_eq!(
            b.completions().iter().filter(|c| c.wr_id == 4).count(),
            1,
            "rtr {w}{r}{s}"
        );
    }
}

#[test]
fn siw_style_write_rtr_bytes() {
    let mut ca = Config::new(Role::Initiator);
    ca.p2p = true;
    ca.ird = 0;
    ca.ord = 1;
    let mut a = Peer::new(ca);
    let mut out = Vec::new();
    a.c.poll_transmit(&mut out, &a.m);
    // siw-write-p2p.pcap frame 4: private data 8000c001
    assert_eq!(&out[20..24], &[0x80, 0x00, 0xc0, 0x01]);
    // siw's reply (frame 6): 80018000 → zero-length Write RTR (frame 8).
    let mut rep = b"MPA ID Rep Frame".to_vec();
    rep.extend_from_slice(&[0x10, 0x02, 0x00, 0x04, 0x80, 0x01, 0x80, 0x00]);
    let mut off = 0;
    while off < rep.len() {
        off += a.c.handle_bytes(&rep[off..], &mut a.m);
    }
    let mut rtr = Vec::new();
    a.c.poll_transmit(&mut rtr, &a.m);
    assert_eq!(
        rtr,
        [0x00, 0x0e, 0xc1, 0x40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    );
}

#[test]
fn terminate_bytes_are_rfc_layout() {
    let (mut a, mut b) = default_pair();
    a.post_send(1, b"x", SendFlags::default());
    let mut buf = Vec::new();
    while a.c.poll_transmit(&mut buf, &a.m) {}
    let mut off = 0;
    while off < buf.len() {
        off += b.c.handle_bytes(&buf[off..], &mut b.m);
    }
    let mut out = Vec::new();
    while b.c.poll_transmit(&mut out, &b.m) {}
    let (f, _) = parse_fpdu(&out).unwrap();
    assert_eq!(f.ddp.rdmap.op(), Some(Opcode::Terminate));
    assert_eq!(
        f.ddp,
        DdpHeader::untagged(
            qn::TERMINATE,
            1,
            0,
            0,
            true,
            RdmapCtrl::new(Opcode::Terminate)
        )
    );
    // layer DDP (1) in the high nibble, untagged (2) low, code 2, M|D.
    assert_eq!(&f.payload[..6], &[0x12, 0x02, 0xc0, 0x00, 0x00, 0x13]);
    let (_, layout) = Terminate::parse(f.payload).unwrap();
    assert_eq!(layout, TermLayout::Rfc);
    // Nothing else is sent after a Terminate; further input is discarded.
    assert!(b.c.wants_close());
    assert!(!b.c.poll_transmit(&mut out, &b.m));
    assert_eq!(b.c.handle_bytes(&[1, 2, 3], &mut b.m), 3);
}

#[test]
fn timeouts_and_eof() {
    let mut a = Peer::new(Config::new(Role::Initiator));
    let d = a.c.poll_timeout().unwrap();
    a.c.handle_timeout(d - 1);
    assert_eq!(a.c.state(), State::WaitReply);
    a.c.handle_timeout(d);
    a.drain();
    assert_eq!(a.ev, vec![Event::Failed(Failure::Timeout)]);
    let (mut a, _b) = default_pair();
    a.post_recv(1, 10);
    a.c.handle_eof();
    let c = a.completions();
    assert_eq!((c[0].wr_id, c[0].status), (1, WcStatus::WrFlushErr));
    assert!(a.ev.contains(&Event::Failed(Failure::PeerClosed)));
    let (mut a, _b) = default_pair();
    a.post_recv(1, 10);
    a.c.close();
    assert_eq!(a.completions()[0].status, WcStatus::WrFlushErr);
    assert_eq!(a.c.state(), State::Closed);
    assert!(a.c.post_recv(2, 1).is_err());
}

/// The zero-copy path: the sender gathers payload by Source and computes
/// the trailer itself; the receiver reads exactly the bytes `rx_want`
/// asks for and receives payload straight into the target memory.
/// What `p` transmits, through the zero-copy transmit API, as the byte stream a socket would
/// carry.
fn wire_bytes(p: &mut Peer) -> Vec<u8> {
    let mut pipe = Vec::new();
    while let Some(tx) = p.c.next_tx() {
        match tx {
            Tx::Bytes(v) => pipe.extend_from_slice(&v),
            Tx::Segment(s) => {
                let (wr, off) = match s.source {
                    Source::Wr { wr_id, offset } => (wr_id, offset as usize),
                    _ => unreachable!(),
                };
                let payload = &p.m.sends[&wr][off..off + s.payload_len as usize];
                pipe.extend_from_slice(s.header.as_slice());
                pipe.extend_from_slice(payload); // iovec in real life
                pipe.extend_from_slice(s.trailer(&[payload]).as_slice());
            }
        }
    }
    pipe
}

/// `rx_staged` on `data`, the payload it places recorded (and written into `p`'s memory after).
fn staged(p: &mut Peer, data: &[u8], limit: usize) -> (usize, Vec<(Placement, usize)>) {
    let mut placed = Vec::new();
    let mut writes = Vec::new();
    let k = p.c.rx_staged(data, &mut p.m, |at, bytes| {
        let n = bytes.len().min(limit);
        placed.push((at, n));
        writes.push((at, bytes[..n].to_vec()));
        n
    });
    for (at, bytes) in writes {
        p.m.write(at, &bytes);
    }
    (k, placed)
}

/// Staged bytes go through the core in one call, FPDU after FPDU, until a completion is there
/// to hand out; a payload not placed at all stops the call with the segment's header taken
/// and its payload still wanted, and one placed in parts is asked for part after part.
#[test]
fn staged_api_takes_fpdus_until_an_event() {
    let (mut a, mut b) = default_pair();
    b.m.region(0xb00, 0x1000, 256, ALL);
    for (i, wr) in [1u64, 2, 3].into_iter().enumerate() {
        a.m.sends.insert(wr, pattern(64, wr as u8));
        a.c.post_write(wr, 0xb00, 0x1000 + 64 * i as u64, 64, None).unwrap();
    }
    b.post_recv(7, 100);
    a.post_send(4, &pattern(100, 4), SendFlags::default());
    a.m.sends.insert(5, pattern(64, 5));
    a.c.post_write(5, 0xb00, 0x10c0, 64, None).unwrap();
    let pipe = wire_bytes(&mut a);
    // The three Writes and the Send, not the Write after it: the Send's completion waits.
    let (k, placed) = staged(&mut b, &pipe, usize::MAX);
    let send_end = pipe.len() - (2 + 14 + 64 + 4);
    assert_eq!(k, send_end, "stops after the Send");
    assert_eq!(
        placed,
        vec![
            (Placement::Tagged { stag: 0xb00, to: 0x1000 }, 64),
            (Placement::Tagged { stag: 0xb00, to: 0x1040 }, 64),
            (Placement::Tagged { stag: 0xb00, to: 0x1080 }, 64),
            (Placement::Recv { wr_id: 7, offset: 0 }, 100),
        ]
    );
    let c = b.completions();
    assert_eq!((c.len(), c[0].wr_id, c[0].byte_len), (1, 7, 100));
    assert_eq!(&b.m.recvs[&7][..], &pattern(100, 4)[..]);
    // The last Write: nothing placed, its header taken, its payload wanted; then in parts.
    let rest = &pipe[send_end..];
    let (k, placed) = staged(&mut b, rest, 0);
    assert_eq!((k, placed.len()), (2 + 14, 1));
    assert_eq!(b.c.rx_want(), RxWant::Place { len: 64, place: Placement::Tagged { stag: 0xb00, to: 0x10c0 } });
    // Placed 24 bytes at a time (a receive's SGEs end so): the rest asked for where it goes.
    let (k2, placed) = staged(&mut b, &rest[k..], 24);
    assert_eq!(k + k2, rest.len());
    let at = |to| Placement::Tagged { stag: 0xb00, to };
    assert_eq!(placed, vec![(at(0x10c0), 24), (at(0x10d8), 24), (at(0x10f0), 16)]);
    let mut want = Vec::new();
    for wr in [1u8, 2, 3, 5] {
        want.extend(pattern(64, wr));
    }
    assert_eq!(b.m.bytes(0xb00), &want[..]);
    assert!(b.completions().is_empty() && b.terminate().is_none());
}

#[test]
fn zero_copy_api() {
    let (mut a, mut b) = default_pair();
    b.m.region(0xb00, 0, 100_000, ALL);
    a.m.sends.insert(1, pattern(100_000, 8));
    a.c.post_write(1, 0xb00, 0, 100_000, None).unwrap();
    b.post_recv(2, 5000);
    a.post_send(3, &pattern(4000, 9), SendFlags::default());
    let pipe = wire_bytes(&mut a);
    let mut pos = 0;
    let mut placed_direct = 0usize;
    while pos < pipe.len() {
        match b.c.rx_want() {
            RxWant::Bytes(n) => {
                let n = n.min(pipe.len() - pos).min(7); // short reads too
                let k = b.c.rx_bytes(&pipe[pos..pos + n], &mut b.m);
                assert_eq!(k, n);
                pos += k;
            }
            RxWant::Place { len, place } => {
                // recv() directly into the destination
                let n = (len as usize).min(pipe.len() - pos).min(1000);
                let src = pipe[pos..pos + n].to_vec();
                b.m.write(place, &src);
                let k = b.c.rx_placed(&src, &mut b.m);
                assert_eq!(k, n);
                placed_direct += n;
                pos += n;
            }
            RxWant::Discard | RxWant::Wait => panic!("discard"),
        }
    }
    assert_eq!(placed_direct, 104_000);
    assert!(b.m.bytes(0xb00) == &pattern(100_000, 8)[..]);
    assert_eq!(&b.m.recvs[&2][..4000], &pattern(4000, 9)[..]);
    assert_eq!(b.completions()[0].byte_len, 4000);
}

#[test]
fn manual_accept_and_reject() {
    let mut ca = Config::new(Role::Initiator);
    ca.private_data = b"hello server".to_vec();
    ca.ird = 3;
    ca.ord = 5;
    let mut cb = Config::new(Role::Responder);
    cb.manual_accept = true;
    let (mut a, mut b) = (Peer::new(ca.clone()), Peer::new(cb.clone()));
    pump(&mut a, &mut b);
    b.drain();
    let Event::ConnectRequest(r) = b.ev.remove(0) else {
        panic!("{:?}", b.ev)
    };
    assert_eq!(r.private_data, b"hello server");
    assert_eq!(r.ird_ord.map(|x| (x.ird, x.ord)), Some((3, 5)));
    assert_eq!(b.c.state(), State::WaitAccept);
    assert_eq!(b.c.handle_bytes(&[1], &mut b.m), 0);
    b.c.accept(8, 8, b"hi client", 0).unwrap();
    pump(&mut a, &mut b);
    a.drain();
    let Event::Established(n) = &a.ev[0] else {
        panic!()
    };
    assert_eq!(n.private_data, b"hi client");
    assert_eq!((n.ird, n.ord), (3, 5));
    assert_eq!(b.c.negotiated().unwrap().ird, 5);
    assert_eq!(b.c.negotiated().unwrap().ord, 3);
    // Reject
    let (mut a, mut b) = (Peer::new(ca), Peer::new(cb));
    pump(&mut a, &mut b);
    b.c.reject(b"go away").unwrap();
    pump(&mut a, &mut b);
    a.drain();
    assert_eq!(
        a.ev,
        vec![Event::Rejected {
            by_peer: true,
            private_data: b"go away".to_vec()
        }]
    );
    assert_eq!(b.c.state(), State::Rejected);
}

#[test]
fn fence_waits_for_reads() {
    let (mut a, mut b) = default_pair();
    a.m.region(0xa00, 0, 4096, ALL);
    b.m.region(0xb00, 0, 4096, ALL);
    b.m.fill(0xb00, 3);
    b.post_recv(9, 100);
    a.c.post_read(1, 0xa00, 0, 0xb00, 0, 100).unwrap();
    a.c.post_fence().unwrap();
    a.post_send(2, b"after", SendFlags::default());
    // Only the Read Request goes out until its response is back.
    let mut buf = Vec::new();
    let mut n = 0;
    while a.c.poll_transmit(&mut buf, &a.m) {
        n += 1;
    }
    assert_eq!(n, 1);
    let mut off = 0;
    while off < buf.len() {
        off += b.c.handle_bytes(&buf[off..], &mut b.m);
    }
    pump(&mut a, &mut b);
    let c = a.completions();
    assert_eq!(c.iter().map(|c| c.wr_id).collect::<Vec<_>>(), vec![1, 2]);
    assert_eq!(b.completions()[0].byte_len, 5);
}

#[test]
fn ulpdu_longer_than_accepted_is_terminated() {
    // A tagged Write header announcing a 65534-byte ULPDU: larger than any MPA sender may
    // form (MAX_ULPDU), refused from the length field alone.
    let (_a, mut b) = default_pair();
    let mut raw = vec![0xff, 0xfe];
    let mut h = [0u8; 32];
    let n = DdpHeader::tagged(0x1234_5600, 0, true, RdmapCtrl::new(Opcode::Write)).encode(&mut h);
    raw.extend_from_slice(&h[..n]);
    raw.extend_from_slice(&[0u8; 64]);
    let used = b.c.handle_bytes(&raw, &mut b.m);
    assert!(used <= raw.len());
    let (sent, t) = b.terminate().expect("no Terminate for a 65534-byte ULPDU");
    assert!(sent);
    assert_eq!(t.code, TermCode::DDP_LOCAL_CATASTROPHIC);
    assert_eq!(b.c.state(), State::Error);

    // A receiver configured for smaller FPDUs refuses a peer that exceeds them, and the
    // sender hears why.
    let mut ca = Config::new(Role::Initiator);
    ca.mss = 9000;
    let mut cb = Config::new(Role::Responder);
    cb.max_rx_ulpdu = 1448 - 6;
    let (mut a, mut b) = pair(ca, cb);
    b.post_recv(1, 4000);
    a.post_send(1, &pattern(4000, 3), SendFlags::default());
    pump(&mut a, &mut b);
    assert_term(&mut b, &mut a, TermCode::DDP_LOCAL_CATASTROPHIC);
    assert_eq!(b.completions()[0].status, WcStatus::WrFlushErr);
}

/// A larger MSS learnt mid-connection (`set_mss`, as the TCP window opens) makes the messages
/// segmented after it use larger FPDUs — Sends, Writes and Read Responses alike —, and the
/// peer places them all intact; a smaller one shrinks them again. (Tagged FPDUs carry 14
/// header bytes, untagged ones 18: see `large_messages_segmented_by_mss`.)
#[test]
fn fpdus_follow_the_mss_set_mid_connection() {
    const N: usize = 200_000;
    let (mut a, mut b) = default_pair();
    let tagged = |mss: usize| N.div_ceil(mpa::mulpdu(mss) - 14);
    let untagged = |mss: usize| N.div_ceil(mpa::mulpdu(mss) - 18);
    assert_eq!(a.c.mulpdu(), mpa::mulpdu(1460));
    a.m.region(0xa00, 0x5000_0000, N, ALL);
    b.m.region(0xb00, 0x4000_0000, N, ALL);
    let mut id = 0;
    let mut send = |a: &mut Peer, b: &mut Peer| {
        id += 1;
        b.post_recv(id, N);
        a.post_send(id, &pattern(N, id as u8), SendFlags::default());
        let (na, _) = pump(a, b);
        assert!(b.m.recvs[&id] == pattern(N, id as u8), "Send {id} placed intact");
        assert_eq!(b.completions()[0].status, WcStatus::Success);
        a.completions();
        na
    };
    assert_eq!(send(&mut a, &mut b), untagged(1460));
    a.c.set_mss(32741);
    assert_eq!(a.c.mulpdu(), mpa::mulpdu(32741));
    assert_eq!(send(&mut a, &mut b), untagged(32741));
    a.m.sends.insert(100, pattern(N, 5));
    a.c.post_write(100, 0xb00, 0x4000_0000, N as u32, None).unwrap();
    assert_eq!(pump(&mut a, &mut b).0, tagged(32741));
    assert!(b.m.bytes(0xb00) == &pattern(N, 5)[..], "Write placed intact");
    // A Read Response is segmented by the responder's MSS.
    b.m.fill(0xb00, 9);
    b.c.set_mss(65483);
    a.c.post_read(101, 0xa00, 0x5000_0000, 0xb00, 0x4000_0000, N as u32).unwrap();
    assert_eq!(pump(&mut a, &mut b).1, tagged(65483));
    assert!(a.m.bytes(0xa00) == b.m.bytes(0xb00), "Read Response placed intact");
    a.completions();
    a.c.set_mss(1460);
    assert_eq!(send(&mut a, &mut b), untagged(1460), "a smaller MSS shrinks the FPDUs again");
}

/// Traffic counters: messages, FPDUs and payload bytes on both sides agree with what was
/// posted; the RTR is not traffic; a Terminate counts on both sides.
#[test]
fn counters_count_messages_fpdus_bytes_and_terminates() {
    let mut ca = Config::new(Role::Initiator);
    ca.p2p = true;
    ca.rtr = uiw_wire::conn::Rtr { write: true, read: false, send: false };
    let mut cb = Config::new(Role::Responder);
    cb.p2p = true;
    cb.rtr = uiw_wire::conn::Rtr { write: true, read: true, send: true };
    let (mut a, mut b) = (Peer::new(ca), Peer::new(cb));
    pump(&mut a, &mut b);
    assert_eq!((a.c.state(), b.c.state()), (State::Established, State::Established));
    assert_eq!(*a.c.counters(), Counters::default(), "MPA and the RTR are not traffic");
    assert_eq!(*b.c.counters(), Counters::default(), "MPA and the RTR are not traffic");

    b.m.region(0xb00, 0x7000_0000, 1 << 20, ALL);
    for i in 0..2 {
        b.post_recv(10 + i, 100);
    }
    a.post_send(1, &pattern(100, 1), SendFlags::default());
    a.post_send(2, &pattern(0, 0), SendFlags::default());
    // 200 KB: many FPDUs, one message.
    a.m.sends.insert(3, pattern(200_000, 5));
    a.c.post_write(3, 0xb00, 0x7000_0000, 200_000, None).unwrap();
    pump(&mut a, &mut b);
    let (ta, tb) = (*a.c.counters(), *b.c.counters());
    assert_eq!((ta.tx_msgs, tb.rx_msgs), (3, 3), "{ta:?} {tb:?}");
    assert_eq!((ta.tx_bytes, tb.rx_bytes), (200_100, 200_100), "{ta:?} {tb:?}");
    assert!(ta.tx_fpdus > 3 && ta.tx_fpdus == tb.rx_fpdus, "{ta:?} {tb:?}");
    assert_eq!((ta.rx_msgs, ta.rx_fpdus, tb.tx_msgs, tb.tx_fpdus), (0, 0, 0, 0));
    assert_eq!((ta.tx_terminates, tb.rx_terminates), (0, 0));

    // A Read: one Request out, one (data) Response back.
    a.m.region(0xa00, 0x10000, 4096, ALL);
    a.c.post_read(4, 0xa00, 0x10000, 0xb00, 0x7000_0000, 1000).unwrap();
    pump(&mut a, &mut b);
    let (ta, tb) = (*a.c.counters(), *b.c.counters());
    assert_eq!((ta.tx_msgs, ta.rx_msgs, ta.rx_bytes), (4, 1, 1000), "{ta:?}");
    assert_eq!((tb.rx_msgs, tb.tx_msgs, tb.tx_bytes), (4, 1, 1000), "{tb:?}");

    // A Write to a bad STag draws a Terminate: sent by b, received by a.
    a.m.sends.insert(5, pattern(10, 1));
    a.c.post_write(5, 0xdead00, 0, 10, None).unwrap();
    pump(&mut a, &mut b);
    let (ta, tb) = (*a.c.counters(), *b.c.counters());
    assert_eq!((tb.tx_terminates, ta.rx_terminates), (1, 1), "{ta:?} {tb:?}");
    assert_eq!((ta.tx_terminates, tb.rx_terminates), (0, 0), "{ta:?} {tb:?}");
}

/// With `rnr_wait_ms`, a Send that finds no receive waits for one, reading nothing more
/// (TCP holds the sender back), goes on when one is posted, and draws the "no buffer"
/// Terminate only when the wait runs out.
#[test]
fn send_waits_for_a_receive_within_rnr_wait() {
    let mut cb = Config::new(Role::Responder);
    cb.rnr_wait_ms = 1000;
    let (mut a, mut b) = pair(Config::new(Role::Initiator), cb);
    a.post_send(1, b"early", SendFlags::default());
    a.post_send(2, b"second", SendFlags::default());
    let mut buf = Vec::new();
    while a.c.poll_transmit(&mut buf, &a.m) {}
    let mut off = 0;
    let feed = |b: &mut Peer, off: &mut usize| loop {
        let k = b.c.handle_bytes(&buf[*off..], &mut b.m);
        *off += k;
        if k == 0 || *off == buf.len() {
            break;
        }
    };
    feed(&mut b, &mut off);
    assert!(b.c.rx_stalled() && off < buf.len(), "the first Send's payload is left unread");
    assert!(b.terminate().is_none());
    // The wait's clock starts at the first timer call after the stall.
    assert_eq!(b.c.poll_timeout(), Some(0));
    b.c.handle_timeout(100);
    assert_eq!(b.c.poll_timeout(), Some(1100));
    b.post_recv(7, 16);
    assert!(!b.c.rx_stalled());
    feed(&mut b, &mut off);
    let c = b.completions();
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!((c[0].wr_id, c[0].status, c[0].byte_len), (7, WcStatus::Success, 5));
    assert_eq!(&b.m.recvs[&7][..5], b"early");
    // The second Send waits in turn, then runs out of time.
    assert!(b.c.rx_stalled() && off < buf.len());
    b.c.handle_timeout(200);
    b.c.handle_timeout(1199);
    assert!(b.terminate().is_none());
    b.c.handle_timeout(1200);
    assert!(!b.c.rx_stalled());
    assert_eq!(b.c.poll_timeout(), None);
    pump(&mut a, &mut b);
    assert_term(&mut b, &mut a, TermCode::DDP_U_NO_BUFFER);
}

/// A receive whose memory the engine cannot place into (absent or invalid buffer, checked
/// only when bytes arrive, as siw does): `fail_placement` ends the stream with the DDP
/// catastrophic Terminate siw sends, and that receive completes with LocProtErr.
#[test]
fn placement_failure_terminates_like_siw() {
    let (mut a, mut b) = default_pair();
    b.post_recv(5, 16);
    b.post_recv(6, 16);
    a.post_send(1, b"hello", SendFlags::default());
    let mut buf = Vec::new();
    while a.c.poll_transmit(&mut buf, &a.m) {}
    let mut off = 0;
    // Framing bytes up to the payload, which the engine would place.
    while !matches!(b.c.rx_want(), RxWant::Place { .. }) {
        off += b.c.rx_bytes(&buf[off..], &mut b.m);
    }
    assert!(matches!(b.c.rx_want(), RxWant::Place { place: Placement::Recv { wr_id: 5, offset: 0 }, .. }));
    b.c.fail_placement();
    pump(&mut a, &mut b);
    let t = assert_term(&mut b, &mut a, TermCode::DDP_LOCAL_CATASTROPHIC);
    assert!(t.m && t.d);
    let c = b.completions();
    assert_eq!((c[0].wr_id, c[0].status), (5, WcStatus::LocProtErr), "{c:?}");
    assert_eq!((c[1].wr_id, c[1].status), (6, WcStatus::WrFlushErr), "{c:?}");
}

/// A Local Invalidate puts nothing on the wire and completes in posting order: after the
/// Read posted before it.
#[test]
fn local_work_request_completes_in_order() {
    let (mut a, mut b) = default_pair();
    b.m.region(0x700, 0x2000, 64, ALL);
    a.m.region(0x800, 0x3000, 64, ALL);
    a.c.post_read(1, 0x800, 0x3000, 0x700, 0x2000, 64).unwrap();
    a.c.post_local(2).unwrap();
    let mut buf = Vec::new();
    while a.c.poll_transmit(&mut buf, &a.m) {}
    assert!(a.completions().is_empty(), "the Local waits behind the outstanding Read");
    let mut off = 0;
    while off < buf.len() {
        off += b.c.handle_bytes(&buf[off..], &mut b.m);
    }
    pump(&mut a, &mut b);
    let c = a.completions();
    let got: Vec<_> = c.iter().map(|c| (c.wr_id, c.opcode, c.status)).collect();
    assert_eq!(got, [(1, WcOpcode::RdmaRead, WcStatus::Success), (2, WcOpcode::LocalInv, WcStatus::Success)]);
}

#[test]
fn inbound_atomics_count_against_ird() {
    // RFC 7306 §5: Atomic Requests use the responder's IRD like Read Requests. A peer that
    // sends a Read and an Atomic back to back against IRD 1 gets a Terminate.
    let mut ca = Config::new(Role::Initiator);
    ca.extensions = true;
    let mut cb = Config::new(Role::Responder);
    cb.extensions = true;
    cb.ird = 1;
    let (_a, mut b) = pair(ca, cb);
    b.m.region(0xb00, 0, 4096, ALL);
    let mut raw = Vec::new();
    let rr = ReadRequest { sink_stag: 0xa00, sink_to: 0, size: 8, src_stag: 0xb00, src_to: 0 };
    let mut body = [0u8; 28];
    rr.encode(&mut body);
    let d = DdpHeader::untagged(qn::READ_REQUEST, 1, 0, 0, true, RdmapCtrl::new(Opcode::ReadRequest));
    encode_fpdu(&d, &body, &[], false, &mut raw);
    let ar = uiw_wire::rdmap::AtomicRequest { op_word: 0, req_id: 7, stag: 0xb00, to: 8, add_swap: 1, ..Default::default() };
    let mut body = [0u8; 52];
    ar.encode(&mut body);
    // RFC 7306 §5.2: the Atomic Request follows the Read Request on queue 1, so MSN 2.
    let d = DdpHeader::untagged(qn::ATOMIC_REQUEST, 2, 0, 0, true, RdmapCtrl::new(Opcode::AtomicRequest));
    encode_fpdu(&d, &body, &[], false, &mut raw);
    let mut off = 0;
    while off < raw.len() {
        off += b.c.handle_bytes(&raw[off..], &mut b.m);
    }
    let (sent, t) = b.terminate().expect("no Terminate for an atomic over IRD");
    assert!(sent);
    assert_eq!(t.code, TermCode::RDMAP_CATASTROPHIC_STREAM);
    // The atomic was not performed.
    assert_eq!(&b.m.bytes(0xb00)[8..16], &[0u8; 8]);
}

/// siw's `siw_accept` sends the MPA Reply before it hooks the stream to the QP; an FPDU
/// that lands in between is not read until another segment arrives (captures README W13),
/// and a request/response ULP (perftest's rdma_cm exchange) then waits forever. With
/// `first_fpdu_hold_ms`, an initiator facing a responder that is not uiw (no extension
/// flag in its Reply) sends nothing after the Reply — not even a P2P RTR — until the hold
/// has run out on its clock; towards a uiw responder nothing is held.
#[test]
fn first_fpdu_held_towards_siw_responder() {
    let held_pair = |ext_b: bool, p2p: bool| {
        let mut ca = Config::new(Role::Initiator);
        ca.extensions = true;
        ca.first_fpdu_hold_ms = 50;
        ca.p2p = p2p;
        let mut cb = Config::new(Role::Responder);
        cb.extensions = ext_b;
        cb.p2p = p2p;
        pair(ca, cb)
    };

    // siw-like responder: held until 50 ms after the clock starts
    let (mut a, mut b) = held_pair(false, false);
    assert!(a.c.tx_held());
    assert!(!b.c.tx_held(), "a responder never holds");
    assert_eq!(a.c.poll_timeout(), Some(0), "the hold asks for its clock at once");
    b.post_recv(7, 64);
    a.post_send(1, &pattern(40, 9), SendFlags::default());
    let mut out = Vec::new();
    assert!(!a.c.poll_transmit(&mut out, &a.m), "first FPDU sent during the hold");
    a.c.handle_timeout(1000); // the clock starts: hold until 1050
    assert_eq!(a.c.poll_timeout(), Some(1050));
    a.c.handle_timeout(1049);
    assert!(a.c.tx_held());
    assert!(!a.c.poll_transmit(&mut out, &a.m), "sent before the hold ran out");
    a.c.handle_timeout(1050);
    assert!(!a.c.tx_held());
    assert_eq!(a.c.poll_timeout(), None);
    pump(&mut a, &mut b);
    let rc = b.completions();
    assert_eq!(rc.len(), 1);
    assert_eq!(rc[0].status, WcStatus::Success);
    assert_eq!(b.m.recvs[&7][..40], pattern(40, 9)[..]);
    assert_eq!(a.completions()[0].status, WcStatus::Success);

    // uiw responder (extensions offered back): nothing held
    let (a, _b) = held_pair(true, false);
    assert!(!a.c.tx_held());
    // P2P: the RTR is the first FPDU and is held as well (siw hooks its RTR reader after
    // the Reply, and an RTR sent at once sat unread with the Send behind it)
    let (mut a, mut b) = {
        let mut ca = Config::new(Role::Initiator);
        ca.extensions = true;
        ca.first_fpdu_hold_ms = 50;
        ca.p2p = true;
        let mut cb = Config::new(Role::Responder);
        cb.p2p = true;
        (Peer::new(ca), Peer::new(cb))
    };
    pump(&mut a, &mut b);
    assert_eq!(a.c.state(), State::Established);
    assert!(a.c.tx_held());
    assert_eq!(b.c.state(), State::WaitRtr);
    a.c.handle_timeout(0);
    a.c.handle_timeout(50);
    pump(&mut a, &mut b);
    assert_eq!(b.c.state(), State::Established, "RTR not sent after the hold");

    // a failure during the hold still lets the Terminate / close through
    let (mut a, _b) = held_pair(false, false);
    a.c.handle_eof();
    assert!(!a.c.tx_held());
    assert_eq!(a.c.poll_timeout(), None);
}

/// siw answers a Request with a Reply built from the Request's own header, so every flag
/// bit we send comes back — the reserved bit uiw uses to offer RFC 7306 included. Bytes
/// from a uiw → siw (Linux 6.12) connection with UIW_CRC=1 (`ci/siw-interop.sh`,
/// crc-uiw-h2g-read): Request flags 0x51 (C, enhanced, uiw offer), Reply flags 0x51.
/// Such a Reply must not switch the extensions on (siw would Terminate an Immediate Data
/// or Atomic opcode), and the first FPDU must be held as towards any siw responder.
#[test]
fn siw_echoed_offer_bit_is_not_an_acceptance() {
    let mut cfg = Config::new(Role::Initiator);
    cfg.extensions = true;
    cfg.crc = true;
    cfg.ird = 1;
    cfg.ord = 1;
    cfg.first_fpdu_hold_ms = 50;
    let mut a = Peer::new(cfg);
    let mut out = Vec::new();
    assert!(a.c.poll_transmit(&mut out, &a.m));
    let request = hex("4d504120494420526571204672616d655102000400010001");
    assert_eq!(out, request, "our Request differs from the captured one");
    let reply = hex("4d504120494420526570204672616d655102000400010000");
    assert_eq!(reply[16], request[16], "siw echoed the flags byte");
    let mut off = 0;
    while off < reply.len() {
        off += a.c.handle_bytes(&reply[off..], &mut a.m);
    }
    assert_eq!(a.c.state(), State::Established);
    let neg = a.c.negotiated().unwrap().clone();
    assert!(!neg.extensions, "echoed offer bit taken for an acceptance");
    assert!(neg.crc);
    assert!(a.c.tx_held(), "first FPDU towards siw not held");
    // an RFC 7306 operation now fails locally instead of reaching siw
    assert!(a.c.post_write(9, 0x1000, 0, 8, Some(7)).is_err());

    // a uiw responder answers the offer with the acknowledgement bit, not the offer bit
    let mut b = Peer::new({
        let mut c = Config::new(Role::Responder);
        c.extensions = true;
        c
    });
    let mut off = 0;
    while off < request.len() {
        off += b.c.handle_bytes(&request[off..], &mut b.m);
    }
    let mut rep = Vec::new();
    while b.c.poll_transmit(&mut rep, &b.m) {}
    assert_eq!(rep[16] & (mpa::FLAG_UIW_EXT | mpa::FLAG_UIW_EXT_ACK), mpa::FLAG_UIW_EXT_ACK);
    assert!(b.c.negotiated().unwrap().extensions);
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// The Initiator's wait for the MPA Reply is `reply_timeout_ms`, not `mpa_timeout_ms`: the
/// Reply waits for the responder's application to accept, which may take longer than the
/// stack's own negotiation steps (fabtests' servers set up a buffer of `max_msg_sz` bytes
/// between CONNECT_REQUEST and `rdma_accept`). An accept after `mpa_timeout_ms` but before
/// `reply_timeout_ms` connects; no Reply by `reply_timeout_ms` fails the Initiator.
#[test]
fn slow_accept_within_reply_timeout_connects() {
    let mut ca = Config::new(Role::Initiator);
    ca.mpa_timeout_ms = 1_000;
    ca.reply_timeout_ms = 5_000;
    let mut cb = Config::new(Role::Responder);
    cb.manual_accept = true;
    cb.mpa_timeout_ms = 1_000;
    let (mut a, mut b) = (Peer::new(ca.clone()), Peer::new(cb.clone()));
    // The responder's wait for the Request is still the stack's timeout.
    assert_eq!(b.c.poll_timeout(), Some(1_000));
    assert_eq!(a.c.poll_timeout(), Some(5_000));
    pump(&mut a, &mut b);
    b.drain();
    assert!(matches!(b.ev.remove(0), Event::ConnectRequest(_)), "{:?}", b.ev);
    // The application accepts 3 s later: past mpa_timeout_ms, within reply_timeout_ms.
    a.c.handle_timeout(3_000);
    b.c.handle_timeout(3_000);
    assert_eq!(a.c.state(), State::WaitReply);
    assert_eq!(b.c.state(), State::WaitAccept);
    b.c.accept(8, 8, b"", 3_000).unwrap();
    pump(&mut a, &mut b);
    assert_eq!(a.c.state(), State::Established, "{:?}", a.ev);
    assert_eq!(b.c.state(), State::Established, "{:?}", b.ev);
    // No accept at all: the Initiator gives up at reply_timeout_ms.
    let (mut a, mut b) = (Peer::new(ca), Peer::new(cb));
    pump(&mut a, &mut b);
    a.c.handle_timeout(4_999);
    assert_eq!(a.c.state(), State::WaitReply);
    a.c.handle_timeout(5_000);
    a.drain();
    assert_eq!(a.ev, vec![Event::Failed(Failure::Timeout)]);
}

/// A Send or Write framed by `Connection::send_lone`, or a Read Request by
/// `Connection::read_lone`, leaves the same bytes, moves both connections the same way (MSNs,
/// sequence numbers, the outstanding Reads, counters) and completes the same as the same
/// message posted and taken by `next_tx` — for every message that qualifies (a Send or Write
/// whose payload fits one FPDU with nothing else waiting to go out or to complete; a Read
/// with nothing waiting to go out and room under the ORD), and the lone path declines every
/// other one (larger payloads, a Read outstanding, messages queued behind others, ORD
/// reached), which then take the general path. Two pairs run the same script, one posting
/// every message, the other trying `send_lone` first; CRC off and on.
#[test]
fn lone_messages_match_the_general_path() {
    for crc in [false, true] {
        let cfg = |role| {
            let mut c = Config::new(role);
            c.crc = crc;
            // A batch of Reads reaches the ORD.
            (c.ird, c.ord) = (1, 1);
            c
        };
        let (mut a1, mut b1) = pair(cfg(Role::Initiator), cfg(Role::Responder));
        let (mut a2, mut b2) = pair(cfg(Role::Initiator), cfg(Role::Responder));
        let mulpdu = a1.c.mulpdu();
        for p in [&mut a1, &mut a2] {
            p.m.region(0xa00, 0x10000, 8192, ALL);
        }
        for p in [&mut b1, &mut b2] {
            p.m.region(0xb00, 0x7000_0000, 8192, ALL);
            p.m.fill(0xb00, 3);
        }
        // (a's completions, bytes a sent) per pair.
        let (mut done1, mut done2) = (Vec::new(), Vec::new());
        let (mut wire1, mut wire2) = (Vec::new(), Vec::new());
        let mut lone = 0;
        let mut declined = 0;
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let mut wr_id = 0u64;
        for round in 0..300 {
            // Mostly one message per round (the lone path's case); sometimes a batch, whose
            // later messages queue behind the first.
            let batch = if next(4) == 0 { 2 + next(3) } else { 1 };
            for _ in 0..batch {
                wr_id += 1;
                let len = match next(6) {
                    0 => 0,
                    1 => mulpdu as u64 - 20 + next(40),
                    _ => next(600),
                } as usize;
                let data = pattern(len, round as u8);
                for p in [&mut b1, &mut b2] {
                    if p.c.recv_posted() < 8 {
                        for i in 0..8 {
                            p.post_recv(100_000 + wr_id * 10 + i, 4096);
                        }
                    }
                }
                let kind = next(8);
                // A Send with Invalidate names a region of its own (RFC 5040 §5.2: it is
                // invalid afterwards).
                let inv = 0x10_0000 + wr_id as u32;
                if kind == 2 {
                    for p in [&mut b1, &mut b2] {
                        p.m.region(inv, 0x9000_0000, 8, ALL);
                    }
                }
                let msg = match kind {
                    0..=3 => LoneMsg::Send(SendFlags {
                        solicited: kind == 1,
                        invalidate: (kind == 2).then_some(inv),
                    }),
                    4..=6 => LoneMsg::Write { stag: 0xb00, to: 0x7000_0000 + next(4096) },
                    _ => {
                        // A Read: outstanding until its response arrives.
                        let (at, n) = (0x10000 + next(2048), len.min(2048) as u32);
                        a1.c.post_read(wr_id, 0xa00, at, 0xb00, 0x7000_0000, n).unwrap();
                        match a2.c.read_lone(wr_id, 0xa00, at, 0xb00, 0x7000_0000, n) {
                            Some(fpdu) => {
                                lone += 1;
                                wire2.extend_from_slice(fpdu.as_slice());
                            }
                            None => {
                                declined += 1;
                                a2.c.post_read(wr_id, 0xa00, at, 0xb00, 0x7000_0000, n).unwrap();
                            }
                        }
                        continue;
                    }
                };
                for p in [&mut a1, &mut a2] {
                    p.m.sends.insert(wr_id, data.clone());
                }
                let post = |p: &mut Peer| match msg {
                    LoneMsg::Send(flags) => p.c.post_send(wr_id, flags, len as u32).unwrap(),
                    LoneMsg::Write { stag, to } => p.c.post_write(wr_id, stag, to, len as u32, None).unwrap(),
                };
                post(&mut a1);
                match a2.c.send_lone(wr_id, msg, len as u32) {
                    Some((seg, c)) => {
                        lone += 1;
                        assert_eq!(seg.payload_len as usize, len);
                        wire2.extend_from_slice(seg.header.as_slice());
                        wire2.extend_from_slice(&data);
                        wire2.extend_from_slice(seg.trailer(&[&data]).as_slice());
                        done2.push(c);
                    }
                    None => {
                        declined += 1;
                        post(&mut a2);
                    }
                }
            }
            // Both pairs: a's bytes go to b (after what the lone path framed), b answers.
            for (a, b, wire, done) in [(&mut a1, &mut b1, &mut wire1, &mut done1), (&mut a2, &mut b2, &mut wire2, &mut done2)] {
                let mut buf = std::mem::take(wire);
                while a.c.poll_transmit(&mut buf, &a.m) {}
                let mut off = 0;
                while off < buf.len() {
                    off += b.c.handle_bytes(&buf[off..], &mut b.m);
                }
                wire.extend_from_slice(&buf);
                done.extend(a.completions());
                pump(a, b);
                done.extend(a.completions());
            }
            assert_eq!(wire1, wire2, "crc {crc}, round {round}: the bytes on the wire differ");
            wire1.clear();
            wire2.clear();
            assert_eq!(done1, done2, "crc {crc}, round {round}: a's completions differ");
            assert_eq!(b1.completions(), b2.completions(), "crc {crc}, round {round}: b's completions differ");
            assert_eq!(a1.c.counters(), a2.c.counters());
            assert_eq!(b1.c.counters(), b2.c.counters());
            assert_eq!(b1.m.bytes(0xb00), b2.m.bytes(0xb00));
            assert_eq!(a1.m.bytes(0xa00), a2.m.bytes(0xa00));
            assert_eq!(a1.c.state(), State::Established);
        }
        // The script exercised both paths.
        assert!(lone > 100 && declined > 30, "lone {lone}, declined {declined}");
    }
}
