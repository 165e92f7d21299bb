//! Memory regions: STag allocation and the checks a kernel provider makes at registration
//! (`ib_check_mr_access`) and at every access (RFC 5040 §5 / RFC 5041 §7: invalid STag,
//! base-and-bounds, access rights, protection domain).
//!
//! **Reaching user memory.** The engine never names an address on its own: the checks here
//! hand out a [`Span`] (a range inside a live region), and [`Span::pin`] turns it into a
//! [`Pinned`] range, the only thing [`super::user_memory::UserMemory`] reads, writes and does
//! socket I/O on. [`MrTable::deregister`] makes a region's spans unpinnable and returns only
//! when no pin is left: no transfer touches the memory after `ibv_dereg_mr` returns.
//!
//! uiw uses one STag as both lkey and rkey, shaped like siw's: a 24-bit index and an 8-bit
//! random key (`0xIIIIIIKK`), so that a stale STag of a re-used index does not match and a
//! peer cannot guess one STag from another.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

pub use super::access;

/// A registered region. `iova` is the address the peer and the lkeys use (the virtual address,
/// or 0 with `IBV_ACCESS_ZERO_BASED`, or the `hca_va` of `ibv_reg_mr_iova`); `addr` is where the
/// bytes are in this process.
#[derive(Debug)]
pub struct Mr {
    pub stag: u32,
    pub pd: u32,
    pub addr: u64,
    pub iova: u64,
    pub length: u64,
    pub access: u32,
    /// Pins held on the region (low bits) and [`GONE`] once deregistration started. Private:
    /// only this module makes an `Mr`, so no other code can make up a region's address.
    pins: AtomicU64,
}

/// Set in [`Mr::pins`] when the region is being deregistered: no new pin succeeds.
const GONE: u64 = 1 << 63;

/// A checked range of a registered region (base, bounds, rights and protection domain were
/// checked when it was made). Holding one does not keep the memory registered: pin it for
/// the duration of an access.
#[derive(Debug, Clone)]
pub struct Span {
    mr: Arc<Mr>,
    addr: u64,
    len: u64,
}

impl Span {
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The region it is in.
    pub fn mr(&self) -> &Arc<Mr> {
        &self.mr
    }

    /// `[offset, offset+len)` of this span; `None` unless entirely inside it (checked
    /// arithmetic: offsets can come from a peer).
    pub fn sub(&self, offset: u64, len: u64) -> Option<Span> {
        let end = offset.checked_add(len)?;
        (end <= self.len).then(|| Span { mr: self.mr.clone(), addr: self.addr + offset, len })
    }

    /// Pins the range for an access; `None` once its region is being deregistered.
    pub fn pin(&self) -> Option<Pinned<'_>> {
        Pinned::new(&self.mr, self.addr, self.len)
    }

    /// Pins `len` bytes at `offset` of the span (`None` past its end, or once its region is
    /// being deregistered).
    pub fn pin_sub(&self, offset: u64, len: u64) -> Option<Pinned<'_>> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        Pinned::new(&self.mr, self.addr + offset, len)
    }

    /// Pins the span from `offset` to its end (`None` past its end, or once its region is
    /// being deregistered).
    pub fn pin_from(&self, offset: u64) -> Option<Pinned<'_>> {
        self.pin_sub(offset, self.len.checked_sub(offset)?)
    }
}

/// A pinned range of registered memory: while it exists, deregistering its region waits. What
/// [`super::user_memory::UserMemory`] accesses.
///
/// It borrows the region from the [`Span`] it was pinned from rather than taking a reference
/// of its own: a pin is an access, over within the call that makes it, and a reference taken
/// and dropped around each was two more locked instructions on every placement and every
/// send from registered memory.
#[derive(Debug)]
pub struct Pinned<'a> {
    mr: &'a Mr,
    addr: u64,
    len: u64,
}

impl<'a> Pinned<'a> {
    /// Pins `[addr, addr+len)` of `mr` (checked by the caller); `None` once deregistration began.
    fn new(mr: &'a Mr, addr: u64, len: u64) -> Option<Pinned<'a>> {
        let prev = mr.pins.fetch_add(1, Ordering::AcqRel);
        if prev & GONE != 0 {
            mr.pins.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Pinned { mr, addr, len })
    }

    /// Where the range is in this process (for the FFI layer's raw access).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `[offset, offset+len)` of this range, pinned in turn (the region stays registered
    /// while either is held); `None` unless entirely inside it.
    pub fn sub(&self, offset: usize, len: usize) -> Option<Pinned<'a>> {
        let end = (offset as u64).checked_add(len as u64)?;
        if end > self.len {
            return None;
        }
        // This range's own pin keeps the region from going meanwhile: the count only rises.
        self.mr.pins.fetch_add(1, Ordering::AcqRel);
        Some(Pinned { mr: self.mr, addr: self.addr + offset as u64, len: len as u64 })
    }
}

