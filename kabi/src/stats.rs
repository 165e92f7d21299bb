//! The statistics file: one per process and device, `<state>/stats/<ibdev>.<pid>`.
//!
//! A process's provider maps its file `MAP_SHARED` and updates the counters on its own data
//! path; `uiw stat` reads the file with plain `read(2)` — no cooperation from the
//! application's threads, no socket, no lock. Layout (native byte order, every field
//! naturally aligned, all counters `u64`):
//!
//! ```text
//! offset  size  field
//!      0     8  magic "UIWSTAT1"
//!      8     4  version (2)
//!     12     4  header length (128)
//!     16     4  pid of the writing process
//!     20     4  QP slots (256)
//!     24     4  counters per block (16)
//!     28     4  bytes per QP slot (136)
//!     32     8  process start time (field 22 of /proc/<pid>/stat, clock ticks since boot):
//!               with the pid, tells a live writer from a dead one whose pid was reused
//!     40    64  ibdev name, NUL-padded
//!    104     8  fold sequence: odd while a destroyed QP's slot is being folded into the
//!               device block (version 2)
//!    112    16  reserved (0)
//!    128   128  device block: 16 counters — what the QPs without a slot counted, and what
//!               the folded slots counted (version 1: the sum over every QP)
//!    256   136  QP slot 0: a u64 word — bit 63 live, bit 62 destroyed, bit 61 folded into
//!               the device block, bits 0..23 the QPN, 0 = never used — then 16 counters
//!    ...        QP slots 1..255 (QPs beyond 256 live ones count in the device block only)
//! ```
//!
//! A process's totals are the device block plus every slot not folded into it ([`parse`]
//! adds them up): a QP's data path writes its own slot only, with plain stores (it is the
//! slot's one writer), and a QP's destroy folds its slot into the device block between two
//! steps of the fold sequence, which a reader ([`read`]) waits out. Version 1 files (the
//! device block the sum over every QP, each message added to it with locked instructions)
//! are read as they were written.
//!
//! Counter indices are [`Counter`]; unused indices read 0. A writer only ever adds to a
//! counter and sets a slot's word; a reader may see a slot's word and counters from
//! slightly different moments, never a torn 8-byte value (aligned, written atomically).

use std::fs;
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

pub const MAGIC: [u8; 8] = *b"UIWSTAT1";
pub const VERSION: u32 = 2;
pub const HEADER_LEN: usize = 128;
pub const NCOUNTERS: usize = 16;
pub const QP_SLOTS: usize = 256;
pub const SLOT_LEN: usize = 8 * (1 + NCOUNTERS);
pub const DEVICE_OFF: usize = HEADER_LEN;
pub const SLOTS_OFF: usize = DEVICE_OFF + 8 * NCOUNTERS;
pub const FILE_LEN: usize = SLOTS_OFF + QP_SLOTS * SLOT_LEN;
pub const SLOT_LIVE: u64 = 1 << 63;
pub const SLOT_DESTROYED: u64 = 1 << 62;
/// A destroyed slot whose counters were added to the device block (version 2).
pub const SLOT_FOLDED: u64 = 1 << 61;
/// Offset of the fold sequence (version 2).
pub const FOLD_SEQ_OFF: usize = 104;
pub const SLOT_QPN_MASK: u64 = 0xff_ffff;
pub const IBDEV_OFF: usize = 40;
pub const IBDEV_LEN: usize = 64;

/// The counters, by index in a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Counter {
    /// DDP payload bytes sent (Send, RDMA Write, Read Response)
    TxBytes = 0,
    /// DDP payload bytes received
    RxBytes = 1,
    /// RDMAP messages sent (each with its last FPDU)
    TxMsgs = 2,
    RxMsgs = 3,
    /// FPDUs sent
    TxFpdus = 4,
    RxFpdus = 5,
    /// Terminate messages sent / received
    TxTerminates = 6,
    RxTerminates = 7,
    /// Work requests completed with IBV_WC_WR_FLUSH_ERR
    FlushedWrs = 8,
    /// Streams that failed: connect refused or unreachable, reset, peer gone, MPA rejected
    ConnErrors = 9,
    /// Streams that completed MPA negotiation
    ConnEstablished = 10,
    /// Arrivals served by a thread blocked in `ibv_get_cq_event` (a read of the completion
    /// channel), not by the progress thread
    ReaderServes = 11,
}

