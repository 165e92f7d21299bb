//! MPA Request/Reply parser and the Connection's negotiation on arbitrary
//! bytes, as responder and as initiator.
#![no_main]
use libfuzzer_sys::fuzz_target;
use uiw_wire::conn::{Config, Connection, Role};
use uiw_wire::mpa::{IrdOrd, RrFrame};
use uiw_wire::placement::{Access, Memory, MemoryIo, Placement, Source};
use uiw_wire::TaggedError;

struct NoMem;
impl Memory for NoMem {
    fn check_tagged(&self, _: u32, _: u64, _: u32, _: Access) -> Result<(), TaggedError> {
        Err(TaggedError::InvalidStag)
    }
}
impl MemoryIo for NoMem {
    fn read(&self, _: Source, out: &mut [u8]) {
        out.fill(0)
    }
    fn write(&mut self, _: Placement, _: &[u8]) {}
}

fuzz_target!(|data: &[u8]| {
    if let Ok((f, n)) = RrFrame::parse(data) {
        assert!(n <= data.len());
        let mut re = Vec::new();
        f.encode(&mut re);
        assert_eq!(&re[..], &data[..n]);
        let _ = f.ird_ord();
        let _ = f.ulp_private_data();
    }
    if let Ok(io) = IrdOrd::parse(data) {
        assert_eq!(IrdOrd::parse(&io.encode()).unwrap(), io);
    }
    if data.is_empty() {
        return;
    }
    let sel = data[0];
    for role in [Role::Initiator, Role::Responder] {
        let mut cfg = Config::new(role);
        cfg.crc = sel & 1 != 0;
        cfg.p2p = sel & 2 != 0;
        cfg.extensions = sel & 4 != 0;
        cfg.revision = if sel & 8 != 0 { 1 } else { 2 };
        cfg.mss = 64 + (sel as usize) * 8;
        cfg.manual_accept = sel & 0x10 != 0;
        let mut c = Connection::new(cfg, 0);
        let mut m = NoMem;
        let mut out = Vec::new();
        while c.poll_transmit(&mut out, &m) {}
        let _ = c.post_recv(1, 100);
        let mut rest = &data[1..];
        while !rest.is_empty() {
            let n = c.handle_bytes(rest, &mut m);
            assert!(n <= rest.len());
            assert!(n > 0 || c.state() == uiw_wire::conn::State::WaitAccept);
            rest = &rest[n..];
            let mut k = 0;
            while c.poll_transmit(&mut out, &m) {
                k += 1;
                assert!(k < 100_000);
            }
            while let Some(ev) = c.poll_event() {
                if let uiw_wire::conn::Event::ConnectRequest(_) = ev {
                    if sel & 0x20 != 0 {
                        c.reject(b"no").unwrap();
                    } else {
                        c.accept(2, 2, b"ok", 0).unwrap();
                    }
                }
            }
            if rest.len() > 1 && c.state() == uiw_wire::conn::State::WaitAccept {
                break;
            }
        }
        c.handle_timeout(u64::MAX);
    }
});
