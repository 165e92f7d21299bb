//! Golden-frame test: every capture of real siw traffic in
//! `shared/captures` is deframed in both directions, checked field by field
//! against tshark's decode (`*.txt`) and re-encoded byte for byte.

mod common;

use common::pcap::{read_pcap, reassemble, Chunk, Stream};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use uiw_wire::ddp::BufferModel;
use uiw_wire::mpa::{FrameKind, RrFrame};
use uiw_wire::rdmap::{Opcode, ReadRequest, TermLayout, Terminate};
use uiw_wire::segment::{encode_fpdu_with_pad, parse_fpdu};
use uiw_wire::{TermCode, WireError};

fn captures_dir() -> Option<PathBuf> {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/captures");
    if d.is_dir() {
        Some(d)
    } else {
        eprintln!("note: {} not found, capture tests skipped", d.display());
        None
    }
}

fn op_name(op: u8) -> &'static str {
    match Opcode::from_u8(op) {
        Some(Opcode::Write) => "Write",
        Some(Opcode::ReadRequest) => "Read Request",
        Some(Opcode::ReadResponse) => "Read Response",
        Some(Opcode::Send) => "Send",
        Some(Opcode::SendInv) => "Send with Invalidate",
        Some(Opcode::SendSe) => "Send with SE",
        Some(Opcode::SendSeInv) => "Send with SE and Invalidate",
        Some(Opcode::Terminate) => "Terminate",
        _ => "Unknown",
    }
}

/// One tshark summary line: (protocol, info with `[...]` annotations removed).
fn read_txt(path: &Path) -> BTreeMap<usize, (String, String)> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut m = BTreeMap::new();
    for line in text.lines() {
        let toks: Vec<&str> = line.split_whitespace().collect();
        if toks.len() < 8 {
            continue;
        }
        let frame: usize = toks[0].parse().unwrap();
        let proto = toks[5].to_string();
        let mut info = toks[7..].join(" ");
        while info.starts_with('[') {
            match info.find("] ") {
                Some(i) => info = info[i + 2..].to_string(),
                None => break,
            }
        }
        m.insert(frame, (proto, info));
    }
    m
}