/// `(index, name, what)` of every counter, in display order.
pub const COUNTERS: [(Counter, &str, &str); 12] = [
    (Counter::TxBytes, "tx_bytes", "payload bytes sent (Send, RDMA Write, Read Response)"),
    (Counter::RxBytes, "rx_bytes", "payload bytes received"),
    (Counter::TxMsgs, "tx_msgs", "RDMAP messages sent"),
    (Counter::RxMsgs, "rx_msgs", "RDMAP messages received"),
    (Counter::TxFpdus, "tx_fpdus", "FPDUs sent"),
    (Counter::RxFpdus, "rx_fpdus", "FPDUs received"),
    (Counter::TxTerminates, "tx_terminates", "Terminate messages sent"),
    (Counter::RxTerminates, "rx_terminates", "Terminate messages received"),
    (Counter::FlushedWrs, "flushed_wrs", "work requests completed as flushed"),
    (Counter::ConnErrors, "conn_errors", "streams that failed or were refused"),
    (Counter::ConnEstablished, "conn_established", "streams that completed MPA negotiation"),
    (Counter::ReaderServes, "reader_serves", "arrivals served by a thread waiting in ibv_get_cq_event"),
];

/// A mapped statistics file (or an anonymous mapping of the same layout, when no file can
/// be made): a fixed array of `u64` words updated atomically.
pub struct StatsMap {
    ptr: *mut AtomicU64,
    words: usize,
}

// SAFETY: the mapping is only accessed through `AtomicU64`s, which are Sync; the pointer
// stays valid until Drop (munmap), which needs exclusive ownership.
unsafe impl Send for StatsMap {}
// SAFETY: as above.
unsafe impl Sync for StatsMap {}

impl StatsMap {
    fn map(fd: i32) -> io::Result<StatsMap> {
        let flags = if fd < 0 { libc::MAP_SHARED | libc::MAP_ANONYMOUS } else { libc::MAP_SHARED };
        // SAFETY: a fresh shared mapping of FILE_LEN bytes (the file was sized first); the
        // kernel picks the address.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), FILE_LEN, libc::PROT_READ | libc::PROT_WRITE, flags, fd, 0) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(StatsMap { ptr: p as *mut AtomicU64, words: FILE_LEN / 8 })
    }

    /// Counters that live in this process only (no file could be made).
    pub fn anonymous(pid: u32, start_time: u64, ibdev: &str) -> io::Result<StatsMap> {
        let m = StatsMap::map(-1)?;
        m.write_header(pid, start_time, ibdev);
        Ok(m)
    }

    /// Creates (replacing any file of that name) and maps `path`, mode 0644.
    pub fn create(path: &Path, pid: u32, start_time: u64, ibdev: &str) -> io::Result<StatsMap> {
        let tmp = path.with_extension(format!("tmp{pid}"));
        let f = fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).mode(0o644).open(&tmp)?;
        let _ = f.set_permissions(fs::Permissions::from_mode(0o644));
        f.set_len(FILE_LEN as u64)?;
        let m = StatsMap::map(std::os::fd::AsRawFd::as_raw_fd(&f))?;
        m.write_header(pid, start_time, ibdev);
        // Readers never see a file without its header.
        if let Err(e) = fs::rename(&tmp, path) {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(m)
    }

    fn write_header(&self, pid: u32, start_time: u64, ibdev: &str) {
        let mut h = [0u8; HEADER_LEN];
        h[0..8].copy_from_slice(&MAGIC);
        h[8..12].copy_from_slice(&VERSION.to_ne_bytes());
        h[12..16].copy_from_slice(&(HEADER_LEN as u32).to_ne_bytes());
        h[16..20].copy_from_slice(&pid.to_ne_bytes());
        h[20..24].copy_from_slice(&(QP_SLOTS as u32).to_ne_bytes());
        h[24..28].copy_from_slice(&(NCOUNTERS as u32).to_ne_bytes());
        h[28..32].copy_from_slice(&(SLOT_LEN as u32).to_ne_bytes());
        h[32..40].copy_from_slice(&start_time.to_ne_bytes());
        let n = ibdev.len().min(IBDEV_LEN - 1);
        h[IBDEV_OFF..IBDEV_OFF + n].copy_from_slice(&ibdev.as_bytes()[..n]);
        for (i, w) in h.chunks_exact(8).enumerate() {
            self.word(i).store(u64::from_ne_bytes(w.try_into().unwrap()), Ordering::Relaxed);
        }
    }

