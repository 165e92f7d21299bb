//! The RFC 7306 messages uiw puts on the wire, checked two ways:
//!
//! * against the RFC's own layouts: every FPDU two uiw peers exchange for Immediate
//!   Data, Immediate Data with SE, Write with Immediate, FetchAdd and CmpSwap is decoded
//!   here by the byte offsets of RFC 7306 Appendix A (DDP control, RDMAP control, the
//!   reserved word, QN, MSN, MO, then Figure 4, 6 or 7), and the opcodes and queue numbers
//!   compared with §4.1 Figure 2 — independently of uiw's own parsers;
//! * by Wireshark: the same frames, in a pcap with a TCP handshake and the MPA exchange
//!   (which tshark's MPA heuristic needs), are decoded by `tshark`. Nothing may be
//!   malformed or an expert error, CRCs must verify, and the fields tshark decodes (its
//!   dissector knows opcodes 0xA/0xB and the atomic headers, not Immediate Data) must be
//!   the values posted. Skipped, with a note, when tshark is not installed.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;

use uiw_wire::conn::{Config, Connection, Event, Role, State, WcOpcode};
use uiw_wire::placement::{Access, Memory, MemoryIo, Placement, Source};
use uiw_wire::rdmap::AtomicOperation;
use uiw_wire::{TaggedError, WcStatus};

/// Regions by STag; a TO is a byte offset into the region.
#[derive(Default)]
struct Mem {
    regions: HashMap<u32, Vec<u8>>,
    sends: HashMap<u64, Vec<u8>>,
    recvs: HashMap<u64, Vec<u8>>,
}

impl Memory for Mem {
    fn check_tagged(&self, stag: u32, to: u64, len: u32, access: Access) -> Result<(), TaggedError> {
        let r = self.regions.get(&stag).ok_or(TaggedError::InvalidStag)?;
        if to + u64::from(len) > r.len() as u64 {
            return Err(TaggedError::BaseBounds);
        }
        if access == Access::RemoteAtomic && !to.is_multiple_of(8) {
            return Err(TaggedError::Misaligned);
        }
        Ok(())
    }
    fn atomic(&mut self, stag: u32, to: u64, op: AtomicOperation) -> Result<u64, TaggedError> {
        let r = self.regions.get_mut(&stag).ok_or(TaggedError::InvalidStag)?;
        let o = to as usize;
        let old = u64::from_ne_bytes(r[o..o + 8].try_into().unwrap());
        r[o..o + 8].copy_from_slice(&op.apply(old).to_ne_bytes());
        Ok(old)
    }
}

impl MemoryIo for Mem {
    fn read(&self, src: Source, out: &mut [u8]) {
        match src {
            Source::Wr { wr_id, offset } => out.copy_from_slice(&self.sends[&wr_id][offset as usize..][..out.len()]),
            Source::Tagged { stag, to } => out.copy_from_slice(&self.regions[&stag][to as usize..][..out.len()]),
            Source::None => {}
        }
    }
    fn write(&mut self, dst: Placement, data: &[u8]) {
        match dst {
            Placement::Recv { wr_id, offset } => {
                self.recvs.get_mut(&wr_id).unwrap()[offset as usize..][..data.len()].copy_from_slice(data)
            }
            Placement::Tagged { stag, to } => {
                self.regions.get_mut(&stag).unwrap()[to as usize..][..data.len()].copy_from_slice(data)
            }
            Placement::Discard => {}
        }
    }
}

struct Peer {
    c: Connection,
    m: Mem,
}

/// One transmit unit (an MPA frame or one FPDU) as it left one side.
struct Unit {
    from_initiator: bool,
    bytes: Vec<u8>,
}

/// Move every transmit unit from `src` to `dst`, recording each; true if any moved.
fn move_units(src: &mut Peer, dst: &mut Peer, from_initiator: bool, log: &mut Vec<Unit>) -> bool {
    let mut moved = false;
    loop {
        let mut unit = Vec::new();
        if !src.c.poll_transmit(&mut unit, &src.m) {
            return moved;
        }
        moved = true;
        let mut off = 0;
        while off < unit.len() {
            off += dst.c.handle_bytes(&unit[off..], &mut dst.m);
        }
        log.push(Unit { from_initiator, bytes: unit });
    }
}

/// Both ways until quiet.
fn pump(a: &mut Peer, b: &mut Peer, log: &mut Vec<Unit>) {
    while move_units(a, b, true, log) | move_units(b, a, false, log) {}
}