impl Drop for Pinned<'_> {
    fn drop(&mut self) {
        self.mr.pins.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Why an access through an STag was refused (RFC 5041 §7.2 tagged-buffer errors, RFC 5040 §7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessError {
    /// No region has this STag.
    InvalidStag,
    /// The region belongs to another protection domain.
    PdMismatch,
    /// The range is not inside the region.
    BaseBounds,
    /// The region does not grant the needed right.
    AccessRights,
}

impl Mr {
    /// Checks `[to, to+len)` (in the region's iova space) and `needed` rights; returns the byte
    /// offset into the region.
    pub fn check(&self, pd: u32, to: u64, len: u64, needed: u32) -> Result<u64, AccessError> {
        if self.pd != pd {
            return Err(AccessError::PdMismatch);
        }
        let off = to.checked_sub(self.iova).ok_or(AccessError::BaseBounds)?;
        let end = off.checked_add(len).ok_or(AccessError::BaseBounds)?;
        if end > self.length {
            return Err(AccessError::BaseBounds);
        }
        // Local read is always granted; everything else must have been asked for.
        if needed & !self.access != 0 {
            return Err(AccessError::AccessRights);
        }
        Ok(off)
    }

    /// [`Mr::check`], and the checked range as a [`Span`]. The span takes the reference
    /// (callers hold one just looked up: a clone and a drop were two locked instructions on
    /// every SGE of every post).
    pub fn span(self: Arc<Mr>, pd: u32, to: u64, len: u64, needed: u32) -> Result<Span, AccessError> {
        let off = self.check(pd, to, len, needed)?;
        let addr = self.addr + off;
        Ok(Span { mr: self, addr, len })
    }

    /// The region from `to` (iova space) to its end, for placement whose length the protocol
    /// core has already checked; `None` if `to` is outside. Takes the reference, as
    /// [`Mr::span`].
    pub fn span_from(self: Arc<Mr>, to: u64) -> Option<Span> {
        let off = to.checked_sub(self.iova)?;
        if off >= self.length {
            return None;
        }
        let (addr, len) = (self.addr + off, self.length - off);
        Some(Span { mr: self, addr, len })
    }

    /// Stops new pins and waits until the pins held are released (each covers one system call
    /// or copy, never a wait for the network).
    fn retire(&self) {
        let mut prev = self.pins.fetch_or(GONE, Ordering::AcqRel);
        let mut spins = 0u32;
        while prev & !GONE != 0 {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            prev = self.pins.load(Ordering::Acquire);
        }
    }
}

/// Why a registration was refused, with the errno the kernel returns for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegError {
    /// Remote write or atomic access without local write (`ib_check_mr_access`): EINVAL.
    RemoteWriteWithoutLocalWrite,
    /// A flag libibverbs does not define: EINVAL.
    UnknownAccessFlag,
    /// On-demand paging asked of a device without it: EOPNOTSUPP.
    OnDemandUnsupported,
    /// Zero length, or a range that wraps around the address space: EINVAL.
    BadRange,
    /// More regions than `max_mr`: ENOMEM.
    TooMany,
}


/// MR indices stay below this: STags `0xffXX_XXXX` are reserved for the Read sinks.
pub const MAX_INDEX: u32 = 0x00ff_0000;

/// Hashes an STag for the region table with one multiplication (Fibonacci hashing). The
/// default SipHash cost ~170 instructions per lookup, and every posted WR and every tagged
/// arrival looks one up. SipHash's defence against hash flooding is not needed here: only
/// `register` inserts, with STags of our own choosing (sequential indices); a peer's STags
/// are only looked up.
#[derive(Default)]
struct StagHasher(u64);

impl Hasher for StagHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ u64::from(n)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type StagBuild = BuildHasherDefault<StagHasher>;

/// All regions of one device context, by STag.
#[derive(Debug)]
pub struct MrTable {
    regions: RwLock<HashMap<u32, Arc<Mr>, StagBuild>>,
    /// STags invalidated by a peer's Send with Invalidate (RFC 5040 §5.2): no longer valid for
    /// remote access until deregistered.
    invalidated: RwLock<HashSet<u32, StagBuild>>,
    /// Whether any STag was ever invalidated: until one is, a peer's access looks at no set
    /// (one lock fewer per tagged FPDU).
    any_invalidated: AtomicBool,
    next_index: AtomicU32,
    max: usize,
    /// The key byte every STag gets instead of a random one: only [`MrTable::with_fixed_keys`]
    /// (tests and the fuzz harness) sets it, so that a peer's bytes can name a region.
    fixed_key: Option<u8>,
}

impl MrTable {
    pub fn new(max: usize) -> MrTable {
        MrTable {
            regions: RwLock::new(HashMap::default()),
            invalidated: RwLock::new(HashSet::default()),
            any_invalidated: AtomicBool::new(false),
            next_index: AtomicU32::new(1),
            max,
            fixed_key: None,
        }
    }

    /// A table whose STags are predictable: `index << 8 | key`, indices from 1 in registration
    /// order. For tests and the fuzz harness (`datapath::fuzz`), whose recorded peer streams
    /// name regions by STag; never for a device a peer can reach (RFC 5042 §5).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn with_fixed_keys(max: usize, key: u8) -> MrTable {
        MrTable { fixed_key: Some(key), ..MrTable::new(max) }
    }

    /// Registers `[addr, addr+length)`, seen by peers at `iova`.
    pub fn register(&self, pd: u32, addr: u64, length: u64, iova: u64, access_flags: u32) -> Result<Arc<Mr>, RegError> {
        if access_flags & !access::MR_KNOWN != 0 {
            return Err(RegError::UnknownAccessFlag);
        }
        if access_flags & access::ON_DEMAND != 0 {
            return Err(RegError::OnDemandUnsupported);
        }
        if access_flags & (access::REMOTE_WRITE | access::REMOTE_ATOMIC) != 0 && access_flags & access::LOCAL_WRITE == 0 {
            return Err(RegError::RemoteWriteWithoutLocalWrite);
        }
        if length == 0 || addr.checked_add(length).is_none() || iova.checked_add(length).is_none() {
            return Err(RegError::BadRange);
        }
        let iova = if access_flags & access::ZERO_BASED != 0 { 0 } else { iova };
        let mut regions = self.regions.write();
        if regions.len() >= self.max {
            return Err(RegError::TooMany);
        }
        let stag = loop {
            // 24-bit index below MAX_INDEX (the STags from 0xff00_0000 up are the Read sinks'
            // tags, see link.rs), 8-bit key drawn at random (RFC 5042 §5: a peer that saw
            // one STag cannot guess the next, and a stale STag of a re-used index is refused
            // unless the key repeats, 1 in 256).
            let n = self.next_index.fetch_add(1, Ordering::Relaxed) % MAX_INDEX;
            let key = self.fixed_key.unwrap_or_else(|| super::random::u64() as u8);
            let stag = (n << 8) | u32::from(key);
            if n != 0 && !regions.contains_key(&stag) {
                break stag;
            }
        };
        let mr = Arc::new(Mr { stag, pd, addr, iova, length, access: access_flags, pins: AtomicU64::new(0) });
        regions.insert(stag, mr.clone());
        Ok(mr)
    }

    /// `ibv_dereg_mr`: returns once no transfer touches the region any more (see the module
    /// documentation); later accesses through its STag or its spans fail.
    pub fn deregister(&self, stag: u32) -> Option<Arc<Mr>> {
        self.invalidated.write().remove(&stag);
        let mr = self.regions.write().remove(&stag)?;
        mr.retire();
        Some(mr)
    }

    /// The region a peer may address with `stag` (not invalidated).
    pub fn lookup_remote(&self, stag: u32) -> Option<Arc<Mr>> {
        if self.invalidated(stag) {
            return None;
        }
        self.lookup(stag)
    }

    /// Whether a peer invalidated `stag` (RFC 5040 §5.2) and it is still registered.
    fn invalidated(&self, stag: u32) -> bool {
        self.any_invalidated.load(Ordering::Acquire) && self.invalidated.read().contains(&stag)
    }

    /// Send with Invalidate: `stag` of protection domain `pd` stops being valid for remote
    /// access. False if no such region exists there.
    pub fn invalidate(&self, stag: u32, pd: u32) -> bool {
        match self.lookup(stag) {
            Some(mr) if mr.pd == pd => {
                self.any_invalidated.store(true, Ordering::Release);
                self.invalidated.write().insert(stag);
                true
            }
            _ => false,
        }
    }

    pub fn lookup(&self, stag: u32) -> Option<Arc<Mr>> {
        self.regions.read().get(&stag).cloned()
    }

    /// Deregisters every region of `pd`; returns how many there were.
    pub fn deregister_pd(&self, pd: u32) -> usize {
        let mut regions = self.regions.write();
        let stags: Vec<u32> = regions.values().filter(|m| m.pd == pd).map(|m| m.stag).collect();
        let mut invalidated = self.invalidated.write();
        let mut gone = Vec::new();
        for s in &stags {
            gone.extend(regions.remove(s));
            invalidated.remove(s);
        }
        drop(invalidated);
        drop(regions);
        for mr in gone {
            mr.retire();
        }
        stags.len()
    }

    /// Regions still registered under `pd` (a PD cannot be freed while any exist: EBUSY).
    pub fn count_in_pd(&self, pd: u32) -> usize {
        self.regions.read().values().filter(|m| m.pd == pd).count()
    }
}

