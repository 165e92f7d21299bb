//! Byte stream → Deframer (any chunking, CRC on or off) and parse_fpdu.
//! Invariants: no panic; consumption always progresses; every Segment is
//! followed by payload summing to its payload_len and then End; a stream
//! re-encoded from parsed FPDUs parses identically.
#![no_main]
use libfuzzer_sys::fuzz_target;
use uiw_wire::segment::{encode_fpdu_with_pad, parse_fpdu, Deframer, RxEvent};

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let crc_on = data[0] & 1 != 0;
    let chunk = 1 + (data[0] >> 1) as usize;
    let stream = &data[1..];
    let mut d = Deframer::new(crc_on);
    let mut pending: Option<u32> = None;
    'outer: for c in stream.chunks(chunk) {
        let mut c = c;
        while !c.is_empty() {
            let (n, ev) = match d.feed(c) {
                Ok(x) => x,
                Err(_) => break 'outer,
            };
            assert!(n > 0 && n <= c.len());
            match ev {
                Some(RxEvent::Segment(s)) => {
                    assert!(pending.is_none());
                    pending = Some(s.payload_len);
                }
                Some(RxEvent::Payload(k)) => {
                    assert_eq!(k, n);
                    let p = pending.as_mut().expect("payload without segment");
                    *p -= k as u32;
                }
                Some(RxEvent::End { .. }) => {
                    assert_eq!(pending.take(), Some(0));
                }
                None => {}
            }
            c = &c[n..];
        }
    }
    // In-memory parser and round trip.
    let mut off = 0;
    while let Ok((f, n)) = parse_fpdu(&stream[off..]) {
        let mut re = Vec::new();
        encode_fpdu_with_pad(&f.ddp, f.body, f.payload, f.pad, true, &mut re);
        let (g, m) = parse_fpdu(&re).expect("re-encoded FPDU must parse");
        assert_eq!(m, n);
        assert_eq!(g.ddp, f.ddp);
        assert!(g.crc_ok());
        assert_eq!(&re[..n - 4], &stream[off..off + n - 4]);
        off += n;
    }
});