#[derive(Debug, Default)]
struct Summary {
    mpa_req: Vec<(usize, RrFrame<'static>)>,
    mpa_rep: Vec<(usize, RrFrame<'static>)>,
    /// (frame, src port, opcode, last, ddp header, body, payload len)
    fpdus: Vec<Fp>,
    terminates: Vec<(Terminate, TermLayout)>,
    crc_checked: usize,
    dirty_pads: usize,
    partial_tails: usize,
}

#[derive(Debug, Clone)]
struct Fp {
    frame: usize,
    sport: u16,
    op: u8,
    ddp: uiw_wire::ddp::DdpHeader,
    body: Vec<u8>,
    payload: Vec<u8>,
}

fn leak(v: &[u8]) -> &'static [u8] {
    Box::leak(v.to_vec().into_boxed_slice())
}

/// Deframe one direction after its MPA frame; check CRC, re-encoding and
/// DDP sequencing. Returns the FPDUs.
fn deframe(name: &str, st: &Stream, start: usize, crc_on: bool, sum: &mut Summary) {
    for (i, c) in st.chunks.iter().enumerate() {
        // Chunks after a capture hole start at a TCP segment; siw sends one
        // FPDU per segment, so they start at an FPDU (as tshark assumes).
        deframe_chunk(
            name,
            st,
            c,
            if i == 0 { start } else { 0 },
            i > 0,
            crc_on,
            sum,
        );
    }
}

fn deframe_chunk(
    name: &str,
    st: &Stream,
    s: &Chunk,
    start: usize,
    resync: bool,
    crc_on: bool,
    sum: &mut Summary,
) {
    let sport = st.src.unwrap().port;
    let mut off = start;
    if resync {
        // Find the first TCP segment start where two FPDUs parse in a row
        // (or one FPDU ends the chunk).
        let starts = std::iter::once(0).chain(s.ends.iter().map(|e| e.0));
        let ok = |o: usize| match parse_fpdu(&s.data[o..]) {
            Ok((f, n)) if f.ddp.dv == 1 && f.ddp.rdmap.rv == 1 => {
                o + n == s.data.len() || parse_fpdu(&s.data[o + n..]).is_ok()
            }
            _ => false,
        };
        match starts.into_iter().find(|&o| o < s.data.len() && ok(o)) {
            Some(o) => off = o,
            None => return,
        }
    }
    let mut msn: HashMap<u32, u32> = HashMap::new();
    let mut mo: HashMap<u32, u32> = HashMap::new();
    let mut next_to: Option<(u32, u64)> = None;
    while off < s.data.len() {
        let (f, n) = match parse_fpdu(&s.data[off..]) {
            Ok(x) => x,
            Err(WireError::Truncated { .. }) => {
                // The capture lost the tail (tshark: "ACKed unseen segment").
                sum.partial_tails += 1;
                break;
            }
            Err(e) => panic!("{name}: FPDU parse error {e:?} at {off}"),
        };
        let raw = &s.data[off..off + n];
        // CRC: valid when negotiated, zero otherwise.
        if crc_on {
            assert!(f.crc_ok(), "{name}: bad CRC at offset {off}");
            sum.crc_checked += 1;
        } else {
            assert_eq!(f.crc, 0, "{name}: CRC field not zero without CRC");
        }
        if f.pad.iter().any(|&b| b != 0) {
            sum.dirty_pads += 1; // siw does not zero its pad bytes
        }
        // Byte-identical re-encoding, CRC included.
        let mut re = Vec::new();
        encode_fpdu_with_pad(&f.ddp, f.body, f.payload, f.pad, crc_on, &mut re);
        assert_eq!(re, raw, "{name}: re-encoding differs at offset {off}");
        assert_eq!(f.ddp.dv, 1);
        assert_eq!(f.ddp.rdmap.rv, 1);
        // DDP sequencing, RFC 5041 §5.
        match f.ddp.model {
            BufferModel::Untagged {
                qn, msn: m, mo: o, ..
            } => {
                let want_msn = *msn.get(&qn).unwrap_or(&if resync { m } else { 1 });
                let want_mo = *mo.get(&qn).unwrap_or(&if resync { o } else { 0 });
                assert_eq!(
                    (m, o),
                    (want_msn, want_mo),
                    "{name}: QN {qn} MSN/MO out of sequence"
                );
                let seg = f.payload.len() as u32 + f.body.len() as u32;
                if f.ddp.last {
                    msn.insert(qn, m + 1);
                    mo.insert(qn, 0);
                } else {
                    mo.insert(qn, o + seg);
                }
            }
            BufferModel::Tagged { stag, to } => {
                if let Some(exp) = next_to {
                    assert_eq!((stag, to), exp, "{name}: tagged segment not contiguous");
                }
                next_to = if f.ddp.last {
                    None
                } else {
                    Some((stag, to + f.payload.len() as u64))
                };
            }
        }
        if f.ddp.rdmap.opcode == Opcode::Terminate as u8 {
            sum.terminates.push(Terminate::parse(f.payload).unwrap());
        }
        sum.fpdus.push(Fp {
            frame: s.frame_of_end(off + n),
            sport,
            op: f.ddp.rdmap.opcode,
            ddp: f.ddp,
            body: f.body.to_vec(),
            payload: f.payload.to_vec(),
        });
        off += n;
    }
}

fn check_capture(dir: &Path, name: &str) -> Summary {
    let pcap = std::fs::read(dir.join(format!("{name}.pcap"))).unwrap();
    let txt = read_txt(&dir.join(format!("{name}.txt")));
    let (lt, pkts) = read_pcap(&pcap);
    let conns = reassemble(lt, &pkts);
    let mut sum = Summary::default();
    for c in &conns {
        let (Some(a), Some(b)) = (c.a.first(), c.b.first()) else {
            continue;
        };
        let (req, rn) = RrFrame::parse(&a.data).unwrap_or_else(|e| panic!("{name}: request {e:?}"));
        assert_eq!(req.hdr.kind, FrameKind::Request);
        let mut re = Vec::new();
        req.encode(&mut re);
        assert_eq!(re, &a.data[..rn]);
        let fr = a.frame_of_end(rn);
        let (p, info) = &txt[&fr];
        assert_eq!(
            (p.as_str(), info.ends_with("MPA Request Frame")),
            ("MPA", true),
            "{name} frame {fr}"
        );
        let req_s = RrFrame {
            hdr: req.hdr,
            private_data: leak(req.private_data),
        };
        sum.mpa_req.push((fr, req_s));
        let (rep, pn) = RrFrame::parse(&b.data).unwrap_or_else(|e| panic!("{name}: reply {e:?}"));
        assert_eq!(rep.hdr.kind, FrameKind::Reply);
        let mut re = Vec::new();
        rep.encode(&mut re);
        assert_eq!(re, &b.data[..pn]);
        let fp = b.frame_of_end(pn);
        assert!(txt[&fp].1.ends_with("MPA Reply Frame"), "{name} frame {fp}");
        sum.mpa_rep.push((
            fp,
            RrFrame {
                hdr: rep.hdr,
                private_data: leak(rep.private_data),
            },
        ));
        if rep.hdr.reject() {
            assert_eq!(a.data.len(), rn, "{name}: data after a rejected request");
            continue;
        }
        let crc_on = req.hdr.crc() || rep.hdr.crc();
        deframe(name, &c.a, rn, crc_on, &mut sum);
        deframe(name, &c.b, pn, crc_on, &mut sum);
    }
    // Every FPDU we found is what tshark reports in the frame where it
    // ends, and every DDP/RDMA line of tshark is one of ours.
    let mut ours: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for f in &sum.fpdus {
        let last = if f.ddp.last {
            "[last DDP segment]"
        } else {
            "[more DDP segments]"
        };
        ours.entry(f.frame)
            .or_default()
            .push(format!("{} {} {}", f.sport, op_name(f.op), last));
    }
    let mut theirs: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for (fr, (p, info)) in &txt {
        if p == "DDP/RDMA" {
            // "sport > dport Opcode [last DDP segment]"
            let t: Vec<&str> = info.splitn(4, ' ').collect();
            theirs
                .entry(*fr)
                .or_default()
                .push(format!("{} {}", t[0], t[3]));
        }
    }
    for (fr, v) in &theirs {
        match ours.get(fr) {
            Some(o) => assert!(
                v.iter().all(|x| o.contains(x)),
                "{name} frame {fr}: tshark {v:?}, ours {o:?}"
            ),
            None => panic!("{name} frame {fr}: tshark has {v:?}, we found nothing"),
        }
    }
    for (fr, o) in &ours {
        // tshark lists one PDU per frame in its summary line.
        assert!(
            theirs.contains_key(fr),
            "{name} frame {fr}: we found {o:?}, tshark has none"
        );
    }
    sum
}

fn all_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let p = e.unwrap().path();
            (p.extension()? == "pcap")
                .then(|| p.file_stem().unwrap().to_string_lossy().into_owned())
        })
        .collect();
    v.sort();
    v
}

