//! # libuiw-rdmav34.so — the uiw provider for rdma-core's libibverbs
//!
//! libibverbs (rdma-core v36–v65: private ABI 34, 57, 59, 64 or 65) `dlopen`s this library,
//! as `libuiw-rdmav<PABI>.so`, for devices named `uiw_*`. Its ELF constructor reads which
//! release the running libibverbs is, refuses one whose layouts uiw does not know, looks up
//! that release's private functions (`uiw_kabi::ffi::PrivateFns`) and registers the provider;
//! from then on libibverbs calls the ops in [`ffi`], which turn C pointers into the safe
//! objects of [`engine`]. See kabi/README.md for what differs between the releases.
//!
//! - [`ffi`]: the C ABI surface (the only `unsafe` code of the provider).
//! - [`engine`]: device, contexts, PDs, MRs, CQs, QPs, SRQs; `#![forbid(unsafe_code)]`.

pub mod engine;
mod ffi;