    /// The `i`-th 8-byte word of the file.
    pub fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < self.words);
        // SAFETY: i is in bounds of the live mapping, which is 8-byte aligned (page aligned).
        unsafe { &*self.ptr.add(i) }
    }

    /// The fold sequence (see the module documentation).
    pub fn fold_seq(&self) -> &AtomicU64 {
        self.word(FOLD_SEQ_OFF / 8)
    }

    /// Words `first..first + N` of the file.
    fn words<const N: usize>(&self, first: usize) -> &[AtomicU64; N] {
        assert!(first + N <= self.words);
        // SAFETY: the N words are in bounds of the live mapping, which is 8-byte aligned
        // (page aligned); an array of N atomics has their layout.
        unsafe { &*(self.ptr.add(first) as *const [AtomicU64; N]) }
    }

    /// The device block's counters, indexed by [`Counter`] (one bounds check for all of
    /// them: a message's publish adds to several).
    pub fn device_counters(&self) -> &[AtomicU64; NCOUNTERS] {
        self.words(DEVICE_OFF / 8)
    }

    /// QP slot `slot`'s counters, indexed by [`Counter`].
    pub fn slot_counters(&self, slot: usize) -> &[AtomicU64; NCOUNTERS] {
        self.words((SLOTS_OFF + slot * SLOT_LEN) / 8 + 1)
    }

    /// A device-block counter.
    pub fn device(&self, c: Counter) -> &AtomicU64 {
        &self.device_counters()[c as usize]
    }

    /// QP slot `slot`'s word (`SLOT_LIVE | qpn`, …).
    pub fn slot_word(&self, slot: usize) -> &AtomicU64 {
        self.word((SLOTS_OFF + slot * SLOT_LEN) / 8)
    }

    /// A counter of QP slot `slot`.
    pub fn slot(&self, slot: usize, c: Counter) -> &AtomicU64 {
        &self.slot_counters(slot)[c as usize]
    }
}

impl Drop for StatsMap {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once; no reference outlives self.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, FILE_LEN) };
    }
}

/// A statistics file as read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub pid: u32,
    pub start_time: u64,
    pub ibdev: String,
    pub device: [u64; NCOUNTERS],
    /// `(qpn, destroyed, counters)` of every slot ever used.
    pub qps: Vec<(u32, bool, [u64; NCOUNTERS])>,
}

/// Reads and parses the statistics file at `path` ([`parse`]), waiting out a fold in
/// progress: the file is read again while its fold sequence is odd or moved during the read
/// (a fold takes microseconds; a writer that died in the middle of one leaves it odd, and
/// after a few tries the file is taken as it is). `Ok(None)`: not a statistics file.
pub fn read(path: &Path) -> io::Result<Option<Snapshot>> {
    use std::os::unix::fs::FileExt;
    let f = fs::File::open(path)?;
    let mut b = vec![0u8; FILE_LEN];
    for attempt in 0.. {
        match f.read_exact_at(&mut b, 0) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        let before = u64::from_ne_bytes(b[FOLD_SEQ_OFF..FOLD_SEQ_OFF + 8].try_into().unwrap());
        let mut after = [0u8; 8];
        f.read_exact_at(&mut after, FOLD_SEQ_OFF as u64)?;
        if (before % 2 == 0 && u64::from_ne_bytes(after) == before) || attempt >= 100 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
    Ok(parse(&b))
}

/// Parses the bytes of a statistics file; `None` if it is not one (or of an unknown
/// version). The snapshot's device counters are the process's totals: for version 2, the
/// device block plus every slot not folded into it.
pub fn parse(b: &[u8]) -> Option<Snapshot> {
    let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().unwrap());
    if b.len() < FILE_LEN || b[0..8] != MAGIC || !(1..=VERSION).contains(&u32_at(8)) {
        return None;
    }
    let folds = u32_at(8) >= 2;
    if u32_at(12) as usize != HEADER_LEN || u32_at(20) as usize != QP_SLOTS || u32_at(24) as usize != NCOUNTERS || u32_at(28) as usize != SLOT_LEN {
        return None;
    }
    let name = &b[IBDEV_OFF..IBDEV_OFF + IBDEV_LEN];
    let name = &name[..name.iter().position(|&c| c == 0).unwrap_or(IBDEV_LEN)];
    let block = |o: usize| {
        let mut c = [0u64; NCOUNTERS];
        for (i, v) in c.iter_mut().enumerate() {
            *v = u64_at(o + 8 * i);
        }
        c
    };
    let mut qps = Vec::new();
    let mut device = block(DEVICE_OFF);
    for s in 0..QP_SLOTS {
        let o = SLOTS_OFF + s * SLOT_LEN;
        let w = u64_at(o);
        if w & (SLOT_LIVE | SLOT_DESTROYED) != 0 {
            let counters = block(o + 8);
            if folds && w & SLOT_FOLDED == 0 {
                for (d, c) in device.iter_mut().zip(counters) {
                    *d = d.wrapping_add(c);
                }
            }
            qps.push(((w & SLOT_QPN_MASK) as u32, w & SLOT_LIVE == 0, counters));
        }
    }
    Some(Snapshot {
        pid: u32_at(16),
        start_time: u64_at(32),
        ibdev: String::from_utf8_lossy(name).into_owned(),
        device,
        qps,
    })
}

