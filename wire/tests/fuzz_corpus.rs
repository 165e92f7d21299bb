//! Replays the committed fuzz corpora (`fuzz/corpus/*`) through the
//! parsers and a connection on stable Rust, so regressions show up in
//! `cargo test` without cargo-fuzz.

use uiw_wire::conn::{Config, Connection, Role};
use uiw_wire::ddp::DdpHeader;
use uiw_wire::mpa::{encode_rr, FrameKind, IrdOrd, RrFrame};
use uiw_wire::placement::{Access, Memory, MemoryIo, Placement, Source};
use uiw_wire::rdmap::{ReadRequest, Terminate};
use uiw_wire::segment::{parse_fpdu, Deframer};
use uiw_wire::TaggedError;

struct Mem(Vec<u8>);
impl Memory for Mem {
    fn check_tagged(&self, stag: u32, to: u64, len: u32, _: Access) -> Result<(), TaggedError> {
        if stag != 0x100 {
            return Err(TaggedError::InvalidStag);
        }
        if to.checked_add(len as u64).filter(|&e| e <= 4096).is_none() {
            return Err(TaggedError::BaseBounds);
        }
        Ok(())
    }
}
impl MemoryIo for Mem {
    fn read(&self, src: Source, out: &mut [u8]) {
        if let Source::Tagged { to, .. } = src {
            out.copy_from_slice(&self.0[to as usize..][..out.len()]);
        }
    }
    fn write(&mut self, dst: Placement, data: &[u8]) {
        if let Placement::Tagged { to, .. } = dst {
            self.0[to as usize..][..data.len()].copy_from_slice(data);
        }
    }
}

fn run_one(data: &[u8]) {
    let _ = DdpHeader::parse(data);
    let _ = ReadRequest::parse(data);
    let _ = Terminate::parse(data);
    let _ = RrFrame::parse(data);
    let mut off = 0;
    while let Ok((_, n)) = parse_fpdu(&data[off..]) {
        off += n;
    }
    for crc in [false, true] {
        let mut d = Deframer::new(crc);
        let mut rest = data;
        while !rest.is_empty() {
            match d.feed(rest) {
                Ok((n, _)) => rest = &rest[n..],
                Err(_) => break,
            }
        }
    }
    // As stream input of an established responder (through the copying API and through the
    // staged one, `rx_staged`, with the copying one where it stops) and of a fresh one.
    for (established, staged) in [(true, false), (true, true), (false, false)] {
        let mut c = Connection::new(Config::new(Role::Responder), 0);
        let mut m = Mem(vec![0; 4096]);
        if established {
            let mut req = Vec::new();
            encode_rr(
                FrameKind::Request,
                0,
                2,
                Some(IrdOrd {
                    ird: 4,
                    ord: 4,
                    ..Default::default()
                }),
                &[],
                &mut req,
            );
            let mut r = &req[..];
            while !r.is_empty() {
                let n = c.handle_bytes(r, &mut m);
                r = &r[n..];
            }
            c.post_recv(1, 1000).unwrap();
        }
        let mut out = Vec::new();
        let mut rest = data;
        while !rest.is_empty() {
            let mut n = if staged { c.handle_staged(rest, &mut m) } else { 0 };
            if n == 0 {
                n = c.handle_bytes(rest, &mut m);
            }
            assert!(n > 0);
            rest = &rest[n..];
            while c.poll_transmit(&mut out, &m) {}
            while c.poll_event().is_some() {}
        }
    }
}

#[test]
fn replay_fuzz_corpora() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let Ok(targets) = std::fs::read_dir(&dir) else {
        eprintln!("note: no fuzz corpus at {}", dir.display());
        return;
    };
    let mut n = 0;
    for t in targets {
        let t = t.unwrap().path();
        for f in std::fs::read_dir(&t).unwrap() {
            let data = std::fs::read(f.unwrap().path()).unwrap();
            run_one(&data);
            if !data.is_empty() {
                run_one(&data[1..]);
            }
            n += 1;
        }
    }
    eprintln!("replayed {n} corpus inputs");
}