/// The region a QP addressed last, kept by the QP (under its lock) beside the table it came
/// from: the next access through the same STag finds it without the table's lock.
///
/// A ping-pong's message and its answer address one region three times between the `recv`
/// that brings the message and the `send` of the answer (the peer's Write checked, its
/// payload placed, the answer's SGE resolved); each table lookup took the table's read lock
/// and released it, two locked instructions of the thirty on that path. What the table
/// would say is what the hint says: a region found deregistered (or being deregistered) is
/// looked up again, and the STag a peer invalidated is refused as the table refuses it.
/// Holding the region's reference keeps only its description, never its memory: accesses
/// still pin it ([`Span::pin`]), which fails once `ibv_dereg_mr` began.
#[derive(Default)]
pub struct MrHint {
    last: std::cell::Cell<Option<Arc<Mr>>>,
}

impl std::fmt::Debug for MrHint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MrHint")
    }
}

impl MrHint {
    /// `f` applied to the region `stag` names in `table` now (`None`: none does).
    fn with<R>(&self, table: &MrTable, stag: u32, f: impl FnOnce(&Arc<Mr>) -> R) -> Option<R> {
        let mut last = self.last.take();
        if !last.as_ref().is_some_and(|m| m.stag == stag && m.pins.load(Ordering::Acquire) & GONE == 0) {
            match table.lookup(stag) {
                Some(m) => last = Some(m),
                None => {
                    self.last.set(last);
                    return None;
                }
            }
        }
        let r = last.as_ref().map(f);
        self.last.set(last);
        r
    }

