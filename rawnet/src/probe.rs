//! Can this process run a raw-frame transport? Asked of the kernel, without touching any
//! interface: open (and close) the socket, and for AF_XDP create (and close) an XSK map —
//! the steps that need privileges.

use std::fmt;
use std::io;

/// A raw-frame transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// AF_XDP (with an XDP program).
    Xdp,
    /// AF_PACKET.
    Packet,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Xdp => "xdp",
            Kind::Packet => "packet",
        })
    }
}

/// Why the transport cannot run here.
#[derive(Debug)]
pub enum ProbeError {
    /// The privileges are missing (EPERM/EACCES): which ones, and the failing step.
    Privileges { needs: &'static str, step: &'static str, err: io::Error },
    /// The kernel lacks the feature.
    Unsupported { step: &'static str, err: io::Error },
}

impl fmt::Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeError::Privileges { needs, step, err } => write!(f, "needs {needs}, which this process lacks ({step}: {err})"),
            ProbeError::Unsupported { step, err } => write!(f, "this kernel does not support it ({step}: {err})"),
        }
    }
}

impl std::error::Error for ProbeError {}

fn classify(needs: &'static str, step: &'static str, err: io::Error) -> ProbeError {
    match err.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => ProbeError::Privileges { needs, step, err },
        _ => ProbeError::Unsupported { step, err },
    }
}

/// Check that `kind` can be opened by this process.
pub fn probe(kind: Kind) -> Result<(), ProbeError> {
    let (family, needs, step) = match kind {
        Kind::Xdp => (44, "CAP_NET_RAW, CAP_NET_ADMIN and CAP_BPF (root)", "socket(AF_XDP)"),
        Kind::Packet => (libc::AF_PACKET, "CAP_NET_RAW and CAP_NET_ADMIN (root; nftables for the RST guard)", "socket(AF_PACKET)"),
    };
    drop(uiw_kabi::raw::socket(family, libc::SOCK_RAW, 0).map_err(|e| classify(needs, step, e))?);
    if kind == Kind::Xdp {
        crate::ebpf::xsk_map(1).map_err(|e| {
            let e = io::Error::from_raw_os_error(e.raw_os_error().unwrap_or(libc::EIO));
            classify(needs, "bpf(BPF_MAP_CREATE, XSKMAP)", e)
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_names_what_is_missing() {
        let e = classify("CAP_X", "socket(AF_XDP)", io::Error::from_raw_os_error(libc::EPERM));
        assert!(matches!(e, ProbeError::Privileges { .. }));
        assert!(e.to_string().contains("needs CAP_X"), "{e}");
        let e = classify("CAP_X", "socket(AF_XDP)", io::Error::from_raw_os_error(libc::EAFNOSUPPORT));
        assert!(e.to_string().contains("does not support"), "{e}");
    }
}