#[test]
fn all_captures_deframe_and_reencode() {
    let Some(dir) = captures_dir() else { return };
    let names = all_names(&dir);
    assert!(
        names.len() >= 15,
        "expected the 15 captures, found {}",
        names.len()
    );
    for n in &names {
        let s = check_capture(&dir, n);
        let mut per_op: BTreeMap<&str, usize> = BTreeMap::new();
        for f in &s.fpdus {
            *per_op.entry(op_name(f.op)).or_default() += 1;
        }
        eprintln!(
            "{n}: {} conns, {} FPDUs {:?}, {} CRCs checked, {} non-zero pads, {} tails lost",
            s.mpa_req.len(),
            s.fpdus.len(),
            per_op,
            s.crc_checked,
            s.dirty_pads,
            s.partial_tails
        );
    }
}

fn find(s: &Summary, frame: usize) -> &Fp {
    s.fpdus
        .iter()
        .find(|f| f.frame == frame)
        .unwrap_or_else(|| panic!("no FPDU ends in frame {frame}"))
}

#[test]
fn specific_fields() {
    let Some(dir) = captures_dir() else { return };
    // siw-read frame 21/23: IRD/ORD 128/128, rev 2, enhanced.
    let s = check_capture(&dir, "siw-read");
    let (_, req) = s.mpa_req.iter().find(|(f, _)| *f == 21).unwrap();
    let io = req.ird_ord().unwrap();
    assert_eq!((io.ird, io.ord, io.p2p), (128, 128, false));
    assert_eq!(req.hdr.flags, 0x10);
    // Read Request, frame 33
    let f = find(&s, 33);
    assert_eq!(f.op, Opcode::ReadRequest as u8);
    assert_eq!(
        f.ddp.model,
        BufferModel::Untagged {
            rsvd_ulp: 0,
            qn: 1,
            msn: 1,
            mo: 0
        }
    );
    let rr = ReadRequest::parse(&f.body).unwrap();
    assert_eq!(
        rr,
        ReadRequest {
            sink_stag: 0xdb687700,
            sink_to: 0x00005563ff4d0000,
            size: 8192,
            src_stag: 0xcef17600,
            src_to: 0x00005631d80b8000
        }
    );
    // Read Response, frame 35: sink STag/TO of that request, 8192 bytes.
    let f = find(&s, 35);
    assert_eq!(f.op, Opcode::ReadResponse as u8);
    assert_eq!(
        f.ddp.model,
        BufferModel::Tagged {
            stag: 0xdb687700,
            to: 0x00005563ff4d0000
        }
    );
    assert_eq!(f.payload.len(), 8192);
    let reads = s.fpdus.iter().filter(|f| f.op == 1).count();
    let resps = s.fpdus.iter().filter(|f| f.op == 2).count();
    assert_eq!((reads, resps), (8, 8));

    // siw-write frame 35: one 8192-byte Write; frame 8: Send QN0 MSN1.
    let s = check_capture(&dir, "siw-write");
    let f = find(&s, 35);
    assert_eq!(
        f.ddp.model,
        BufferModel::Tagged {
            stag: 0x5e70ac00,
            to: 0x000055799c794000
        }
    );
    assert_eq!(f.payload.len(), 8192);
    let f = find(&s, 8);
    assert_eq!(
        f.ddp.model,
        BufferModel::Untagged {
            rsvd_ulp: 0,
            qn: 0,
            msn: 1,
            mo: 0
        }
    );
    assert_eq!(f.payload.len(), 16);
    assert_eq!(&f.payload[..4], b"6.06");

    // MTU 1500: full FPDUs are MSS (1448) rounded down to 8, 1428 data bytes.
    let s = check_capture(&dir, "siw-write-mtu1500");
    let f = find(&s, 35);
    assert!(!f.ddp.last);
    assert_eq!(
        f.ddp.model,
        BufferModel::Tagged {
            stag: 0x52f05b00,
            to: 0x0000561cd31c8000
        }
    );
    assert_eq!(f.payload.len(), 1428);
    assert_eq!(uiw_wire::mpa::mulpdu(1448) - 14, 1428);
    let max = s
        .fpdus
        .iter()
        .map(|f| f.payload.len() + f.body.len() + f.ddp.len())
        .max()
        .unwrap();
    assert_eq!(max, uiw_wire::mpa::mulpdu(1448));

    // CRC captures: every FPDU's CRC verified.
    for n in ["siw-write-crc", "siw-read-crc", "h2g-rping-crc"] {
        let s = check_capture(&dir, n);
        assert!(s.crc_checked > 0 && s.crc_checked == s.fpdus.len(), "{n}");
        assert!(
            s.mpa_req.iter().any(|(_, r)| r.hdr.crc())
                || s.mpa_rep.iter().any(|(_, r)| r.hdr.crc())
        );
    }

    // P2P: request 8000c001, reply 80018000, then a zero-length Write RTR to STag 1.
    let s = check_capture(&dir, "siw-write-p2p");
    let (_, req) = &s.mpa_req[0];
    let io = req.ird_ord().unwrap();
    assert!(io.p2p && io.write_rtr && io.read_rtr && !io.send_rtr);
    assert_eq!((io.ird, io.ord), (0, 1));
    let io = s.mpa_rep[0].1.ird_ord().unwrap();
    assert!(io.p2p && io.write_rtr && !io.read_rtr);
    assert_eq!((io.ird, io.ord), (1, 0));
    let f = find(&s, 8);
    assert_eq!(f.ddp.model, BufferModel::Tagged { stag: 1, to: 0 });
    assert!(f.payload.is_empty() && f.ddp.last && f.op == 0);

    // Revision 1: no private data, no enhanced bit.
    for n in ["siw-write-rev1", "h2g-rev1"] {
        let s = check_capture(&dir, n);
        for (_, r) in s.mpa_req.iter().chain(s.mpa_rep.iter()) {
            assert_eq!(r.hdr.revision, 1);
            assert!(r.ird_ord().is_none());
        }
    }

    // Markers requested → siw rejects (R=1, rev 2, IRD/ORD 0/0).
    let s = check_capture(&dir, "h2g-markers");
    assert!(s.mpa_req[0].1.hdr.markers());
    let rep = &s.mpa_rep[0].1;
    assert!(rep.hdr.reject() && !rep.hdr.markers());
    assert_eq!(rep.hdr.flags, 0x30);
    assert!(s.fpdus.is_empty());

    // Bad read: siw's Terminate (its own byte layout) for an invalid STag.
    let s = check_capture(&dir, "h2g-badread");
    assert_eq!(s.terminates.len(), 1);
    let (t, layout) = s.terminates[0];
    assert_eq!(layout, TermLayout::Siw);
    assert_eq!(t.code, TermCode::RDMAP_INVALID_STAG);
    assert!(t.m && t.d && t.r);
    let rr = t.rdmap_hdr.unwrap();
    assert_eq!(rr.src_stag, 0xdeadbe00);
    let f = find(&s, 9);
    assert_eq!(
        f.ddp.model,
        BufferModel::Untagged {
            rsvd_ulp: 0,
            qn: 2,
            msn: 1,
            mo: 0
        }
    );
    let req = find(&s, 8);
    assert_eq!(ReadRequest::parse(&req.body).unwrap(), rr);
}