fn completions(p: &mut Peer) -> Vec<uiw_wire::conn::Completion> {
    let mut v = Vec::new();
    while let Some(e) = p.c.poll_event() {
        if let Event::Completion(c) = e {
            v.push(c);
        }
    }
    v
}

const FETCH_ADD: u64 = 0x0102_0304_0506_0708;
const SWAP: u64 = 0x1111_2222_3333_4444;
const ORIG: u64 = 40;
const IMM: u64 = 0x1122_3344_5566_7788;
const IMM_SE: u64 = 0x99aa_bbcc_ddee_ff00;
const WRITE_IMM: u64 = 0x0bad_cafe_dead_beef;
const B_STAG: u32 = 0xb00;

/// Two uiw peers with RFC 7306 negotiated and MPA CRC on; every RFC 7306 message once,
/// plus a Read Request before the atomics (they share its queue). Returns the units.
fn exchange() -> Vec<Unit> {
    let mut ca = Config::new(Role::Initiator);
    ca.extensions = true;
    ca.crc = true;
    let mut cb = Config::new(Role::Responder);
    cb.extensions = true;
    let mut a = Peer { c: Connection::new(ca, 0), m: Mem::default() };
    let mut b = Peer { c: Connection::new(cb, 0), m: Mem::default() };
    let mut log = Vec::new();
    pump(&mut a, &mut b, &mut log);
    assert_eq!((a.c.state(), b.c.state()), (State::Established, State::Established));
    assert!(a.c.negotiated().unwrap().extensions && a.c.negotiated().unwrap().crc);
    completions(&mut a);
    completions(&mut b);

    a.m.regions.insert(0xa00, vec![0; 64]);
    let mut target = vec![0u8; 64];
    target[..8].copy_from_slice(&ORIG.to_ne_bytes());
    target[8..16].copy_from_slice(&7u64.to_ne_bytes());
    b.m.regions.insert(B_STAG, target);
    for id in 1..=3 {
        b.m.recvs.insert(id, vec![0; 16]);
        b.c.post_recv(id, 16).unwrap();
    }
    a.c.post_read(10, 0xa00, 32, B_STAG, 32, 8).unwrap();
    a.c.post_atomic(11, AtomicOperation::fetch_add(FETCH_ADD), (0xa00, 0), B_STAG, 0).unwrap();
    a.c.post_atomic(12, AtomicOperation::cmp_swap(7, SWAP), (0xa00, 8), B_STAG, 8).unwrap();
    a.c.post_immediate(13, IMM, false).unwrap();
    a.c.post_immediate(14, IMM_SE, true).unwrap();
    a.m.sends.insert(15, vec![0x5a; 5]);
    a.c.post_write(15, B_STAG, 16, 5, Some(WRITE_IMM)).unwrap();
    pump(&mut a, &mut b, &mut log);

    let ca: Vec<_> = completions(&mut a).iter().map(|c| (c.wr_id, c.status, c.atomic_result)).collect();
    assert_eq!(ca, [
        (10, WcStatus::Success, None),
        (11, WcStatus::Success, Some(ORIG)),
        (12, WcStatus::Success, Some(7)),
        (13, WcStatus::Success, None),
        (14, WcStatus::Success, None),
        (15, WcStatus::Success, None),
    ]);
    let cb: Vec<_> = completions(&mut b).iter().map(|c| (c.wr_id, c.opcode, c.imm, c.solicited)).collect();
    assert_eq!(cb, [
        (1, WcOpcode::RecvRdmaWithImm, Some(IMM), false),
        (2, WcOpcode::RecvRdmaWithImm, Some(IMM_SE), true),
        (3, WcOpcode::RecvRdmaWithImm, Some(WRITE_IMM), false),
    ]);
    assert_eq!(&b.m.regions[&B_STAG][..8], &ORIG.wrapping_add(FETCH_ADD).to_ne_bytes());
    assert_eq!(&b.m.regions[&B_STAG][8..16], &SWAP.to_ne_bytes());
    log
}

fn be32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes(b[o..o + 4].try_into().unwrap())
}
fn be64(b: &[u8], o: usize) -> u64 {
    u64::from_be_bytes(b[o..o + 8].try_into().unwrap())
}

/// An untagged FPDU by RFC 7306 Appendix A's offsets (after the 2-byte MPA length):
/// (direction, opcode, QN, MSN, MO, the bytes after the 18-byte DDP/RDMAP header).
struct Untagged<'a> {
    from_initiator: bool,
    opcode: u8,
    qn: u32,
    msn: u32,
    mo: u32,
    reserved: u32,
    rest: &'a [u8],
}

