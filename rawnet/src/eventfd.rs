//! An `eventfd(2)` (`uiw_kabi::raw::EventFd`): how the raw-frame transport tells an epoll
//! loop (the provider's progress thread) that a stream or a listener it serves has news, as
//! a kernel socket's readiness would.

pub use uiw_kabi::raw::EventFd;
