//! [`UserMemory`] for the engine: raw access to the application's registered memory and zero-copy
//! socket I/O. The engine can only pass [`Pinned`] ranges: made by the memory-region table's
//! checks (base, bounds, rights, protection domain) and pinned, so `ibv_dereg_mr` waits until
//! the access is over. Registering memory is the application's promise that those bytes stay
//! mapped until it deregisters them, which is what makes these calls sound (as for a kernel
//! provider pinning user pages).

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::engine::user_memory::{AtomicOperation, Crc32c, IoPart, Pinned, UserMemory};

pub(crate) struct RawUserMemory;

/// The one instance the engine uses.
pub(crate) static USER_MEMORY: RawUserMemory = RawUserMemory;

fn iovec(p: &IoPart<'_>) -> libc::iovec {
    match *p {
        IoPart::Bytes(b) => libc::iovec { iov_base: b.as_ptr() as *mut libc::c_void, iov_len: b.len() },
        IoPart::User(p) => libc::iovec { iov_base: p.addr() as *mut libc::c_void, iov_len: p.len() },
    }
}

impl UserMemory for RawUserMemory {
    fn recv(&self, fd: RawFd, dst: &Pinned, tail: &mut [u8]) -> io::Result<usize> {
        let iov = [
            libc::iovec { iov_base: dst.addr() as *mut libc::c_void, iov_len: dst.len() },
            libc::iovec { iov_base: tail.as_mut_ptr() as *mut libc::c_void, iov_len: tail.len() },
        ];
        let mut msg: libc::msghdr = unsafe_zeroed_msghdr();
        msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = if tail.is_empty() { 1 } else { 2 };
        // SAFETY: the first iovec is pinned registered memory (see the module doc), the second is
        // `tail`, exclusively borrowed; msg points at them for the duration of the call.
        let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    fn send(&self, fd: RawFd, parts: &[IoPart<'_>]) -> io::Result<usize> {
        if let [part] = parts {
            // One run (a small message framed in place, most of a latency test's traffic):
            // `send`, which spares the kernel the message header and the iovec array to copy in.
            let v = iovec(part);
            // SAFETY: as below, for the one buffer.
            let r = unsafe { libc::send(fd, v.iov_base, v.iov_len, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
            return if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r as usize) };
        }
        let mut iov = [libc::iovec { iov_base: core::ptr::null_mut(), iov_len: 0 }; 64];
        let n = parts.len().min(iov.len());
        for (v, p) in iov.iter_mut().zip(&parts[..n]) {
            *v = iovec(p);
        }
        let mut msg: libc::msghdr = unsafe_zeroed_msghdr();
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = n;
        // SAFETY: every iovec is either a borrowed engine buffer or pinned registered memory
        // (see the module doc), read-only for sendmsg, valid for the duration of the call.
        let r = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }

    fn read(&self, src: &Pinned, out: &mut [u8]) {
        let n = out.len().min(src.len());
        // SAFETY: src is pinned registered memory of at least n bytes (see the module doc);
        // `out` is an engine buffer, so the ranges do not overlap.
        unsafe { core::ptr::copy_nonoverlapping(src.addr() as *const u8, out.as_mut_ptr(), n) }
    }

    fn crc32c(&self, src: &Pinned, len: usize, crc: &mut Crc32c) {
        let n = len.min(src.len());
        if n == 0 {
            return;
        }
        // SAFETY: src is pinned registered memory of at least n bytes (see the module doc),
        // mapped for as long as the borrow, which ends with this call. The application may not
        // write a buffer of a posted WR nor one a Read is served from; if it does anyway, the
        // checksum reads changing bytes, which only makes it wrong (the stream then fails
        // with an MPA CRC error, RFC 5044 §8), as `read` would copy torn bytes.
        let bytes = unsafe { core::slice::from_raw_parts(src.addr() as *const u8, n) };
        crc.update(bytes);
    }

    fn write(&self, dst: &Pinned, data: &[u8]) {
        let n = data.len().min(dst.len());
        // SAFETY: dst is pinned registered memory of at least n bytes, checked for local write
        // access (see the module doc); `data` is an engine buffer.
        unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), dst.addr() as *mut u8, n) }
    }

    fn atomic(&self, dst: &Pinned, op: AtomicOperation) -> u64 {
        assert!(dst.len() >= 8 && dst.addr() % 8 == 0, "atomic on an unaligned or short range");
        // SAFETY: dst is 8-byte aligned (asserted), pinned registered memory with remote atomic
        // access (see the module doc); other processes' and threads' atomics on it are atomic too.
        let a = unsafe { &*(dst.addr() as *const AtomicU64) };
        match op {
            // The unmasked operations of libibverbs, one instruction each.
            AtomicOperation::FetchAdd { add, add_mask: 0 } => a.fetch_add(add, Ordering::SeqCst),
            AtomicOperation::CmpSwap { compare, compare_mask: u64::MAX, swap, swap_mask: u64::MAX } => {
                match a.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(v) | Err(v) => v,
                }
            }
            // Masked ones (RFC 7306 §5.1.1, §5.1.2): a compare-and-swap loop; a CmpSwap whose
            // compare fails stores nothing.
            _ => match a.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| Some(op.apply(v)).filter(|&n| n != v)) {
                Ok(v) | Err(v) => v,
            },
        }
    }
}

fn unsafe_zeroed_msghdr() -> libc::msghdr {
    // SAFETY: msghdr is plain C data; all-zero is "no name, no iovecs, no control data".
    unsafe { core::mem::zeroed() }
}
