//! uiw-wire: a sans-IO iWARP protocol core.
//!
//! MPA (RFC 5044 + RFC 6581), DDP (RFC 5041), RDMAP (RFC 5040 + RFC 7306).
//! No sockets, no clock, no threads: the caller moves bytes and time in and
//! out. See `README.md` for the module map and design decisions.
#![forbid(unsafe_code)]

pub mod conn;
pub mod crc;
pub mod ddp;
pub mod error;
pub mod mpa;
pub mod placement;
pub mod rdmap;
pub mod segment;

pub use error::{Layer, PostError, TaggedError, TermCode, WcStatus, WireError};
