//! `UIW_DEBUG=1`: one line on stderr for every refused verb and every QP error, saying what
//! was wrong and, where a limit was crossed, the limit. Off by default: a provider is silent.

use std::fmt;
use std::sync::OnceLock;

/// Whether `UIW_DEBUG` is set (to anything but `0`), read once per process.
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("UIW_DEBUG").is_some_and(|v| v != "0"))
}

/// A verb refused with `errno`: `uiw: ibv_create_qp: EINVAL: max_send_wr = 99999 exceeds …`.
pub fn refused(verb: &str, errno: i32, why: fmt::Arguments<'_>) {
    if enabled() {
        eprintln!("uiw: {verb}: {}: {why}", errno_name(errno));
    }
}

/// Any other explanation (QP errors, lost streams).
pub fn why(what: fmt::Arguments<'_>) {
    if enabled() {
        eprintln!("uiw: {what}");
    }
}

/// The symbolic name of the errnos the verbs return.
pub fn errno_name(e: i32) -> &'static str {
    match e {
        libc::EINVAL => "EINVAL",
        libc::ENOMEM => "ENOMEM",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EBUSY => "EBUSY",
        libc::EFAULT => "EFAULT",
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EAGAIN => "EAGAIN",
        libc::EBADF => "EBADF",
        libc::EIO => "EIO",
        libc::ENOSYS => "ENOSYS",
        libc::EEXIST => "EEXIST",
        libc::EADDRINUSE => "EADDRINUSE",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::ECONNRESET => "ECONNRESET",
        libc::ENODEV => "ENODEV",
        _ => "error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_verbs_errnos() {
        assert_eq!(errno_name(libc::EINVAL), "EINVAL");
        assert_eq!(errno_name(libc::EOPNOTSUPP), "EOPNOTSUPP");
        assert_eq!(errno_name(-12345), "error");
    }
}
