//! uiw-utcp: a sans-IO userspace TCP (RFC 9293) for uiw's raw-frame transports.
//!
//! The driver (AF_XDP or AF_PACKET, in `uiw-rawnet`) moves Ethernet frames and the clock in
//! and out; this crate holds every protocol decision. See `README.md` for why uiw has its
//! own TCP instead of smoltcp, and what of RFC 9293 it implements.
#![forbid(unsafe_code)]

pub mod packet;
pub mod reasm;
pub mod rtt;
pub mod seq;
pub mod stack;
pub mod tcb;

pub use stack::{Handle, Stack, StackConfig};
pub use tcb::{Config, Event, State, Tcb};