/// Replay the initiator side of siw's `ib_read_bw` runs into a uiw
/// responder. Our Read Responses must be byte-identical to siw's
/// (same segmentation at the MSS, same headers, same CRCs).
#[test]
fn uiw_answers_siw_reads_like_siw() {
    use uiw_wire::conn::{Config, Connection, Event, Role};
    use uiw_wire::placement::{Access, Memory, MemoryIo, Placement, Source};
    use uiw_wire::TaggedError;

    /// Source memory reconstructed from siw's responses; sink writes dropped.
    struct Mem(Vec<(u32, u64, Vec<u8>)>);
    impl Memory for Mem {
        fn check_tagged(&self, _: u32, _: u64, _: u32, _: Access) -> Result<(), TaggedError> {
            Ok(())
        }
    }
    impl MemoryIo for Mem {
        fn read(&self, src: Source, out: &mut [u8]) {
            let Source::Tagged { stag, to } = src else {
                panic!("{src:?}")
            };
            let (_, base, d) = self
                .0
                .iter()
                .find(|(s, b, d)| {
                    *s == stag && to >= *b && to + out.len() as u64 <= b + d.len() as u64
                })
                .expect("source");
            let o = (to - base) as usize;
            out.copy_from_slice(&d[o..o + out.len()]);
        }
        fn write(&mut self, _: Placement, _: &[u8]) {}
    }

    let Some(dir) = captures_dir() else { return };
    for name in [
        "siw-read",
        "siw-read-mtu1500",
        "siw-read-crc",
        "siw-read-rev1",
    ] {
        let pcap = std::fs::read(dir.join(format!("{name}.pcap"))).unwrap();
        let (lt, pkts) = read_pcap(&pcap);
        let conns = reassemble(lt, &pkts);
        let mut compared = 0;
        for c in &conns {
            let (Some(a), Some(b)) = (c.a.first(), c.b.first()) else {
                continue;
            };
            // siw's own output: read responses (tagged FPDUs) from the server.
            let (rep, pn) = RrFrame::parse(&b.data).unwrap();
            let (req, rn) = RrFrame::parse(&a.data).unwrap();
            let crc_on = req.hdr.crc() || rep.hdr.crc();
            let mut siw_resp: Vec<Vec<u8>> = Vec::new();
            let mut off = pn;
            while let Ok((f, n)) = parse_fpdu(&b.data[off..]) {
                if f.ddp.rdmap.opcode == Opcode::ReadResponse as u8 {
                    siw_resp.push(b.data[off..off + n].to_vec());
                }
                off += n;
            }
            if siw_resp.is_empty() {
                continue;
            }
            // Requests in the client stream; pair with response payloads.
            let mut reqs = Vec::new();
            let mut off = rn;
            while let Ok((f, n)) = parse_fpdu(&a.data[off..]) {
                off += n;
                if f.ddp.rdmap.opcode == Opcode::ReadRequest as u8 {
                    reqs.push((ReadRequest::parse(f.body).unwrap(), off));
                }
            }
            let mut mem = Mem(Vec::new());
            let mut it = siw_resp.iter();
            // The capture may have lost the tail of siw's responses: replay
            // the client only up to the last fully answered request.
            let mut feed_end = rn;
            let mut used = 0;
            'reqs: for (r, end) in &reqs {
                let mut data = Vec::new();
                let mut k = 0;
                while data.len() < r.size as usize {
                    match it.next() {
                        Some(x) => data.extend_from_slice(parse_fpdu(x).unwrap().0.payload),
                        None => break 'reqs,
                    }
                    k += 1;
                }
                used += k;
                mem.0.push((r.src_stag, r.src_to, data));
                feed_end = *end;
            }
            siw_resp.truncate(used);
            // Our responder, same MSS, IRD/ORD and CRC setting as siw's.
            let mut cfg = Config::new(Role::Responder);
            cfg.mss = c.b.mss.unwrap() as usize;
            cfg.crc = rep.hdr.crc();
            let io = rep.ird_ord();
            cfg.ird = io.map(|i| i.ird).unwrap_or(128);
            cfg.ord = io.map(|i| i.ord).unwrap_or(128);
            cfg.revision = rep.hdr.revision;
            let mut us = Connection::new(cfg, 0);
            for i in 0..1000 {
                us.post_recv(i, 1 << 20).unwrap();
            }
            let mut out = Vec::new();
            let mut off = 0;
            while off < feed_end {
                off += us.handle_bytes(&a.data[off..feed_end], &mut mem);
                while us.poll_transmit(&mut out, &mem) {}
            }
            while let Some(e) = us.poll_event() {
                assert!(
                    !matches!(e, Event::Terminated { .. } | Event::Failed(_)),
                    "{name}: {e:?}"
                );
            }
            // Our MPA Reply equals siw's.
            assert_eq!(&out[..pn], &b.data[..pn], "{name}: MPA Reply differs");
            let mut ours = Vec::new();
            let mut off = pn;
            while let Ok((f, n)) = parse_fpdu(&out[off..]) {
                assert!(!crc_on || f.crc_ok());
                ours.push(out[off..off + n].to_vec());
                off += n;
            }
            assert_eq!(
                ours.len(),
                siw_resp.len(),
                "{name}: number of Read Response FPDUs"
            );
            for (i, (o, s)) in ours.iter().zip(siw_resp.iter()).enumerate() {
                assert_eq!(o, s, "{name}: Read Response FPDU {i} differs");
            }
            compared += ours.len();
        }
        eprintln!("{name}: {compared} Read Response FPDUs byte-identical to siw's");
        assert!(compared > 0);
    }
}