    /// [`MrTable::lookup`].
    pub fn lookup(&self, table: &MrTable, stag: u32) -> Option<Arc<Mr>> {
        self.with(table, stag, Arc::clone)
    }

    /// [`MrTable::lookup_remote`].
    pub fn lookup_remote(&self, table: &MrTable, stag: u32) -> Option<Arc<Mr>> {
        if table.invalidated(stag) {
            return None;
        }
        self.lookup(table, stag)
    }

    /// Copies `bytes` to `to` (in the region's iova space) of the region `stag` names, pinned
    /// for the copy, without taking a reference to the region: a peer's Write's payload,
    /// staged, whose rights the protocol core checked at its segment's header. `None` (nothing
    /// written): no region has that STag, it is being deregistered, or the range leaves it —
    /// the caller then places the bytes the general way, which fails the message where it
    /// must. A reference taken and dropped around the copy was two locked instructions on
    /// every such payload.
    pub fn write_at(&self, table: &MrTable, stag: u32, to: u64, bytes: &[u8], user_mem: &dyn super::user_memory::UserMemory) -> Option<()> {
        self.with_remote_range(table, stag, to, bytes.len() as u64, |pinned| user_mem.write(pinned, bytes))
    }

    /// Copies into `out` the bytes at `to` (in the region's iova space) of the region `stag`
    /// names, pinned for the copy, without taking a reference to the region: a small Read
    /// Response's payload, whose rights were checked when its Read Request arrived (RFC 5040
    /// §5.3). `None` (nothing read): no region has that STag, it is being deregistered, or the
    /// range leaves it. The table's lookup and the reference it returned were four locked
    /// instructions of a Read responder's six.
    pub fn read_remote(&self, table: &MrTable, stag: u32, to: u64, out: &mut [u8], user_mem: &dyn super::user_memory::UserMemory) -> Option<()> {
        self.with_remote_range(table, stag, to, out.len() as u64, |pinned| user_mem.read(pinned, out))
    }

    /// Runs `f` on the `len` bytes at `to` (in the region's iova space) of the region `stag`
    /// names, pinned for the call, without taking a reference to the region. `None` (`f` not
    /// called): no region has that STag, it is being deregistered, or the range leaves it.
    fn with_remote_range<R>(&self, table: &MrTable, stag: u32, to: u64, len: u64, f: impl FnOnce(&Pinned) -> R) -> Option<R> {
        self.with(table, stag, |mr| {
            let off = to.checked_sub(mr.iova)?;
            if off.checked_add(len)? > mr.length {
                return None;
            }
            let pinned = Pinned::new(mr, mr.addr + off, len)?;
            Some(f(&pinned))
        })
        .flatten()
    }