/// Field 22 of `/proc/<pid>/stat` (the process's start time in clock ticks since boot), or
/// `None` if there is no such process.
pub fn process_start_time(pid: u32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces.
    let rest = &s[s.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_round_trips_through_a_file() {
        let dir = std::env::temp_dir().join(format!("uiw-kabi-stats-{}", std::process::id()));
        let _ = fs::create_dir_all(&dir);
        let p = dir.join("uiw_lo.1");
        let st = process_start_time(std::process::id()).expect("own start time");
        let m = StatsMap::create(&p, 4242, st, "uiw_lo").unwrap();
        m.device(Counter::TxBytes).fetch_add(65536, Ordering::Relaxed);
        m.slot_word(3).store(SLOT_LIVE | 0x1001, Ordering::Relaxed);
        m.slot(3, Counter::RxMsgs).fetch_add(7, Ordering::Relaxed);
        m.slot_word(5).store(SLOT_DESTROYED | 0x2002, Ordering::Relaxed);
        let s = parse(&fs::read(&p).unwrap()).expect("parses");
        assert_eq!((s.pid, s.start_time, s.ibdev.as_str()), (4242, st, "uiw_lo"));
        assert_eq!(s.device[Counter::TxBytes as usize], 65536);
        assert_eq!(s.qps.len(), 2);
        assert_eq!((s.qps[0].0, s.qps[0].1, s.qps[0].2[Counter::RxMsgs as usize]), (0x1001, false, 7));
        assert_eq!((s.qps[1].0, s.qps[1].1), (0x2002, true));
        assert_eq!(fs::metadata(&p).unwrap().len(), FILE_LEN as u64);
        assert!(parse(&[0u8; FILE_LEN]).is_none());
        // Version 2: the totals are the device block plus the slots not folded into it.
        assert_eq!(s.device[Counter::RxMsgs as usize], 7, "a live QP's slot counts in the totals");
        m.slot(5, Counter::RxMsgs).fetch_add(100, Ordering::Relaxed);
        m.slot_word(5).store(SLOT_DESTROYED | SLOT_FOLDED | 0x2002, Ordering::Relaxed);
        let s = read(&p).unwrap().expect("reads");
        assert_eq!(s.device[Counter::RxMsgs as usize], 7, "a folded slot is in the device block already");
        assert_eq!(s.qps[1].2[Counter::RxMsgs as usize], 100, "and still readable");
        // Version 1: the device block was the sum over every QP.
        let mut b = fs::read(&p).unwrap();
        b[8..12].copy_from_slice(&1u32.to_ne_bytes());
        assert_eq!(parse(&b).unwrap().device[Counter::RxMsgs as usize], 0);
        b[8..12].copy_from_slice(&3u32.to_ne_bytes());
        assert!(parse(&b).is_none(), "an unknown version");
        // A fold in progress is waited out; one that never ends (its writer died) is taken
        // as it is after a few tries.
        m.fold_seq().store(1, Ordering::Relaxed);
        let m2 = std::sync::Arc::new(m);
        let folder = {
            let m = m2.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(2));
                m.device(Counter::RxMsgs).fetch_add(1000, Ordering::Relaxed);
                m.fold_seq().store(2, Ordering::Release);
            })
        };
        let s = read(&p).unwrap().unwrap();
        folder.join().unwrap();
        assert_eq!(s.device[Counter::RxMsgs as usize], 1007, "read after the fold ended");
        m2.fold_seq().store(3, Ordering::Relaxed);
        assert_eq!(read(&p).unwrap().unwrap().device[Counter::RxMsgs as usize], 1007, "a fold that never ends");
        let m = std::sync::Arc::into_inner(m2).unwrap();
        drop(m);
        let _ = fs::remove_dir_all(&dir);
    }
}