/// Replay h2g-badread's client into a uiw responder that knows no STags:
/// our Terminate carries what siw's does (RDMAP / remote protection /
/// invalid STag, M+D+R, the Read Request echoed) but in RFC 5040 layout.
#[test]
fn uiw_terminates_bad_read_like_siw() {
    use uiw_wire::conn::{Config, Connection, Role};
    use uiw_wire::placement::{Access, Memory, MemoryIo, Placement, Source};
    use uiw_wire::TaggedError;
    struct NoMem;
    impl Memory for NoMem {
        fn check_tagged(&self, _: u32, _: u64, _: u32, _: Access) -> Result<(), TaggedError> {
            Err(TaggedError::InvalidStag)
        }
    }
    impl MemoryIo for NoMem {
        fn read(&self, _: Source, _: &mut [u8]) {}
        fn write(&mut self, _: Placement, _: &[u8]) {}
    }
    let Some(dir) = captures_dir() else { return };
    let pcap = std::fs::read(dir.join("h2g-badread.pcap")).unwrap();
    let (lt, pkts) = read_pcap(&pcap);
    let c = &reassemble(lt, &pkts)[0];
    let (a, b) = (c.a.first().unwrap(), c.b.first().unwrap());
    let (_, pn) = RrFrame::parse(&b.data).unwrap();
    let (siw_term, siw_layout) =
        Terminate::parse(parse_fpdu(&b.data[pn..]).unwrap().0.payload).unwrap();
    assert_eq!(siw_layout, TermLayout::Siw);
    let mut us = Connection::new(Config::new(Role::Responder), 0);
    let mut out = Vec::new();
    let mut off = 0;
    while off < a.data.len() {
        off += us.handle_bytes(&a.data[off..], &mut NoMem);
        while us.poll_transmit(&mut out, &NoMem) {}
    }
    let (rep, rn) = RrFrame::parse(&out).unwrap();
    assert!(!rep.hdr.reject());
    let (f, _) = parse_fpdu(&out[rn..]).unwrap();
    assert_eq!(
        f.ddp.model,
        BufferModel::Untagged {
            rsvd_ulp: 0,
            qn: 2,
            msn: 1,
            mo: 0
        }
    );
    let (t, layout) = Terminate::parse(f.payload).unwrap();
    assert_eq!(layout, TermLayout::Rfc);
    assert_eq!(
        (t.code, t.m, t.d, t.r),
        (siw_term.code, siw_term.m, siw_term.d, siw_term.r)
    );
    assert_eq!(t.rdmap_hdr, siw_term.rdmap_hdr);
    // siw echoes the read size in the MSN field and a zero segment length;
    // we echo the header as received (MSN 1) and its ULPDU length.
    let echoed = ddp_model(t.echoed_ddp().unwrap());
    assert_eq!(
        echoed,
        BufferModel::Untagged {
            rsvd_ulp: 0,
            qn: 1,
            msn: 1,
            mo: 0
        }
    );
    assert_eq!(t.seg_len, 46);
    assert_eq!(
        ddp_model(siw_term.echoed_ddp().unwrap()),
        BufferModel::Untagged {
            rsvd_ulp: 0,
            qn: 1,
            msn: 64,
            mo: 0
        }
    );
}