    /// Copies into `out` the bytes at `addr` (in the iova space) of the region `lkey` names
    /// in protection domain `pd`, pinned for the copy, without taking a reference to the
    /// region: a small Send's or Write's SGE, framed for the wire (local read is always
    /// granted). `None` (nothing read): the SGE does not check out as [`Mr::check`] says, or
    /// the region is being deregistered.
    pub fn read_at(&self, table: &MrTable, pd: u32, lkey: u32, addr: u64, out: &mut [u8], user_mem: &dyn super::user_memory::UserMemory) -> Option<()> {
        self.with_pinned(table, pd, lkey, addr, out.len() as u64, 0, |pinned| user_mem.read(pinned, out))
    }

    /// Runs `f` on `[addr, addr+len)` (iova space) of the region `lkey` names in protection
    /// domain `pd` with the rights `needed` ([`Mr::check`]; local read is always granted),
    /// pinned for the call, without taking a reference to the region: a receive's SGE, found
    /// as its bytes arrive (as a NIC reads its receive queue's lkeys, and siw's
    /// `siw_proc_send` checks each SGE). `None` (`f` not called): the range does not check
    /// out, or the region is being deregistered.
    pub fn with_pinned<R>(&self, table: &MrTable, pd: u32, lkey: u32, addr: u64, len: u64, needed: u32, f: impl FnOnce(&Pinned) -> R) -> Option<R> {
        self.with(table, lkey, |mr| {
            let off = mr.check(pd, addr, len, needed).ok()?;
            let pinned = Pinned::new(mr, mr.addr + off, len)?;
            Some(f(&pinned))
        })
        .flatten()
    }

