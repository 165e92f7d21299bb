//! The engine's error type for verbs that create, destroy or connect objects. The FFI layer
//! turns it into the errno the verb returns (`crate::ffi::errno`); nothing in the engine
//! speaks errno.

use std::fmt;
use std::io;

use super::qp_state::CreateError;

/// Why a verb failed.
#[derive(Debug)]
pub enum Error {
    /// An argument or object state the verb does not accept (`EINVAL`).
    Invalid,
    /// A device limit is reached (`ENOMEM`).
    Exhausted,
    /// The object is still in use (`EBUSY`).
    Busy,
    /// The process's transport could not start: no free port for QP numbers (`EADDRINUSE`).
    NoTransport,
    /// Not available on this device yet (`EOPNOTSUPP`): rdma_cm on a device whose streams
    /// go over a raw-frame transport.
    NotSupported,
    /// A socket operation failed (its errno, or `EIO`).
    Io(io::Error),
    /// `ibv_create_qp` refused (`CreateError` says which errno).
    Create(CreateError),
}

pub type Result<T> = std::result::Result<T, Error>;

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Error {
        Error::Io(e)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Invalid => f.write_str("invalid argument or object state"),
            Error::Exhausted => f.write_str("device limit reached"),
            Error::Busy => f.write_str("object still in use"),
            Error::NoTransport => f.write_str("no free TCP port for QP numbers"),
            Error::NotSupported => f.write_str("not supported on this device yet"),
            Error::Io(e) => write!(f, "{e}"),
            Error::Create(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {}