fn ddp_model(b: &[u8]) -> BufferModel {
    uiw_wire::ddp::DdpHeader::parse(b).unwrap().0.model
}

/// Replay every siw client stream (Sends, Writes, Read Requests, the P2P
/// Write RTR, CRC) into a uiw responder configured like the siw server:
/// our MPA Reply must equal siw's byte for byte, nothing may be
/// terminated, every Send must complete into a posted receive, and every
/// Write must be placed where its tagged header says.
#[test]
fn uiw_receives_siw_client_streams() {
    use std::collections::BTreeMap;
    use uiw_wire::conn::{Config, Connection, Event, Role, Rtr, WcOpcode};
    use uiw_wire::placement::{Access, Memory, MemoryIo, Placement, Source};
    use uiw_wire::TaggedError;

    #[derive(Default)]
    struct Rec {
        tagged: BTreeMap<(u32, u64), Vec<u8>>,
        recv: usize,
    }
    impl Memory for Rec {
        fn check_tagged(&self, _: u32, _: u64, _: u32, _: Access) -> Result<(), TaggedError> {
            Ok(())
        }
    }
    impl MemoryIo for Rec {
        fn read(&self, _: Source, out: &mut [u8]) {
            out.fill(0xee)
        }
        fn write(&mut self, dst: Placement, data: &[u8]) {
            match dst {
                Placement::Tagged { stag, to } => {
                    self.tagged.insert((stag, to), data.to_vec());
                }
                Placement::Recv { .. } => self.recv += data.len(),
                Placement::Discard => {}
            }
        }
    }

    let Some(dir) = captures_dir() else { return };
    for name in all_names(&dir).iter().filter(|n| n.starts_with("siw-")) {
        let pcap = std::fs::read(dir.join(format!("{name}.pcap"))).unwrap();
        let (lt, pkts) = read_pcap(&pcap);
        for c in reassemble(lt, &pkts) {
            let (Some(a), Some(b)) = (c.a.first(), c.b.first()) else {
                continue;
            };
            let (req, rn) = RrFrame::parse(&a.data).unwrap();
            let (rep, pn) = RrFrame::parse(&b.data).unwrap();
            let mut cfg = Config::new(Role::Responder);
            cfg.mss = c.b.mss.unwrap() as usize;
            cfg.crc = rep.hdr.crc();
            cfg.revision = rep.hdr.revision;
            cfg.ird = 128;
            cfg.ord = 128;
            cfg.p2p = true;
            cfg.rtr = Rtr {
                write: true,
                read: true,
                send: false,
            };
            let mut us = Connection::new(cfg, 0);
            // Expected: untagged Sends (messages) and tagged Write bytes.
            let (mut sends, mut writes) = (0usize, BTreeMap::new());
            let mut off = rn;
            let mut end = rn;
            while let Ok((f, n)) = parse_fpdu(&a.data[off..]) {
                off += n;
                end = off;
                let op = Opcode::from_u8(f.ddp.rdmap.opcode).unwrap();
                if op.is_send() && f.ddp.last {
                    sends += 1;
                }
                if let (Opcode::Write, BufferModel::Tagged { stag, to }) = (op, f.ddp.model) {
                    if !f.payload.is_empty() {
                        writes.insert((stag, to), f.payload.to_vec());
                    }
                }
            }
            for i in 0..sends as u64 + 4 {
                us.post_recv(i, 1 << 20).unwrap();
            }
            let mut mem = Rec::default();
            let mut out = Vec::new();
            let mut o = 0;
            while o < end {
                o += us.handle_bytes(&a.data[o..end], &mut mem);
                while us.poll_transmit(&mut out, &mem) {}
            }
            assert_eq!(
                &out[..pn],
                &b.data[..pn],
                "{name}: our MPA Reply differs from siw's ({:02x?})",
                req.private_data
            );
            let mut recvs = 0;
            while let Some(e) = us.poll_event() {
                match e {
                    Event::Terminated { .. } | Event::Failed(_) => panic!("{name}: {e:?}"),
                    Event::Completion(c) => {
                        assert_eq!(
                            (c.opcode, c.status),
                            (WcOpcode::Recv, uiw_wire::WcStatus::Success)
                        );
                        recvs += 1;
                    }
                    _ => {}
                }
            }
            assert_eq!(recvs, sends, "{name}: receive completions");
            assert_eq!(mem.tagged, writes, "{name}: placed Write data");
            eprintln!(
                "{name}: reply identical, {sends} Sends received, {} Write segments placed",
                writes.len()
            );
        }
    }
}

