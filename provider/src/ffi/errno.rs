//! The one place engine errors become the errno a verb returns (the values the kernel's
//! providers return for the same conditions; see each error type's documentation).

use crate::engine::cm::CmStatus;
use crate::engine::error::Error;
use crate::engine::mr::RegError;
use crate::engine::qp_state::{CreateError, ModifyError};
use crate::engine::wr::PostError;

/// An engine error as an errno.
pub(crate) trait Errno {
    fn errno(&self) -> i32;
}

impl Errno for Error {
    fn errno(&self) -> i32 {
        match self {
            Error::Invalid => libc::EINVAL,
            Error::Exhausted => libc::ENOMEM,
            Error::Busy => libc::EBUSY,
            Error::NoTransport => libc::EADDRINUSE,
            Error::NotSupported => libc::EOPNOTSUPP,
            Error::Io(e) => e.raw_os_error().unwrap_or(match e.kind() {
                // A raw-frame transport that could not be set up without privileges (nft).
                std::io::ErrorKind::PermissionDenied => libc::EPERM,
                _ => libc::EIO,
            }),
            Error::Create(e) => e.errno(),
        }
    }
}

impl Errno for RegError {
    fn errno(&self) -> i32 {
        match self {
            RegError::OnDemandUnsupported => libc::EOPNOTSUPP,
            RegError::TooMany => libc::ENOMEM,
            _ => libc::EINVAL,
        }
    }
}

impl Errno for PostError {
    fn errno(&self) -> i32 {
        match self {
            PostError::QueueFull => libc::ENOMEM,
            PostError::Unsupported => libc::EOPNOTSUPP,
            _ => libc::EINVAL,
        }
    }
}

impl Errno for CmStatus {
    fn errno(&self) -> i32 {
        match self {
            CmStatus::Ok => 0,
            CmStatus::Refused => libc::ECONNREFUSED,
            CmStatus::Reset => libc::ECONNRESET,
            CmStatus::LocalError => libc::EIO,
        }
    }
}

// `qp_state` documents the errno of each of its errors beside the kernel code it follows
// (its tables are its specification); these only forward to it.
impl Errno for ModifyError {
    fn errno(&self) -> i32 {
        ModifyError::errno(self)
    }
}

impl Errno for CreateError {
    fn errno(&self) -> i32 {
        CreateError::errno(self)
    }
}