fn untagged(u: &Unit) -> Option<Untagged<'_>> {
    let f = &u.bytes;
    if f.starts_with(b"MPA ID") || f.len() < 2 + 18 {
        return None;
    }
    let ulpdu = u16::from_be_bytes([f[0], f[1]]) as usize;
    let d = &f[2..2 + ulpdu];
    if d[0] & 0x80 != 0 {
        return None; // tagged
    }
    // DDP control: T=0, L=1, DV=01 (RFC 5041 §4.2); RDMAP control: RV=01 (RFC 7306 §4.1).
    assert_eq!(d[0], 0x41, "DDP control of {:02x?}", &d[..18]);
    assert_eq!(d[1] >> 4, 0x4, "RV=01, Rsv=00 in {:02x?}", &d[..18]);
    Some(Untagged {
        from_initiator: u.from_initiator,
        opcode: d[1] & 0x0f,
        reserved: be32(d, 2),
        qn: be32(d, 6),
        msn: be32(d, 10),
        mo: be32(d, 14),
        rest: &d[18..],
    })
}

#[test]
fn uiw_sends_rfc7306_appendix_a_layouts() {
    let log = exchange();
    let msgs: Vec<Untagged> = log.iter().filter_map(untagged).collect();
    let find = |op: u8| msgs.iter().filter(move |m| m.opcode == op);

    // The Read Request takes MSN 1 on queue 1; the Atomic Requests follow it on the same
    // queue (RFC 7306 §5.2: "the same Queue Number as RDMA Read Requests (QN=1)").
    let rr: Vec<_> = find(0x1).collect();
    assert_eq!((rr.len(), rr[0].qn, rr[0].msn), (1, 1, 1));

    // §5.2.1 Figure 4: opcode 1010b on QN 1.
    let req: Vec<_> = find(0xa).collect();
    assert_eq!(req.len(), 2);
    for (i, m) in req.iter().enumerate() {
        assert!(m.from_initiator);
        // §4.1: Invalidate STag zero on transmit; MO 0; one 52-byte header, no payload.
        assert_eq!((m.qn, m.msn, m.mo, m.reserved, m.rest.len()), (1, 2 + i as u32, 0, 0, 52));
    }
    let (fa, cs) = (req[0].rest, req[1].rest);
    assert_eq!(be32(fa, 0), 0x0, "reserved 28 bits zero, AOpCode FetchAdd");
    assert_eq!((be32(fa, 8), be64(fa, 12)), (B_STAG, 0), "Remote STag, Remote Tagged Offset");
    assert_eq!(be64(fa, 20), FETCH_ADD, "Add Data");
    assert_eq!(be64(fa, 28), 0, "Add Mask 0: one 64-bit addition (§5.1.1)");
    assert_eq!((be64(fa, 36), be64(fa, 44)), (0, u64::MAX), "Compare Data/Mask for FetchAdd (§5.2.1)");
    assert_eq!(be32(cs, 0), 0x2, "AOpCode CmpSwap");
    assert_eq!((be32(cs, 8), be64(cs, 12)), (B_STAG, 8));
    assert_eq!((be64(cs, 20), be64(cs, 28)), (SWAP, u64::MAX), "Swap Data, Swap Mask");
    assert_eq!((be64(cs, 36), be64(cs, 44)), (7, u64::MAX), "Compare Data, Compare Mask");
    assert_ne!(be32(fa, 4), be32(cs, 4), "distinct Request Identifiers");

    // §5.2.2 Figure 6: opcode 1011b on QN 3, its own MSN sequence, 12 bytes echoing the
    // Request Identifier with the original value.
    let resp: Vec<_> = find(0xb).collect();
    assert_eq!(resp.len(), 2);
    for (i, (m, r)) in resp.iter().zip(&req).enumerate() {
        assert!(!m.from_initiator);
        assert_eq!((m.qn, m.msn, m.mo, m.reserved, m.rest.len()), (3, 1 + i as u32, 0, 0, 12));
        assert_eq!(be32(m.rest, 0), be32(r.rest, 4), "Original Request Identifier");
    }
    assert_eq!(be64(resp[0].rest, 4), ORIG, "Original Remote Data Value");
    assert_eq!(be64(resp[1].rest, 4), 7);

    // §6.2 Figure 7 / §6.3: opcodes 1000b and 1001b on QN 0, exactly 8 bytes.
    let imm: Vec<_> = msgs.iter().filter(|m| m.opcode == 0x8 || m.opcode == 0x9).collect();
    let got: Vec<_> = imm.iter().map(|m| (m.opcode, m.qn, m.msn, m.mo, m.rest.len(), be64(m.rest, 0))).collect();
    assert_eq!(got, [(0x8, 0, 1, 0, 8, IMM), (0x9, 0, 2, 0, 8, IMM_SE), (0x8, 0, 3, 0, 8, WRITE_IMM)]);
}

