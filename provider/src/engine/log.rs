//! Diagnostics, with rdma-core's conventions beside uiw's own switch.
//!
//! - `VERBS_LOG_LEVEL` (as libibverbs reads it: an integer, `strtol(…, 0)`): 0 none (the
//!   default), 1 errors, 2 warnings, 3 information, 4 debug — the levels of rdma-core's
//!   `verbs_err`/`verbs_warn`/`verbs_info`/`verbs_debug`.
//! - `VERBS_LOG_FILE`: where messages go (opened for appending, created if need be); without
//!   it, or when it cannot be opened, stderr (as a `VERBS_DEBUG` build of rdma-core does).
//! - `UIW_DEBUG` (any value but empty or `0`): everything, i.e. level 4.
//!
//! What is logged at which level: QPs going to ERROR and streams that cannot be reached at
//! 2 (warning), refused verbs calls with the reason at 3 (information), the rest at 4.
//! Messages read `uiw: <device or QP>: what happened`. The settings are read once, at the
//! first message.

use std::fmt::Arguments;
use std::fs::File;
use std::io::Write;
use std::sync::{Mutex, OnceLock};

/// rdma-core's `VERBS_LOG_*` levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Err = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
}

struct Sink {
    level: i64,
    file: Option<Mutex<File>>,
}

/// `strtol(s, NULL, 0)` for what libibverbs accepts: decimal, `0x` hex, `0` octal; leading
/// digits only, 0 when there are none.
fn parse_level(s: &str) -> i64 {
    let s = s.trim_start();
    let (neg, s) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let (radix, digits) = if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        (16, h)
    } else if s.len() > 1 && s.starts_with('0') {
        (8, &s[1..])
    } else {
        (10, s)
    };
    let end = digits.find(|c: char| !c.is_digit(radix)).unwrap_or(digits.len());
    let v = i64::from_str_radix(&digits[..end], radix).unwrap_or(0);
    if neg {
        -v
    } else {
        v
    }
}

fn sink() -> &'static Sink {
    static S: OnceLock<Sink> = OnceLock::new();
    S.get_or_init(|| {
        let mut level = std::env::var("VERBS_LOG_LEVEL").map(|v| parse_level(&v)).unwrap_or(0);
        if std::env::var_os("UIW_DEBUG").is_some_and(|v| !v.is_empty() && v != "0") {
            level = level.max(Level::Debug as i64);
        }
        let file = if level > 0 {
            std::env::var_os("VERBS_LOG_FILE")
                .and_then(|p| std::fs::OpenOptions::new().append(true).create(true).open(p).ok())
                .map(Mutex::new)
        } else {
            None
        };
        Sink { level, file }
    })
}

/// Is a message of level `l` wanted?
pub fn enabled(l: Level) -> bool {
    sink().level >= l as i64
}

/// Writes one message (`uiw: ` and a newline added); see [`uiw_log!`](crate::uiw_log).
pub fn write(args: Arguments<'_>) {
    let line = format!("uiw: {args}\n");
    match &sink().file {
        Some(f) => {
            let mut f = f.lock().unwrap_or_else(|e| e.into_inner());
            let _ = f.write_all(line.as_bytes());
        }
        None => {
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
    }
}

/// `uiw_log!(Warn, "QP 0x{:06x} to ERROR: {why:?}", qpn)`: the arguments are evaluated only
/// when the level is enabled.
#[macro_export]
macro_rules! uiw_log {
    ($lvl:ident, $($arg:tt)*) => {
        if $crate::engine::log::enabled($crate::engine::log::Level::$lvl) {
            $crate::engine::log::write(format_args!($($arg)*))
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_as_strtol_base_0() {
        assert_eq!(parse_level("4"), 4);
        assert_eq!(parse_level("0x3"), 3);
        assert_eq!(parse_level("010"), 8);
        assert_eq!(parse_level(" 2junk"), 2);
        assert_eq!(parse_level("junk"), 0);
        assert_eq!(parse_level("0"), 0);
        assert_eq!(parse_level("-1"), -1);
    }
}
