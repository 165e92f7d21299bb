//! Safe wrappers for the few libc calls that publishing a device needs (what a kernel driver
//! would do for itself): the `uiw` command calls these and stays free of `unsafe`.

use std::ffi::{CStr, CString};
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

fn check(r: libc::c_long) -> io::Result<()> {
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The effective user id.
pub fn geteuid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// `access(path, W_OK)`: may this process write there (as the real user)?
pub fn is_writable(path: &Path) -> bool {
    // SAFETY: access(2) on a valid NUL-terminated path.
    cpath(path).map(|c| unsafe { libc::access(c.as_ptr(), libc::W_OK) } == 0).unwrap_or(false)
}

/// `flock(fd, LOCK_EX)`, retried on EINTR: blocks until the lock is the caller's.
pub fn lock_exclusive(f: &impl AsRawFd) -> io::Result<()> {
    // SAFETY: flock on an fd the caller owns for the duration of the call.
    while unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

/// `mknod(path, S_IFCHR | mode, makedev(major, minor))`.
pub fn mknod_char(path: &Path, mode: u32, major: u32, minor: u32) -> io::Result<()> {
    let c = cpath(path)?;
    // SAFETY: c is a valid NUL-terminated path.
    check(unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | mode, libc::makedev(major, minor)) }.into())
}

/// Atomically exchanges two paths (`renameat2(RENAME_EXCHANGE)`, Linux ≥ 3.15).
pub fn rename_exchange(a: &Path, b: &Path) -> io::Result<()> {
    let (ca, cb) = (cpath(a)?, cpath(b)?);
    const RENAME_EXCHANGE: libc::c_uint = 2;
    // SAFETY: both are valid NUL-terminated paths that outlive the call.
    check(unsafe {
        libc::syscall(libc::SYS_renameat2, libc::AT_FDCWD, ca.as_ptr(), libc::AT_FDCWD, cb.as_ptr(), RENAME_EXCHANGE)
    })
}

/// IPv4 addresses of netdev `name` (and of its alias labels `name:*`), via getifaddrs(3), in
/// the order the kernel lists them, without duplicates.
pub fn ipv4_addrs(name: &str) -> Vec<Ipv4Addr> {
    let mut out = Vec::new();
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into ifap; we free it with freeifaddrs below.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return out;
    }
    let mut cur = ifap;
    while !cur.is_null() {
        // SAFETY: cur is a node of the list getifaddrs returned and has not been freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let ifname = unsafe { CStr::from_ptr(ifa.ifa_name) }.to_string_lossy();
        if ifname.split(':').next().unwrap_or("") != name {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points to a sockaddr at least sa_family wide.
        if i32::from(unsafe { (*ifa.ifa_addr).sa_family }) != libc::AF_INET {
            continue;
        }
        // SAFETY: the family is AF_INET, so the sockaddr is a sockaddr_in.
        let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
        let a = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
        if !out.contains(&a) {
            out.push(a);
        }
    }
    // SAFETY: ifap came from a successful getifaddrs and is freed exactly once.
    unsafe { libc::freeifaddrs(ifap) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_has_127_0_0_1() {
        assert!(ipv4_addrs("lo").contains(&Ipv4Addr::LOCALHOST));
        assert!(ipv4_addrs("no-such-netdev").is_empty());
    }

    #[test]
    fn exchange_swaps_and_errors_say_why() {
        let d = std::env::temp_dir().join(format!("uiw-sys-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let (a, b) = (d.join("a"), d.join("b"));
        std::fs::write(&a, "a").unwrap();
        std::fs::write(&b, "b").unwrap();
        rename_exchange(&a, &b).unwrap();
        assert_eq!(std::fs::read_to_string(&a).unwrap(), "b");
        assert!(rename_exchange(&a, &d.join("missing")).is_err());
        assert!(is_writable(&d));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
