//! DDP/RDMAP header parsers: DDP header, Read Request, Atomic
//! Request/Response, Terminate (both layouts). Parse → encode must give
//! back the input bytes (Terminate: after normalising to RFC layout, parse
//! again gives the same value).
#![no_main]
use libfuzzer_sys::fuzz_target;
use uiw_wire::ddp::DdpHeader;
use uiw_wire::rdmap::{AtomicRequest, AtomicResponse, ReadRequest, TermLayout, Terminate};

fuzz_target!(|data: &[u8]| {
    if let Ok((h, n)) = DdpHeader::parse(data) {
        let mut out = [0u8; 18];
        assert_eq!(h.encode(&mut out), n);
        assert_eq!(&out[..n], &data[..n]);
        let rest = &data[n..];
        if let Ok(r) = ReadRequest::parse(rest) {
            let mut o = [0u8; 28];
            r.encode(&mut o);
            assert_eq!(&o[..], &rest[..28]);
        }
        if let Ok(a) = AtomicRequest::parse(rest) {
            let mut o = [0u8; 52];
            a.encode(&mut o);
            assert_eq!(&o[..], &rest[..52]);
            let _ = a.op();
        }
        if let Ok(a) = AtomicResponse::parse(rest) {
            let mut o = [0u8; 12];
            a.encode(&mut o);
            assert_eq!(&o[..], &rest[..12]);
        }
        let _ = h.rdmap.op().map(|o| (o.body_len(), o.queue(), o.is_control()));
    }
    if let Ok((t, layout)) = Terminate::parse(data) {
        let mut o = [0u8; 64];
        let n = t.encode(&mut o);
        assert_eq!(n, t.len());
        let (t2, l2) = Terminate::parse(&o[..n]).expect("own Terminate must parse");
        assert_eq!(l2, TermLayout::Rfc);
        // The code/flags may be read differently only when the siw
        // heuristic applied to ambiguous input; values must survive.
        if layout == TermLayout::Rfc || t.m || t.d || t.r {
            assert_eq!(t2, t);
        }
    }
});
