//! [`UserMemory`] for the engine: raw access to the application's registered memory and zero-copy
//! socket I/O. The engine only passes addresses it has checked against a registered memory
//! region (base, bounds, rights, protection domain) or buffers it owns; registering memory is
//! the application's promise that those bytes stay mapped, which is what makes these calls
//! sound (as for a kernel provider pinning user pages).

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::engine::user_memory::{AtomicOp, IoPart, UserMemory};

pub(crate) struct RawUserMemory;

/// The one instance the engine uses.
pub(crate) static USER_MEMORY: RawUserMemory = RawUserMemory;

fn iovec(p: &IoPart<'_>) -> libc::iovec {
    match *p {
        IoPart::Bytes(b) => libc::iovec { iov_base: b.as_ptr() as *mut libc::c_void, iov_len: b.len() },
        IoPart::User { addr, len } => libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: len },
    }
}

impl UserMemory for RawUserMemory {
    fn recv(&self, fd: RawFd, addr: u64, len: usize, tail: &mut [u8]) -> io::Result<usize> {
        let iov = [
            libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: len },
            libc::iovec { iov_base: tail.as_mut_ptr() as *mut libc::c_void, iov_len: tail.len() },
        ];
        let mut msg: libc::msghdr = unsafe_zeroed_msghdr();
        msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = if tail.is_empty() { 1 } else { 2 };
        // SAFETY: the first iovec is checked registered memory (engine contract), the second is
        // `tail`, exclusively borrowed; msg points at them for the duration of the call.
        let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    fn send(&self, fd: RawFd, parts: &[IoPart<'_>]) -> io::Result<usize> {
        let mut iov = [libc::iovec { iov_base: core::ptr::null_mut(), iov_len: 0 }; 64];
        let n = parts.len().min(iov.len());
        for (v, p) in iov.iter_mut().zip(&parts[..n]) {
            *v = iovec(p);
        }
        let mut msg: libc::msghdr = unsafe_zeroed_msghdr();
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = n;
        // SAFETY: every iovec is either a borrowed engine buffer or checked registered memory
        // (engine contract), read-only for sendmsg, valid for the duration of the call.
        let r = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }

    fn read(&self, addr: u64, out: &mut [u8]) {
        // SAFETY: addr..addr+out.len() is checked registered memory (engine contract); `out` is
        // an engine buffer, so the ranges do not overlap.
        unsafe { core::ptr::copy_nonoverlapping(addr as *const u8, out.as_mut_ptr(), out.len()) }
    }

    fn write(&self, addr: u64, data: &[u8]) {
        // SAFETY: addr..addr+data.len() is checked registered memory with local write access
        // (engine contract); `data` is an engine buffer.
        unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, data.len()) }
    }

    fn atomic(&self, addr: u64, op: AtomicOp, add_swap: u64, compare: u64) -> u64 {
        // SAFETY: addr is 8-byte aligned, inside a region registered with remote atomic access
        // (engine contract); other processes' and threads' atomics on it are atomic too.
        let a = unsafe { &*(addr as *const AtomicU64) };
        match op {
            AtomicOp::FetchAdd => a.fetch_add(add_swap, Ordering::SeqCst),
            AtomicOp::Swap => a.swap(add_swap, Ordering::SeqCst),
            AtomicOp::CompareSwap => match a.compare_exchange(compare, add_swap, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(v) | Err(v) => v,
            },
        }
    }
}

fn unsafe_zeroed_msghdr() -> libc::msghdr {
    // SAFETY: msghdr is plain C data; all-zero is "no name, no iovecs, no control data".
    unsafe { core::mem::zeroed() }
}