    /// [`Mr::check`] of the region a peer addresses with `stag` (not invalidated), without
    /// taking a reference to it; `Ok(None)`: no region has that STag.
    pub fn check_remote(&self, table: &MrTable, stag: u32, pd: u32, to: u64, len: u64, needed: u32) -> Result<Option<u64>, AccessError> {
        if table.invalidated(stag) {
            return Ok(None);
        }
        self.with(table, stag, |mr| mr.check(pd, to, len, needed).map(|off| mr.addr + off)).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::access::*;
    use super::*;

    #[test]
    fn registration_follows_ib_check_mr_access() {
        let t = MrTable::new(8);
        assert_eq!(t.register(1, 0x1000, 64, 0x1000, REMOTE_WRITE).unwrap_err(), RegError::RemoteWriteWithoutLocalWrite);
        assert_eq!(t.register(1, 0x1000, 64, 0x1000, REMOTE_ATOMIC).unwrap_err(), RegError::RemoteWriteWithoutLocalWrite);
        assert_eq!(t.register(1, 0x1000, 64, 0x1000, 1 << 30).unwrap_err(), RegError::UnknownAccessFlag);
        assert_eq!(t.register(1, 0x1000, 64, 0x1000, ON_DEMAND).unwrap_err(), RegError::OnDemandUnsupported);
        assert_eq!(t.register(1, 0x1000, 0, 0x1000, 0).unwrap_err(), RegError::BadRange);
        assert_eq!(t.register(1, u64::MAX - 4, 64, 0, 0).unwrap_err(), RegError::BadRange);
        let mr = t.register(1, 0x1000, 64, 0x1000, LOCAL_WRITE | REMOTE_WRITE).unwrap();
        assert_eq!(mr.stag >> 8, 1, "index 1, key random");
        assert_eq!(t.lookup(mr.stag).unwrap().length, 64);
    }

    #[test]
    fn stag_keys_are_unpredictable_and_indices_leave_the_sink_tags_alone() {
        let t = MrTable::new(1 << 20);
        let keys: std::collections::HashSet<u32> = (0..64).map(|_| t.register(1, 0x1000, 64, 0x1000, 0).unwrap().stag & 0xff).collect();
        assert!(keys.len() > 16, "64 registrations drew only {} distinct keys", keys.len());
        // Past MAX_INDEX the index wraps (skipping 0) instead of reaching 0xff: never a Read
        // sink's tag (0xff00_0000 | id). A table of its own: in the one above, index 1 is
        // taken, and its random key equals the next draw's one time in 256.
        let t = MrTable::new(1 << 20);
        t.next_index.store(MAX_INDEX - 1, Ordering::Relaxed);
        let a = t.register(1, 0x1000, 64, 0x1000, 0).unwrap();
        let b = t.register(1, 0x1000, 64, 0x1000, 0).unwrap();
        assert_eq!(a.stag >> 8, MAX_INDEX - 1);
        assert_eq!(b.stag >> 8, 1);
        assert!(a.stag >> 24 != 0xff && b.stag >> 24 != 0xff);
    }

    /// The hint answers what the table answers: the region an STag names now, none once it
    /// was deregistered (though the hint held it), another after the STag was reused, none
    /// for a remote access through an STag the peer invalidated; and its check is the
    /// region's (protection domain, bounds, rights).
    #[test]
    fn a_hint_says_what_the_table_says() {
        let t = MrTable::with_fixed_keys(8, 0x5a);
        let hint = MrHint::default();
        let a = t.register(1, 0x1000, 64, 0x1000, LOCAL_WRITE | REMOTE_WRITE).unwrap();
        let b = t.register(1, 0x2000, 64, 0x2000, LOCAL_WRITE | REMOTE_WRITE).unwrap();
        assert!(Arc::ptr_eq(&hint.lookup(&t, a.stag).unwrap(), &a));
        assert!(Arc::ptr_eq(&hint.lookup(&t, b.stag).unwrap(), &b), "another STag: the table's region");
        assert_eq!(hint.check_remote(&t, b.stag, 1, 0x2008, 8, REMOTE_WRITE), Ok(Some(0x2008)));
        assert_eq!(hint.check_remote(&t, b.stag, 2, 0x2008, 8, REMOTE_WRITE), Err(AccessError::PdMismatch));
        assert_eq!(hint.check_remote(&t, b.stag, 1, 0x2038, 9, REMOTE_WRITE), Err(AccessError::BaseBounds));
        assert_eq!(hint.check_remote(&t, b.stag, 1, 0x2008, 8, REMOTE_READ), Err(AccessError::AccessRights));
        assert_eq!(hint.check_remote(&t, 0x77, 1, 0x2008, 8, REMOTE_WRITE), Ok(None));
        // Deregistered while the hint holds it: gone for the hint too.
        t.deregister(b.stag);
        assert!(hint.lookup(&t, b.stag).is_none());
        assert_eq!(hint.check_remote(&t, b.stag, 1, 0x2008, 8, REMOTE_WRITE), Ok(None));
        // The STag named again (an index reused after a wrap, the same key): the new region.
        t.next_index.store(b.stag >> 8, Ordering::Relaxed);
        assert!(Arc::ptr_eq(&hint.lookup(&t, a.stag).unwrap(), &a));
        let c = t.register(1, 0x3000, 64, 0x3000, LOCAL_WRITE | REMOTE_WRITE).unwrap();
        assert_eq!(c.stag, b.stag);
        assert!(Arc::ptr_eq(&hint.lookup(&t, b.stag).unwrap(), &c));
        // Invalidated by the peer: refused for remote access, still there for local.
        assert!(t.invalidate(c.stag, 1));
        assert!(hint.lookup_remote(&t, c.stag).is_none());
        assert_eq!(hint.check_remote(&t, c.stag, 1, 0x3008, 8, REMOTE_WRITE), Ok(None));
        assert!(Arc::ptr_eq(&hint.lookup(&t, c.stag).unwrap(), &c));
    }

    /// A write through the hint lands where the region says, and nowhere when the range
    /// leaves the region, the STag names none, or the region was deregistered.
    #[test]
    fn a_write_through_the_hint_stays_in_its_region() {
        use crate::engine::datapath::testkit::{Arena, BASE};
        let arena = Arena::new(4096);
        let t = MrTable::with_fixed_keys(8, 0x5a);
        let hint = MrHint::default();
        let a = t.register(1, BASE + 64, 64, 0x9000, LOCAL_WRITE | REMOTE_WRITE).unwrap();
        assert_eq!(hint.write_at(&t, a.stag, 0x9008, &[7; 8], &arena), Some(()));
        assert_eq!(arena.get(BASE + 72, 8), [7; 8]);
        assert_eq!(hint.write_at(&t, a.stag, 0x9000 + 60, &[9; 4], &arena), Some(()), "up to the end");
        assert_eq!(hint.write_at(&t, a.stag, 0x9000 + 61, &[9; 4], &arena), None, "past the end");
        assert_eq!(hint.write_at(&t, a.stag, 0x8fff, &[9; 1], &arena), None, "before the start");
        assert_eq!(hint.write_at(&t, a.stag, u64::MAX, &[9; 2], &arena), None, "wraps");
        assert_eq!(hint.write_at(&t, a.stag ^ 0x100, 0x9008, &[9; 1], &arena), None, "no such STag");
        t.deregister(a.stag);
        assert_eq!(hint.write_at(&t, a.stag, 0x9008, &[9; 8], &arena), None, "deregistered");
        assert_eq!(arena.get(BASE + 64, 64).iter().filter(|&&b| b == 9).count(), 4, "only the write up to the end");
    }

    /// A read through the hint takes the bytes an SGE names, and none when the SGE does not
    /// check out (another PD, outside the region, an unknown lkey) or after deregistration.
    #[test]
    fn a_read_through_the_hint_checks_the_sge() {
        use crate::engine::datapath::testkit::{Arena, BASE};
        let arena = Arena::new(4096);
        arena.set(BASE + 64, &(0..64).collect::<Vec<u8>>());
        let t = MrTable::with_fixed_keys(8, 0x5a);
        let hint = MrHint::default();
        let a = t.register(1, BASE + 64, 64, 0x9000, 0).unwrap();
        let mut out = [0u8; 4];
        assert_eq!(hint.read_at(&t, 1, a.stag, 0x9008, &mut out, &arena), Some(()));
        assert_eq!(out, [8, 9, 10, 11]);
        assert_eq!(hint.read_at(&t, 1, a.stag, 0x9000 + 60, &mut out, &arena), Some(()), "up to the end");
        assert_eq!(out, [60, 61, 62, 63]);
        let mut out = [0xeeu8; 4];
        assert_eq!(hint.read_at(&t, 2, a.stag, 0x9008, &mut out, &arena), None, "another PD");
        assert_eq!(hint.read_at(&t, 1, a.stag, 0x9000 + 61, &mut out, &arena), None, "past the end");
        assert_eq!(hint.read_at(&t, 1, a.stag, u64::MAX - 1, &mut out, &arena), None, "wraps");
        assert_eq!(hint.read_at(&t, 1, a.stag ^ 0x100, 0x9008, &mut out, &arena), None, "no such lkey");
        t.deregister(a.stag);
        assert_eq!(hint.read_at(&t, 1, a.stag, 0x9008, &mut out, &arena), None, "deregistered");
        assert_eq!(out, [0xee; 4], "nothing read");
    }

    #[test]
    fn fixed_keys_give_stags_in_registration_order() {
        let t = MrTable::with_fixed_keys(8, 0x5a);
        let a = t.register(1, 0x1000, 64, 0x1000, 0).unwrap();
        let b = t.register(1, 0x2000, 64, 0x2000, 0).unwrap();
        assert_eq!((a.stag, b.stag), (0x15a, 0x25a));
        t.deregister(a.stag);
        assert_eq!(t.register(1, 0x1000, 64, 0x1000, 0).unwrap().stag, 0x35a, "indices are not re-used at once");
    }

    #[test]
    fn stags_are_unique_and_die_with_deregistration() {
        let t = MrTable::new(8);
        let a = t.register(1, 0x1000, 64, 0x1000, 0).unwrap();
        let b = t.register(1, 0x1000, 64, 0x1000, 0).unwrap();
        assert_ne!(a.stag, b.stag);
        assert!(t.deregister(a.stag).is_some());
        assert!(t.lookup(a.stag).is_none());
        assert!(t.deregister(a.stag).is_none());
        assert_eq!(t.count_in_pd(1), 1);
    }

    #[test]
    fn deregister_pd_takes_only_that_pds_regions_and_invalidation_is_remote_only() {
        let t = MrTable::new(8);
        let a = t.register(1, 0x1000, 64, 0x1000, LOCAL_WRITE | REMOTE_WRITE).unwrap();
        let b = t.register(2, 0x1000, 64, 0x1000, 0).unwrap();
        assert!(!t.invalidate(a.stag, 2), "another PD cannot invalidate it");
        assert!(t.invalidate(a.stag, 1));
        assert!(t.lookup_remote(a.stag).is_none());
        assert!(t.lookup(a.stag).is_some(), "still usable locally");
        assert_eq!(t.deregister_pd(1), 1);
        assert!(t.lookup(a.stag).is_none());
        assert!(t.lookup(b.stag).is_some());
    }

    #[test]
    fn limits_are_enforced() {
        let t = MrTable::new(2);
        t.register(1, 0x1000, 64, 0x1000, 0).unwrap();
        t.register(1, 0x1000, 64, 0x1000, 0).unwrap();
        assert_eq!(t.register(1, 0x1000, 64, 0x1000, 0).unwrap_err(), RegError::TooMany);
    }

    #[test]
    fn access_checks_bounds_rights_and_pd() {
        let t = MrTable::new(8);
        let mr = t.register(1, 0x7000, 100, 0x7000, LOCAL_WRITE | REMOTE_READ).unwrap();
        assert_eq!(mr.check(1, 0x7000, 100, REMOTE_READ), Ok(0));
        assert_eq!(mr.check(1, 0x7010, 16, LOCAL_WRITE), Ok(0x10));
        assert_eq!(mr.check(1, 0x7000, 101, 0), Err(AccessError::BaseBounds));
        assert_eq!(mr.check(1, 0x6fff, 1, 0), Err(AccessError::BaseBounds));
        assert_eq!(mr.check(1, u64::MAX, 2, 0), Err(AccessError::BaseBounds));
        assert_eq!(mr.check(1, 0x7000, 8, REMOTE_WRITE), Err(AccessError::AccessRights));
        assert_eq!(mr.check(2, 0x7000, 8, 0), Err(AccessError::PdMismatch));
        let z = t.register(1, 0x9000, 32, 0x9000, ZERO_BASED).unwrap();
        assert_eq!(z.check(1, 0, 32, 0), Ok(0));
    }

    #[test]
    fn spans_are_checked_and_sub_ranges_never_leave_them() {
        let t = MrTable::new(4);
        let mr = t.register(1, 0x1000, 64, 0x9000, LOCAL_WRITE).unwrap();
        assert!(mr.clone().span(2, 0x9000, 8, 0).is_err(), "other PD");
        assert!(mr.clone().span(1, 0x9000 + 60, 8, 0).is_err(), "past the end");
        assert!(mr.clone().span(1, u64::MAX, 2, 0).is_err(), "wraps");
        let s = mr.clone().span(1, 0x9010, 16, 0).unwrap();
        assert_eq!((s.pin().unwrap().addr(), s.len()), (0x1010, 16));
        // Pins of part of a span: the same bounds, checked arithmetic.
        let p = s.pin_sub(8, 8).unwrap();
        assert_eq!((p.addr(), p.len()), (0x1018, 8));
        assert!(s.pin_sub(8, 9).is_none());
        assert!(s.pin_sub(u64::MAX, 2).is_none(), "offset arithmetic is checked");
        assert_eq!(s.sub(8, 8).unwrap().pin().unwrap().addr(), 0x1018);
        assert!(s.sub(8, 9).is_none());
        assert!(s.sub(u64::MAX, 2).is_none(), "offset arithmetic is checked");
        let p = s.pin_from(4).unwrap();
        assert_eq!((p.addr(), p.len()), (0x1014, 12));
        assert_eq!(s.pin_from(16).unwrap().len(), 0);
        assert!(s.pin_from(17).is_none());
        let q = p.sub(2, 10).unwrap();
        assert_eq!((q.addr(), q.len()), (0x1016, 10));
        assert!(p.sub(2, 11).is_none());
        assert!(p.sub(usize::MAX, 2).is_none());
        assert_eq!(mr.clone().span_from(0x9000 + 63).unwrap().len(), 1);
        assert!(mr.clone().span_from(0x9000 + 64).is_none());
        assert!(mr.clone().span_from(0x8fff).is_none());
    }

    #[test]
    fn deregister_waits_for_pins_and_later_pins_fail() {
        use std::sync::mpsc;
        let t = Arc::new(MrTable::new(4));
        let mr = t.register(1, 0x1000, 64, 0x1000, LOCAL_WRITE).unwrap();
        let span = mr.clone().span(1, 0x1000, 64, 0).unwrap();
        // A pin of part of a pin holds the region on its own.
        let whole = span.pin().unwrap();
        let pin = whole.sub(8, 8).unwrap();
        drop(whole);
        let (tx, rx) = mpsc::channel();
        let (t2, stag) = (t.clone(), mr.stag);
        let h = std::thread::spawn(move || {
            t2.deregister(stag);
            tx.send(()).unwrap();
        });
        // The deregistration has begun once the region is out of the table (on a loaded
        // machine the thread may take long to be scheduled at all: wait for that, not for a
        // fixed time). Still pinned: it must not have returned (it cannot, whatever the
        // timing, until the pin goes).
        let began = std::time::Instant::now();
        while t.lookup(stag).is_some() {
            assert!(began.elapsed() < std::time::Duration::from_secs(60), "the deregistration never began");
            std::thread::yield_now();
        }
        assert!(rx.recv_timeout(std::time::Duration::from_millis(100)).is_err(), "deregister returned while pinned");
        assert!(t.lookup(stag).is_none(), "no new lookups while it waits");
        drop(pin);
        rx.recv().unwrap();
        h.join().unwrap();
        assert!(span.pin().is_none(), "a span of a deregistered region cannot be pinned");
        assert!(span.sub(0, 8).unwrap().pin().is_none(), "nor a part of it taken as a span of its own");
        assert!(span.pin_sub(0, 8).is_none() && span.pin_from(8).is_none());
    }
}
