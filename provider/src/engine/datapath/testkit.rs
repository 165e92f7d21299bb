//! Pieces for driving a [`super::DataPath`] with no device behind it, shared by the in-memory
//! tests (`tests.rs`) and the fuzz harness (`fuzz.rs`): application memory as one Vec-backed
//! arena in a made-up address space, and completion queues whose event sockets nobody reads.
//! Built for `cargo test` and with the `fuzzing` feature only.

use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};

use crate::engine::cq::CqObj;
use crate::engine::events::EventQueue;
use crate::engine::user_memory::{AtomicOperation, Crc32c, IoPart, Pinned, UserMemory};

/// Where an arena starts in the made-up address space its regions use.
pub const BASE: u64 = 0x1_0000;

/// Application memory as one arena, addressed from [`BASE`]; it has no descriptors. The
/// second field counts the bytes checksummed in place ([`UserMemory::crc32c`]).
pub struct Arena(pub StdMutex<Vec<u8>>, pub AtomicUsize);

impl Arena {
    /// `len` zero bytes.
    pub fn new(len: usize) -> Arena {
        Arena::with(vec![0u8; len])
    }
    /// An arena holding `image`.
    pub fn with(image: Vec<u8>) -> Arena {
        Arena(StdMutex::new(image), AtomicUsize::new(0))
    }
    /// Bytes checksummed where they lie so far.
    pub fn checksummed(&self) -> usize {
        self.1.load(Ordering::Relaxed)
    }
    fn at(p: &Pinned) -> usize {
        (p.addr() - BASE) as usize
    }
    pub fn get(&self, addr: u64, len: usize) -> Vec<u8> {
        let a = (addr - BASE) as usize;
        self.0.lock().unwrap()[a..a + len].to_vec()
    }
    pub fn set(&self, addr: u64, data: &[u8]) {
        let a = (addr - BASE) as usize;
        self.0.lock().unwrap()[a..a + data.len()].copy_from_slice(data);
    }
}

impl UserMemory for Arena {
    fn recv(&self, _: std::os::fd::RawFd, _: &Pinned, _: &mut [u8]) -> std::io::Result<usize> {
        panic!("the in-memory stream never hands a descriptor to UserMemory::recv")
    }
    fn send(&self, _: std::os::fd::RawFd, _: &[IoPart<'_>]) -> std::io::Result<usize> {
        panic!("the in-memory stream never hands a descriptor to UserMemory::send")
    }
    fn read(&self, src: &Pinned, out: &mut [u8]) {
        let a = Self::at(src);
        let n = out.len().min(src.len());
        out[..n].copy_from_slice(&self.0.lock().unwrap()[a..a + n]);
    }
    fn crc32c(&self, src: &Pinned, len: usize, crc: &mut Crc32c) {
        let a = Self::at(src);
        let n = len.min(src.len());
        crc.update(&self.0.lock().unwrap()[a..a + n]);
        self.1.fetch_add(n, Ordering::Relaxed);
    }
    fn write(&self, dst: &Pinned, data: &[u8]) {
        let a = Self::at(dst);
        let n = data.len().min(dst.len());
        self.0.lock().unwrap()[a..a + n].copy_from_slice(&data[..n]);
    }
    /// RFC 7306 §5.1: the original value is returned, the new one stored (native byte order,
    /// as the FFI layer's atomics on application memory).
    fn atomic(&self, dst: &Pinned, op: AtomicOperation) -> u64 {
        let a = Self::at(dst);
        let mut m = self.0.lock().unwrap();
        let old = u64::from_ne_bytes(m[a..a + 8].try_into().unwrap());
        m[a..a + 8].copy_from_slice(&op.apply(old).to_ne_bytes());
        old
    }
}

/// A completion queue of 256 entries whose events go to a socket nobody reads.
pub fn cq() -> CqObj {
    let (a, b) = UnixStream::pair().unwrap();
    let unread = b.try_clone().unwrap();
    CqObj::new(256, None, Arc::new(EventQueue::new(a, unread, 16)))
}