/// Ethernet + IPv4 + TCP + payload, between 10.0.0.1:40000 (initiator) and 10.0.0.2:7174.
fn frame(from_initiator: bool, seq: u32, ack: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    let (src, dst, sport, dport) = if from_initiator {
        ([10, 0, 0, 1], [10, 0, 0, 2], 40000u16, 7174u16)
    } else {
        ([10, 0, 0, 2], [10, 0, 0, 1], 7174, 40000)
    };
    let mut f = Vec::new();
    f.extend_from_slice(&[2, 0, 0, 0, 0, if from_initiator { 2 } else { 1 }]);
    f.extend_from_slice(&[2, 0, 0, 0, 0, if from_initiator { 1 } else { 2 }]);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    let mut ip = vec![0x45, 0];
    ip.extend_from_slice(&((20 + 20 + payload.len()) as u16).to_be_bytes());
    ip.extend_from_slice(&[0, 0, 0x40, 0, 64, 6, 0, 0]);
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    let sum = ip.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum::<u32>();
    let sum = !(((sum & 0xffff) + (sum >> 16)) as u16);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&seq.to_be_bytes());
    f.extend_from_slice(&ack.to_be_bytes());
    f.extend_from_slice(&[0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
    f.extend_from_slice(payload);
    f
}

/// A classic pcap (Ethernet) of a TCP connection carrying `log`, one unit per segment.
fn pcap(log: &[Unit]) -> Vec<u8> {
    const SYN: u8 = 0x02;
    const ACK: u8 = 0x10;
    const PSH: u8 = 0x08;
    let mut frames = Vec::new();
    let (mut seq_i, mut seq_r) = (1000u32, 5000u32);
    frames.push(frame(true, seq_i, 0, SYN, &[]));
    frames.push(frame(false, seq_r, seq_i + 1, SYN | ACK, &[]));
    seq_i += 1;
    seq_r += 1;
    frames.push(frame(true, seq_i, seq_r, ACK, &[]));
    for u in log {
        let n = u.bytes.len() as u32;
        if u.from_initiator {
            frames.push(frame(true, seq_i, seq_r, PSH | ACK, &u.bytes));
            seq_i += n;
        } else {
            frames.push(frame(false, seq_r, seq_i, PSH | ACK, &u.bytes));
            seq_r += n;
        }
    }
    let mut out = Vec::new();
    out.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&4u16.to_le_bytes());
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(&65535u32.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes());
    for (i, f) in frames.iter().enumerate() {
        out.extend_from_slice(&1_700_000_000u32.to_le_bytes());
        out.extend_from_slice(&(i as u32 * 10).to_le_bytes());
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(f);
    }
    out
}

