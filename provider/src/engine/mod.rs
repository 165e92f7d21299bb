//! The engine: device state, verbs objects and the data path, in safe Rust.
//! The FFI layer (`crate::ffi`) is its only caller; it never sees a C pointer.
#![forbid(unsafe_code)]

pub mod access;
pub mod cm;
pub mod context;
pub mod cq;
pub mod device;
pub mod dma;
pub mod events;
pub mod limits;
pub mod link;
pub mod mr;
pub mod net;
pub mod qp_state;
pub mod srq;
pub mod wr;
