//! An established connection (responder, after a valid MPA Request) fed
//! arbitrary FPDU bytes: placement, DDP rules, Terminate generation, through
//! the copying API or the staged one (`rx_staged`). The toy memory accepts
//! STag 0x100 for TO 0..4096.
#![no_main]
use libfuzzer_sys::fuzz_target;
use uiw_wire::conn::{Config, Connection, Role};
use uiw_wire::mpa::{encode_rr, FrameKind, IrdOrd};
use uiw_wire::placement::{Access, Memory, MemoryIo, Placement, Source};
use uiw_wire::rdmap::AtomicOperation;
use uiw_wire::TaggedError;

struct Mem {
    buf: Vec<u8>,
    recv: Vec<u8>,
}
impl Memory for Mem {
    fn check_tagged(&self, stag: u32, to: u64, len: u32, _: Access) -> Result<(), TaggedError> {
        if stag != 0x100 {
            return Err(TaggedError::InvalidStag);
        }
        if to.checked_add(len as u64).map_or(true, |e| e > 4096) {
            return Err(TaggedError::BaseBounds);
        }
        Ok(())
    }
    fn invalidate(&mut self, stag: u32) -> Result<(), TaggedError> {
        if stag == 0x100 { Ok(()) } else { Err(TaggedError::InvalidStag) }
    }
    fn atomic(&mut self, _: u32, to: u64, op: AtomicOperation) -> Result<u64, TaggedError> {
        let o = to as usize;
        let old = u64::from_ne_bytes(self.buf[o..o + 8].try_into().unwrap());
        self.buf[o..o + 8].copy_from_slice(&op.apply(old).to_ne_bytes());
        Ok(old)
    }
}
impl MemoryIo for Mem {
    fn read(&self, src: Source, out: &mut [u8]) {
        if let Source::Tagged { to, .. } = src {
            out.copy_from_slice(&self.buf[to as usize..][..out.len()]);
        }
    }
    fn write(&mut self, dst: Placement, data: &[u8]) {
        match dst {
            Placement::Tagged { to, .. } => self.buf[to as usize..][..data.len()].copy_from_slice(data),
            Placement::Recv { offset, .. } => self.recv[offset as usize..][..data.len()].copy_from_slice(data),
            Placement::Discard => {}
        }
    }
}

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let sel = data[0];
    let mut cfg = Config::new(Role::Responder);
    cfg.extensions = true;
    cfg.ird = 2;
    let mut c = Connection::new(cfg, 0);
    let mut m = Mem { buf: vec![0; 4096], recv: vec![0; 2048] };
    let mut req = Vec::new();
    let flags = (if sel & 1 != 0 { 0x40 } else { 0 }) | 0x01;
    encode_rr(FrameKind::Request, flags, 2, Some(IrdOrd { ird: 4, ord: 4, ..Default::default() }), &[], &mut req);
    let mut r = &req[..];
    while !r.is_empty() {
        let n = c.handle_bytes(r, &mut m);
        r = &r[n..];
    }
    for i in 0..(sel >> 1) % 4 {
        let _ = c.post_recv(i as u64, 512 * (i as u32 + 1) - 1);
    }
    if sel & 0x40 != 0 {
        let _ = c.post_fence();
    }
    let mut out = Vec::new();
    let mut rest = &data[1..];
    // Half the inputs go through the staged API first (as the engine's staging buffer does;
    // `handle_staged`, its copying convenience); where it stops, one step of `handle_bytes`.
    let staged = sel & 0x80 != 0;
    while !rest.is_empty() {
        let mut n = if staged { c.handle_staged(rest, &mut m) } else { 0 };
        if n == 0 {
            n = c.handle_bytes(rest, &mut m);
        }
        assert!(n > 0 && n <= rest.len());
        rest = &rest[n..];
        while c.poll_transmit(&mut out, &m) {}
        while c.poll_event().is_some() {}
    }
});
