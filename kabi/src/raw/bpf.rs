//! `bpf(2)` for the XDP program that steers uiw's TCP into an AF_XDP socket: an XSK map,
//! loading the program (the kernel's verifier checks it; on a rejection the error carries
//! the verifier's log), and attaching it to an interface with a BPF link (detached when the
//! link's descriptor closes, or the process exits). The program itself is assembled in
//! `uiw-rawnet` (`ebpf::program`): here it is only instructions.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// One eBPF instruction (`struct bpf_insn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Insn {
    pub code: u8,
    /// dst_reg (low nibble) | src_reg << 4
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

// bpf(2) commands and constants.
const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
/// `XDP_FLAGS_SKB_MODE`, `XDP_FLAGS_DRV_MODE` (linux/if_link.h).
pub const XDP_FLAGS_SKB_MODE: u32 = 2;
pub const XDP_FLAGS_DRV_MODE: u32 = 4;

/// `union bpf_attr`, as the bytes of its largest member we use.
#[repr(C, align(8))]
struct Attr([u8; 128]);

impl Attr {
    fn new() -> Attr {
        Attr([0; 128])
    }
    fn u32(&mut self, off: usize, v: u32) -> &mut Self {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(&mut self, off: usize, v: u64) -> &mut Self {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
}

fn bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a 128-byte, 8-aligned buffer laid out as the command's member of
    // union bpf_attr; any pointers in it point at memory alive for the duration of the call.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut Attr, std::mem::size_of::<Attr>()) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn own(fd: libc::c_long) -> OwnedFd {
    // SAFETY: the bpf(2) command returned a fresh descriptor that nobody else owns.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

/// An XSK map (`BPF_MAP_TYPE_XSKMAP`) of `entries` queues.
pub fn xsk_map(entries: u32) -> io::Result<OwnedFd> {
    let mut a = Attr::new();
    a.u32(0, BPF_MAP_TYPE_XSKMAP).u32(4, 4).u32(8, 4).u32(12, entries);
    bpf(BPF_MAP_CREATE, &mut a).map(own).map_err(|e| {
        io::Error::new(e.kind(), format!("bpf(BPF_MAP_CREATE, XSKMAP): {e} (AF_XDP needs CAP_BPF and CAP_NET_ADMIN)"))
    })
}

/// A hash map of up to `entries` ports (u32 key, u32 value): the ports the XDP program
/// steers beyond its range.
pub fn port_set(entries: u32) -> io::Result<OwnedFd> {
    let mut a = Attr::new();
    a.u32(0, BPF_MAP_TYPE_HASH).u32(4, 4).u32(8, 4).u32(12, entries);
    bpf(BPF_MAP_CREATE, &mut a).map(own).map_err(|e| io::Error::new(e.kind(), format!("bpf(BPF_MAP_CREATE, HASH): {e}")))
}

/// `delete map[key]` (absent: ENOENT).
pub fn map_delete(map: &OwnedFd, key: u32) -> io::Result<()> {
    let k = key;
    let mut a = Attr::new();
    a.u32(0, map.as_raw_fd() as u32).u64(8, &k as *const u32 as u64);
    bpf(BPF_MAP_DELETE_ELEM, &mut a).map(|_| ())
}

/// `map[key] = fd`.
pub fn map_set(map: &OwnedFd, key: u32, fd: RawFd) -> io::Result<()> {
    let (k, v) = (key, fd as u32);
    let mut a = Attr::new();
    a.u32(0, map.as_raw_fd() as u32)
        .u64(8, &k as *const u32 as u64)
        .u64(16, &v as *const u32 as u64)
        .u64(24, 0);
    bpf(BPF_MAP_UPDATE_ELEM, &mut a).map(|_| ())
}

/// `BPF_F_XDP_HAS_FRAGS` (`prog_flags`, linux/bpf.h, 5.18+): the program copes with a
/// multi-buffer frame — it reads only the first buffer, between `data` and `data_end`.
const BPF_F_XDP_HAS_FRAGS: u32 = 1 << 5;

/// Load an XDP program (`frags`: declared multi-buffer aware, which drivers need before they
/// take an MTU larger than a page — veth's native mode — and which hands the program frames
/// whose `data_end` covers only the first buffer); on a verifier rejection the error carries
/// the verifier's log.
pub fn load_xdp(prog: &[Insn], frags: bool) -> io::Result<OwnedFd> {
    let license = b"Dual MIT/GPL\0";
    let name = b"uiw_steer\0";
    let mut log = vec![0u8; 1 << 16];
    for level in [0u32, 1] {
        let mut a = Attr::new();
        a.u32(0, BPF_PROG_TYPE_XDP)
            .u32(4, prog.len() as u32)
            .u64(8, prog.as_ptr() as u64)
            .u64(16, license.as_ptr() as u64);
        if level > 0 {
            a.u32(24, level).u32(28, log.len() as u32).u64(32, log.as_mut_ptr() as u64);
        }
        if frags {
            a.u32(44, BPF_F_XDP_HAS_FRAGS);
        }
        a.0[48..48 + name.len()].copy_from_slice(name);
        a.u32(68, BPF_XDP);
        match bpf(BPF_PROG_LOAD, &mut a) {
            Ok(fd) => return Ok(own(fd)),
            Err(_) if level == 0 => continue, // again, with the verifier's log
            Err(e) => {
                let end = log.iter().position(|&b| b == 0).unwrap_or(0);
                let text = String::from_utf8_lossy(&log[..end]);
                return Err(io::Error::new(e.kind(), format!("bpf(BPF_PROG_LOAD, XDP): {e}\n{text}")));
            }
        }
    }
    unreachable!()
}

/// Attach `prog` to interface `ifindex` with a BPF link (detached when the link fd closes).
pub fn attach_xdp(prog: &OwnedFd, ifindex: u32, flags: u32) -> io::Result<OwnedFd> {
    let mut a = Attr::new();
    a.u32(0, prog.as_raw_fd() as u32).u32(4, ifindex).u32(8, BPF_XDP).u32(12, flags);
    bpf(BPF_LINK_CREATE, &mut a).map(own)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insn_is_bpf_insn_sized() {
        assert_eq!(std::mem::size_of::<Insn>(), 8);
        assert_eq!(std::mem::size_of::<Attr>(), 128);
    }
}
