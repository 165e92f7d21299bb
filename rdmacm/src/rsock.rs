//! rsockets (rsocket.h): exported for ABI compatibility and forwarded to the system
//! librdmacm, which runs them over the kernel's rdma_cm (RDMA sockets over uiw devices
//! are not provided). Without a system library they fail with ENOSYS. FFI surface.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_int, c_void};

use crate::fwd;
use crate::sys;

type Sa = *const libc::sockaddr;
type SaM = *mut libc::sockaddr;
type Len = libc::socklen_t;

macro_rules! rfwd {
    ($( fn $name:ident ( $($a:ident : $t:ty),* ) -> $r:ty = $fail:expr; )*) => {
        $(
                        pub unsafe extern "C" fn $name($($a: $t),*) -> $r {
                match fwd::sym(stringify!($name)) {
                    // SAFETY: the system library's function of this name has exactly this
                    // C signature (rsocket.h); the arguments are the application's.
                    Some(f) => unsafe {
                        let f: unsafe extern "C" fn($($t),*) -> $r = std::mem::transmute(f);
                        f($($a),*)
                    },
                    None => {
                        sys::set_errno(libc::ENOSYS);
                        $fail
                    }
                }
            }
        )*
    };
}

rfwd! {
    fn rsocket(domain: c_int, ty: c_int, protocol: c_int) -> c_int = -1;
    fn rbind(s: c_int, a: Sa, l: Len) -> c_int = -1;
    fn rlisten(s: c_int, backlog: c_int) -> c_int = -1;
    fn raccept(s: c_int, a: SaM, l: *mut Len) -> c_int = -1;
    fn rconnect(s: c_int, a: Sa, l: Len) -> c_int = -1;
    fn rshutdown(s: c_int, how: c_int) -> c_int = -1;
    fn rclose(s: c_int) -> c_int = -1;
    fn rrecv(s: c_int, b: *mut c_void, n: usize, f: c_int) -> isize = -1;
    fn rrecvfrom(s: c_int, b: *mut c_void, n: usize, f: c_int, a: SaM, l: *mut Len) -> isize = -1;
    fn rrecvmsg(s: c_int, m: *mut libc::msghdr, f: c_int) -> isize = -1;
    fn rsend(s: c_int, b: *const c_void, n: usize, f: c_int) -> isize = -1;
    fn rsendto(s: c_int, b: *const c_void, n: usize, f: c_int, a: Sa, l: Len) -> isize = -1;
    fn rsendmsg(s: c_int, m: *const libc::msghdr, f: c_int) -> isize = -1;
    fn rread(s: c_int, b: *mut c_void, n: usize) -> isize = -1;
    fn rreadv(s: c_int, v: *const libc::iovec, n: c_int) -> isize = -1;
    fn rwrite(s: c_int, b: *const c_void, n: usize) -> isize = -1;
    fn rwritev(s: c_int, v: *const libc::iovec, n: c_int) -> isize = -1;
    fn rpoll(f: *mut libc::pollfd, n: libc::nfds_t, t: c_int) -> c_int = -1;
    fn rselect(n: c_int, r: *mut libc::fd_set, w: *mut libc::fd_set, e: *mut libc::fd_set, t: *mut libc::timeval) -> c_int = -1;
    fn rgetpeername(s: c_int, a: SaM, l: *mut Len) -> c_int = -1;
    fn rgetsockname(s: c_int, a: SaM, l: *mut Len) -> c_int = -1;
    fn rsetsockopt(s: c_int, lv: c_int, n: c_int, v: *const c_void, l: Len) -> c_int = -1;
    fn rgetsockopt(s: c_int, lv: c_int, n: c_int, v: *mut c_void, l: *mut Len) -> c_int = -1;
    // int rfcntl(int socket, int cmd, ... /* arg */): every fcntl argument is an int or a
    // pointer, passed in the third integer register on x86-64 either way.
    fn rfcntl(s: c_int, cmd: c_int, arg: usize) -> c_int = -1;
    fn riomap(s: c_int, b: *mut c_void, n: usize, prot: c_int, f: c_int, off: libc::off_t) -> libc::off_t = -1;
    fn riounmap(s: c_int, b: *mut c_void, n: usize) -> c_int = -1;
    fn riowrite(s: c_int, b: *const c_void, n: usize, off: libc::off_t, f: c_int) -> usize = 0;
}