/// The other way round: a uiw initiator configured like siw's client
/// sends a byte-identical MPA Request (and P2P RTR), issues the same Read
/// Requests byte for byte, and accepts siw's Reply, Sends and Read
/// Responses, placing the read data where siw's client did.
#[test]
fn uiw_initiator_matches_siw_client() {
    use std::collections::BTreeMap;
    use uiw_wire::conn::{Config, Connection, Event, Role, Rtr, WcOpcode};
    use uiw_wire::placement::{Access, Memory, MemoryIo, Placement, Source};
    use uiw_wire::TaggedError;

    #[derive(Default)]
    struct Rec(BTreeMap<(u32, u64), Vec<u8>>);
    impl Memory for Rec {
        fn check_tagged(&self, _: u32, _: u64, _: u32, _: Access) -> Result<(), TaggedError> {
            Ok(())
        }
    }
    impl MemoryIo for Rec {
        fn read(&self, _: Source, out: &mut [u8]) {
            out.fill(0)
        }
        fn write(&mut self, dst: Placement, data: &[u8]) {
            if let Placement::Tagged { stag, to } = dst {
                self.0.insert((stag, to), data.to_vec());
            }
        }
    }

    let Some(dir) = captures_dir() else { return };
    let mut checked = 0;
    for name in all_names(&dir).iter().filter(|n| n.starts_with("siw-read")) {
        let pcap = std::fs::read(dir.join(format!("{name}.pcap"))).unwrap();
        let (lt, pkts) = read_pcap(&pcap);
        for c in reassemble(lt, &pkts) {
            let (Some(a), Some(b)) = (c.a.first(), c.b.first()) else {
                continue;
            };
            let (req, rn) = RrFrame::parse(&a.data).unwrap();
            let (_, pn) = RrFrame::parse(&b.data).unwrap();
            // siw client's Read Requests (and RTR), in order.
            let mut theirs = Vec::new();
            let mut reqs = Vec::new();
            let mut off = rn;
            while let Ok((f, n)) = parse_fpdu(&a.data[off..]) {
                let op = Opcode::from_u8(f.ddp.rdmap.opcode).unwrap();
                if op == Opcode::ReadRequest || (op == Opcode::Write && f.payload.is_empty()) {
                    theirs.push(a.data[off..off + n].to_vec());
                }
                if op == Opcode::ReadRequest {
                    reqs.push(ReadRequest::parse(f.body).unwrap());
                }
                off += n;
            }
            if reqs.is_empty() {
                continue;
            }
            let io = req.ird_ord();
            let mut cfg = Config::new(Role::Initiator);
            cfg.mss = c.a.mss.unwrap() as usize;
            cfg.crc = req.hdr.crc();
            cfg.revision = req.hdr.revision;
            cfg.ird = io.map(|x| x.ird).unwrap_or(128);
            cfg.ord = io.map(|x| x.ord).unwrap_or(128);
            cfg.p2p = io.map(|x| x.p2p).unwrap_or(false);
            cfg.rtr = Rtr {
                write: io.map(|x| x.write_rtr).unwrap_or(false),
                read: io.map(|x| x.read_rtr).unwrap_or(false),
                send: false,
            };
            cfg.private_data = req.ulp_private_data().to_vec();
            let mut us = Connection::new(cfg, 0);
            let mut mem = Rec::default();
            let mut out = Vec::new();
            while us.poll_transmit(&mut out, &mem) {}
            assert_eq!(out, &a.data[..rn], "{name}: MPA Request differs");
            out.clear();
            let mut o = 0;
            while o < pn {
                o += us.handle_bytes(&b.data[o..pn], &mut mem);
            }
            assert!(us.is_established());
            for i in 0..64 {
                us.post_recv(1000 + i, 1 << 20).unwrap();
            }
            for (i, r) in reqs.iter().enumerate() {
                us.post_read(
                    i as u64,
                    r.sink_stag,
                    r.sink_to,
                    r.src_stag,
                    r.src_to,
                    r.size,
                )
                .unwrap();
            }
            // Feed siw's server stream (Sends, Read Responses) as far as it
            // was captured, transmitting as reads become allowed.
            let data_end = {
                let mut off = pn;
                while let Ok((_, n)) = parse_fpdu(&b.data[off..]) {
                    off += n;
                }
                off
            };
            while us.poll_transmit(&mut out, &mem) {}
            let mut o = pn;
            while o < data_end {
                o += us.handle_bytes(&b.data[o..data_end], &mut mem);
                while us.poll_transmit(&mut out, &mem) {}
            }
            let mut ours = Vec::new();
            let mut off = 0;
            while let Ok((_, n)) = parse_fpdu(&out[off..]) {
                ours.push(out[off..off + n].to_vec());
                off += n;
            }
            assert_eq!(
                ours, theirs,
                "{name}: our Read Requests / RTR differ from siw's"
            );
            let mut reads_done = 0;
            while let Some(e) = us.poll_event() {
                match e {
                    Event::Terminated { .. } | Event::Failed(_) => panic!("{name}: {e:?}"),
                    Event::Completion(c) if c.opcode == WcOpcode::RdmaRead => {
                        assert_eq!(c.status, uiw_wire::WcStatus::Success);
                        assert_eq!(c.byte_len, reqs[c.wr_id as usize].size);
                        reads_done += 1;
                    }
                    _ => {}
                }
            }
            assert!(reads_done > 0, "{name}");
            // Read data placed exactly where siw's Read Responses said.
            let mut want = BTreeMap::new();
            let mut off = pn;
            while let Ok((f, n)) = parse_fpdu(&b.data[off..data_end]) {
                if let (Some(Opcode::ReadResponse), BufferModel::Tagged { stag, to }) =
                    (f.ddp.rdmap.op(), f.ddp.model)
                {
                    if !f.payload.is_empty() {
                        want.insert((stag, to), f.payload.to_vec());
                    }
                }
                off += n;
            }
            assert_eq!(mem.0, want, "{name}: placed read data");
            eprintln!(
                "{name}: request, {} Read Requests identical; {reads_done} reads completed",
                ours.len()
            );
            checked += 1;
        }
    }
    assert!(checked >= 4);
}