/// `fields` of every frame matching the display filter `filter`, as tshark prints them.
fn tshark(pcap: &PathBuf, fields: &[&str], filter: &str) -> Vec<Vec<String>> {
    let mut cmd = Command::new("tshark");
    cmd.args(["-r"]).arg(pcap);
    // As ci/tshark-check.sh: these heuristics misread small Sends.
    cmd.args(["-o", "tcp.try_heuristic_first:TRUE", "--disable-heuristic", "rpcrdma_iwarp", "--disable-heuristic", "smb_direct_iwarp"]);
    cmd.args(["-Y", filter, "-T", "fields", "-E", "separator=|", "-E", "occurrence=a"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().expect("run tshark");
    assert!(out.status.success(), "tshark: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.split('|').map(str::to_string).collect())
        .collect()
}

#[test]
fn tshark_decodes_every_rfc7306_message() {
    if Command::new("tshark").arg("--version").output().is_err() {
        eprintln!("tshark_decodes_every_rfc7306_message: tshark not installed, skipped");
        return;
    }
    let log = exchange();
    let dir = std::env::temp_dir().join(format!("uiw-rfc7306-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rfc7306.pcap");
    std::fs::write(&path, pcap(&log)).unwrap();

    let bad = tshark(&path, &["frame.number"], "_ws.malformed || _ws.expert.severity >= \"Error\"");
    assert!(bad.is_empty(), "malformed or expert-error frames: {bad:?} (in {})", path.display());
    let mpa = tshark(&path, &["frame.number"], "iwarp_mpa.key.req || iwarp_mpa.key.rep");
    assert_eq!(mpa.len(), 2, "tshark found the MPA Request and Reply");
    // tshark 4.0 has no CRC status field: its verdict is in the CRC item's text.
    let verbose = Command::new("tshark").arg("-r").arg(&path).arg("-V").output().expect("run tshark -V");
    let verbose = String::from_utf8_lossy(&verbose.stdout);
    let fpdus = log.iter().filter(|u| !u.bytes.starts_with(b"MPA ID")).count();
    assert_eq!(verbose.matches("(Good CRC32)").count(), fpdus, "every FPDU's CRC32c verified by tshark");
    assert!(!verbose.contains("Bad CRC32"));

    let fields = [
        "iwarp_rdma.opcode",
        "iwarp_ddp.qn",
        "iwarp_ddp.msn",
        "iwarp_rdma.atomic.opcode",
        "iwarp_rdma.atomic.request_identifier",
        "iwarp_rdma.atomic.remote_stag",
        "iwarp_rdma.atomic.remote_tagged_offset",
        "iwarp_rdma.atomic.add_data",
        "iwarp_rdma.atomic.add_mask",
        "iwarp_rdma.atomic.swap_data",
        "iwarp_rdma.atomic.compare_data",
        "iwarp_rdma.atomic.compare_mask",
        "iwarp_rdma.atomic.original_request_identifier",
        "iwarp_rdma.atomic.original_remote_data_value",
    ];
    let rows = tshark(&path, &fields, "iwarp_ddp_rdmap && iwarp_ddp.tagged_flag == 0");
    let rows: Vec<Vec<&str>> = rows.iter().map(|r| r.iter().map(String::as_str).collect()).collect();
    let by_op = |op: &str| rows.iter().filter(|r| r[0] == op).cloned().collect::<Vec<_>>();
    let dec = |v: u64| v.to_string();
    let stag = dec(u64::from(B_STAG));

    // The Read Request (MSN 1) and the two Atomic Requests (MSN 2, 3) on queue 1.
    assert_eq!(by_op("0x01").iter().map(|r| (r[1], r[2])).collect::<Vec<_>>(), [("1", "1")]);
    let req = by_op("0x0a");
    assert_eq!(req.len(), 2, "{rows:?}");
    assert_eq!(&req[0][1..3], ["1", "2"]);
    assert_eq!(&req[1][1..3], ["1", "3"]);
    // FetchAdd: AOpCode, STag, TO, Add Data, Add Mask.
    assert_eq!(req[0][3], "0");
    assert_eq!((req[0][5], req[0][6]), (stag.as_str(), "0"));
    assert_eq!((req[0][7], req[0][8]), (dec(FETCH_ADD).as_str(), "0x0000000000000000"));
    assert_eq!((req[0][10], req[0][11]), ("0", "0xffffffffffffffff"));
    // CmpSwap: tshark shows Add or Swap Data as Swap Data.
    assert_eq!(req[1][3], "2");
    assert_eq!((req[1][5], req[1][6]), (stag.as_str(), "8"));
    assert_eq!(req[1][9], dec(SWAP));
    assert_eq!((req[1][10], req[1][11]), ("7", "0xffffffffffffffff"));
    // Atomic Responses on queue 3, MSN 1 and 2, echoing the Request Identifiers.
    let resp = by_op("0x0b");
    assert_eq!(resp.len(), 2, "{rows:?}");
    for (i, (r, q)) in resp.iter().zip(&req).enumerate() {
        assert_eq!((r[1], r[2]), ("3", if i == 0 { "1" } else { "2" }));
        assert_eq!(r[12], q[4], "Original Request Identifier");
    }
    assert_eq!((resp[0][13], resp[1][13]), (dec(ORIG).as_str(), "7"));
    // Immediate Data and Immediate Data with SE: tshark has no names for 0x8/0x9, but
    // decodes their DDP header (queue 0, MSN 1..3) without complaint.
    let imm: Vec<_> = rows.iter().filter(|r| r[0] == "0x08" || r[0] == "0x09").map(|r| (r[0], r[1], r[2])).collect();
    assert_eq!(imm, [("0x08", "0", "1"), ("0x09", "0", "2"), ("0x08", "0", "3")]);
    std::fs::remove_dir_all(&dir).ok();
}
