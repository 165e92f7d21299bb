//! The table's rows: a uiw measurement, the peers it is set beside, and the
//! issue's targets on the ratios.

use crate::probes::{Fabric, Kind, Probe};
use crate::setup::Transport;
use crate::stats::Target;

/// The perftest programs the rows use.
pub const PERFTEST_PROGS: &[&str] = &[
    "ib_write_bw",
    "ib_read_bw",
    "ib_send_bw",
    "ib_write_lat",
    "ib_send_lat",
    "ib_read_lat",
];

#[derive(Debug, Clone, PartialEq)]
pub struct Peer {
    pub probe: Probe,
    pub target: Option<Target>,
    /// The peer's figure is multiplied by this before the ratio (2 turns a
    /// half round trip into a full one for ib_read_lat).
    pub scale: f64,
}

/// A target on uiw's own figure, from the issue, with no peer to compare with (placement lag:
/// p99 well under 100 µs). Judged as the ratio figure / `value` against `target`, like a peer's.
#[derive(Debug, Clone, PartialEq)]
pub struct Bound {
    /// In the figure's unit.
    pub value: f64,
    pub target: Target,
    /// Where the bound comes from, for the table.
    pub source: &'static str,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// `--only` name.
    pub name: String,
    pub uiw: Probe,
    pub peers: Vec<Peer>,
    pub bound: Option<Bound>,
    /// Runs only when named in `--only` (the veth rows also by their group, `veth`): the veth
    /// rows need root, build network namespaces and add minutes to a run; the MPI rows take
    /// minutes per repetition, a network namespace and Open MPI.
    pub opt_in: bool,
}

const KIB64: u64 = 64 << 10;
const MIB1: u64 = 1 << 20;

fn peer(kind: Kind, size: u64, target: Option<Target>) -> Peer {
    Peer {
        probe: Probe::new(kind, size),
        target,
        scale: 1.0,
    }
}

fn bw_row(prog: &'static str, size: u64, with_targets: bool) -> Row {
    let t = |x| if with_targets { Some(x) } else { None };
    let short = prog.trim_start_matches("ib_");
    Row {
        name: format!("{short}_{}", if size == KIB64 { "64k" } else { "1m" }),
        uiw: Probe::new(Kind::Perftest { prog }, size),
        peers: vec![
            // Issue 9: 64 KiB ≥ 0.9×, 1 MiB ≥ 0.95× single-stream TCP.
            peer(Kind::TcpBw, size, t(Target::AtLeast(if size == KIB64 { 0.9 } else { 0.95 }))),
            peer(Kind::UcxPutBw, size, t(Target::Above(1.0))),
            peer(Kind::FiRmaBw, size, None),
            peer(Kind::Iperf3, size, None),
        ],
        bound: None,
        opt_in: false,
    }
}

fn lat_row(prog: &'static str, with_targets: bool) -> Row {
    let t = |x| if with_targets { Some(x) } else { None };
    Row {
        name: prog.trim_start_matches("ib_").to_string(),
        uiw: Probe::new(Kind::Perftest { prog }, 8),
        peers: vec![
            peer(Kind::TcpPp, 8, t(Target::AtMost(1.2))),
            peer(Kind::UcxAmLat, 8, t(Target::Below(1.0))),
            peer(Kind::FiPingpong, 8, t(Target::Below(1.0))),
            peer(Kind::UcxTagLat, 8, None),
        ],
        bound: None,
        opt_in: false,
    }
}

/// MPA CRC32c's cost: 1 MiB RDMA Write bandwidth with CRC requested on both sides
/// against the same run without (the rule: CRC by default if it keeps ≥ 0.9×).
fn crc_row() -> Row {
    Row {
        name: "write_bw_1m_crc".into(),
        uiw: Probe::new(Kind::PerftestCrc { prog: "ib_write_bw" }, MIB1),
        peers: vec![
            Peer { probe: Probe::new(Kind::Perftest { prog: "ib_write_bw" }, MIB1), target: Some(Target::AtLeast(0.9)), scale: 1.0 },
            peer(Kind::TcpBw, MIB1, None),
        ],
        bound: None,
        opt_in: false,
    }
}

/// Message rate and many QPs (issue 9): `ib_write_bw -s 64` against a stream of 64-byte TCP
/// `write()`s (the same size on both sides, so the bandwidth ratio is the message-rate ratio),
/// `-q 4` at 64 B against four such streams, and `-q 2` at 64 KiB against two TCP streams.
fn multi_rows() -> Vec<Row> {
    let q = |qps, size| Probe::new(Kind::PerftestQ { prog: "ib_write_bw", qps }, size);
    vec![
        Row {
            name: "write_bw_64".into(),
            uiw: Probe::new(Kind::Perftest { prog: "ib_write_bw" }, 64),
            peers: vec![peer(Kind::TcpBw, 64, Some(Target::AtLeast(1.0)))],
            bound: None,
            opt_in: false,
        },
        Row {
            name: "write_bw_64_q4".into(),
            uiw: q(4, 64),
            peers: vec![
                peer(Kind::TcpBwN { streams: 4, one_thread: false }, 64, Some(Target::AtLeast(1.0))),
                peer(Kind::TcpBw, 64, None),
            ],
            bound: None,
            opt_in: false,
        },
        Row {
            name: "write_bw_64k_q2".into(),
            uiw: q(2, KIB64),
            // The second peer moves the same bytes with uiw's threads: one sender, one
            // receiver. Two TCP streams with a thread per stream and side run about three
            // times faster on two CPUs (the scheduler puts each stream's sender and receiver
            // on one CPU, where the bytes stay in its cache); one thread per side, like
            // perftest's posting thread and the target's progress thread, cannot.
            peers: vec![
                peer(Kind::TcpBwN { streams: 2, one_thread: false }, KIB64, Some(Target::AtLeast(0.9))),
                peer(Kind::TcpBwN { streams: 2, one_thread: true }, KIB64, None),
            ],
            bound: None,
            opt_in: false,
        },
    ]
}

/// Placement lag (issue 9): "the time from the initiator's Write completion to the data being
/// visible at a target in the same process, p50 and p99 — well under 100 µs at p99". The
/// figure is the p99 (p50 and the rest are in the cell); it has no peer, only the bound.
fn lag_rows() -> Vec<Row> {
    [("placement_lag", 8), ("placement_lag_4k", 4096)]
        .into_iter()
        .map(|(name, size)| Row {
            name: name.into(),
            uiw: Probe::new(Kind::PlacementLag, size),
            peers: Vec::new(),
            bound: Some(Bound {
                value: 100.0,
                target: Target::AtMost(1.0),
                source: "issue 9: p99 well under 100 µs",
            }),
            opt_in: false,
        })
        .collect()
}

/// `--only veth` selects every row of this group.
pub const VETH_GROUP: &str = "veth";

/// Issue 12: across the veth test bed (two network namespaces, MTU 1500, offloads off), uiw
/// with the xdp transport on both hosts against uiw with the kernel-TCP transport on both
/// hosts (the targets: latency and message rate ahead, bandwidth at least equal) and against
/// raw kernel TCP between the same namespaces (informational). Opt-in.
fn veth_rows() -> Vec<Row> {
    let uiw = |prog, t, size| Probe::new(Kind::VethPerftest { prog, transport: t }, size);
    let row = |name: &str, prog: &'static str, size: u64, tcp_target: Target, raw: Kind| Row {
        name: name.into(),
        uiw: uiw(prog, Transport::Xdp, size),
        peers: vec![
            Peer { probe: uiw(prog, Transport::Tcp, size), target: Some(tcp_target), scale: 1.0 },
            peer(raw, size, None),
        ],
        bound: None,
        opt_in: true,
    };
    vec![
        row("veth_write_lat", "ib_write_lat", 8, Target::Below(1.0), Kind::VethTcpPp),
        row("veth_write_bw_64", "ib_write_bw", 64, Target::Above(1.0), Kind::VethTcpBw),
        row("veth_write_bw_64k", "ib_write_bw", KIB64, Target::AtLeast(1.0), Kind::VethTcpBw),
        row("veth_write_bw_1m", "ib_write_bw", MIB1, Target::AtLeast(1.0), Kind::VethTcpBw),
    ]
}

/// Applications over uiw (issue 9), against the same application over TCP in the same run:
/// two Open MPI ranks (mpi_check) over libfabric `verbs;ofi_rxm` on uiw against
/// `FI_PROVIDER=tcp` — uiw's 8-byte latency below tcp's, its 64 KiB and 1 MiB bandwidth at
/// least tcp's —, and qperf's RC latency tests with rdma_cm (`-cm 1`) against qperf's own
/// `tcp_lat`, 8 bytes, below it. Open MPI's own TCP transport is beside the MPI rows for
/// reference. The MPI rows are opt-in: they need Open MPI (which uiw-bench does not install)
/// and make a network namespace.
fn app_rows() -> Vec<Row> {
    let mpi = |name: &str, size: u64, lat: bool| {
        let k = |fabric| if lat { Kind::MpiLat { fabric } } else { Kind::MpiBw { fabric } };
        Row {
            name: name.into(),
            uiw: Probe::new(k(Fabric::UiwVerbs), size),
            peers: vec![
                peer(
                    k(Fabric::Tcp),
                    size,
                    Some(if lat { Target::Below(1.0) } else { Target::AtLeast(1.0) }),
                ),
                peer(k(Fabric::Ob1Tcp), size, None),
            ],
            bound: None,
            opt_in: true,
        }
    };
    let qperf = |test: &'static str| Row {
        name: format!("qperf_{test}"),
        uiw: Probe::new(Kind::Qperf { test }, 8),
        peers: vec![peer(Kind::Qperf { test: "tcp_lat" }, 8, Some(Target::Below(1.0)))],
        bound: None,
        opt_in: false,
    };
    vec![
        mpi("mpi_lat_8", 8, true),
        mpi("mpi_bw_64k", KIB64, false),
        mpi("mpi_bw_1m", MIB1, false),
        qperf("rc_lat"),
        qperf("rc_rdma_write_poll_lat"),
    ]
}

/// Every row, in table order. The targets sit on the write_bw,
/// write_lat and send_lat rows; the others are informational.
pub fn all() -> Vec<Row> {
    let mut read_lat = lat_row("ib_read_lat", false);
    for p in &mut read_lat.peers {
        p.scale = 2.0; // peers report half round trips, a read is a full one
    }
    // Issue 9: ib_read_lat ≤ 2.4× the TCP busy-poll half round trip, i.e. ≤ 1.2× its full one.
    read_lat.peers[0].target = Some(Target::AtMost(1.2));
    let mut rows = vec![
        bw_row("ib_write_bw", KIB64, true),
        bw_row("ib_write_bw", MIB1, true),
        crc_row(),
        lat_row("ib_write_lat", true),
        lat_row("ib_send_lat", true),
        bw_row("ib_read_bw", KIB64, false),
        bw_row("ib_read_bw", MIB1, false),
        bw_row("ib_send_bw", KIB64, false),
        bw_row("ib_send_bw", MIB1, false),
        read_lat,
    ];
    let at = rows.iter().position(|r| r.name == "write_lat").unwrap_or(rows.len());
    rows.splice(at..at, multi_rows());
    rows.extend(lag_rows());
    rows.extend(veth_rows());
    rows.extend(app_rows());
    rows
}

/// The rows `--only` selects (all but the opt-in ones — veth_* and mpi_* — when `only` is
/// empty; `veth` names the veth rows). Unknown names are an error listing the valid ones.
/// `sweep` is not a row and is skipped.
pub fn select(only: &[String]) -> Result<Vec<Row>, String> {
    let rows = all();
    if only.is_empty() {
        return Ok(rows.into_iter().filter(|r| !r.opt_in).collect());
    }
    let names: Vec<String> = rows.iter().map(|r| r.name.clone()).collect();
    for o in only {
        if o != "sweep" && o != VETH_GROUP && !names.contains(o) {
            return Err(format!(
                "unknown row {o:?} for --only (rows: {}, {VETH_GROUP}, sweep)",
                names.join(", ")
            ));
        }
    }
    let veth = only.iter().any(|o| o == VETH_GROUP);
    Ok(rows
        .into_iter()
        .filter(|r| only.contains(&r.name) || (veth && r.name.starts_with("veth_")))
        .collect())
}

/// The distinct probes of `rows`, in first-use order: one repetition runs
/// them in this order, so uiw and its peers alternate (A B C A B C …).
pub fn probe_order(rows: &[Row]) -> Vec<Probe> {
    let mut v: Vec<Probe> = Vec::new();
    for r in rows {
        for p in std::iter::once(&r.uiw).chain(r.peers.iter().map(|p| &p.probe)) {
            if !v.contains(p) {
                v.push(p.clone());
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_targets() {
        let rows = all();
        let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "write_bw_64k",
                "write_bw_1m",
                "write_bw_1m_crc",
                "write_bw_64",
                "write_bw_64_q4",
                "write_bw_64k_q2",
                "write_lat",
                "send_lat",
                "read_bw_64k",
                "read_bw_1m",
                "send_bw_64k",
                "send_bw_1m",
                "read_lat",
                "placement_lag",
                "placement_lag_4k",
                "veth_write_lat",
                "veth_write_bw_64",
                "veth_write_bw_64k",
                "veth_write_bw_1m",
                "mpi_lat_8",
                "mpi_bw_64k",
                "mpi_bw_1m",
                "qperf_rc_lat",
                "qperf_rc_rdma_write_poll_lat"
            ]
        );
        let w = &rows[0];
        assert_eq!(w.uiw.size, 65536);
        assert_eq!(w.peers[0].target, Some(Target::AtLeast(0.9)));
        assert_eq!(w.peers[1].target, Some(Target::Above(1.0)));
        assert_eq!(rows[1].uiw.size, 1 << 20);
        assert_eq!(rows[1].peers[0].target, Some(Target::AtLeast(0.95)));
        assert_eq!(rows[2].peers[0].target, Some(Target::AtLeast(0.9)));
        assert_eq!(rows[3].uiw.size, 64);
        assert_eq!(rows[3].peers[0].target, Some(Target::AtLeast(1.0)));
        assert_eq!(rows[4].uiw.kind, Kind::PerftestQ { prog: "ib_write_bw", qps: 4 });
        assert_eq!(rows[4].peers[0].probe.kind, Kind::TcpBwN { streams: 4, one_thread: false });
        assert_eq!(rows[5].peers[0].target, Some(Target::AtLeast(0.9)));
        assert_eq!(rows[5].peers[1].probe.kind, Kind::TcpBwN { streams: 2, one_thread: true });
        assert_eq!(rows[5].peers[1].target, None, "the same-threads TCP figure is a reference, not a target");
        let l = &rows[7];
        assert_eq!(l.peers[0].target, Some(Target::AtMost(1.2)));
        assert_eq!(l.peers[1].target, Some(Target::Below(1.0)));
        assert_eq!(l.peers[2].target, Some(Target::Below(1.0)));
        assert!(rows[8].peers.iter().all(|p| p.target.is_none()));
        let r = &rows[12];
        assert!(r.peers.iter().all(|p| p.scale == 2.0));
        assert_eq!(r.peers[0].target, Some(Target::AtMost(1.2)), "2.4x the half round trip");
        let lag = &rows[13];
        assert_eq!((lag.uiw.kind, lag.uiw.size), (Kind::PlacementLag, 8));
        assert!(lag.peers.is_empty());
        assert_eq!(
            lag.bound.as_ref().map(|b| (b.value, b.target)),
            Some((100.0, Target::AtMost(1.0)))
        );
        assert_eq!(rows[14].uiw.size, 4096);
        assert!(rows[..13].iter().all(|r| r.bound.is_none()));
        assert!(rows[..15].iter().all(|r| !r.opt_in));
        assert!(rows[15..19].iter().all(|r| r.name.starts_with("veth_")), "the veth rows: see below");
        let m = &rows[19];
        assert_eq!(m.uiw.kind, Kind::MpiLat { fabric: Fabric::UiwVerbs });
        assert_eq!(m.uiw.size, 8);
        assert_eq!(m.peers.len(), 2);
        assert_eq!(m.peers[0].probe.kind, Kind::MpiLat { fabric: Fabric::Tcp });
        assert_eq!(m.peers[0].target, Some(Target::Below(1.0)), "uiw below tcp");
        assert_eq!(m.peers[1].probe.kind, Kind::MpiLat { fabric: Fabric::Ob1Tcp });
        assert_eq!(m.peers[1].target, None, "Open MPI's own TCP: informational");
        for (r, size) in [(&rows[20], KIB64), (&rows[21], MIB1)] {
            assert_eq!(r.uiw, Probe::new(Kind::MpiBw { fabric: Fabric::UiwVerbs }, size));
            assert_eq!(r.peers[0].probe, Probe::new(Kind::MpiBw { fabric: Fabric::Tcp }, size));
            assert_eq!(r.peers[0].target, Some(Target::AtLeast(1.0)), "at least tcp");
        }
        for (r, test) in [(&rows[22], "rc_lat"), (&rows[23], "rc_rdma_write_poll_lat")] {
            assert_eq!(r.uiw, Probe::new(Kind::Qperf { test }, 8));
            assert_eq!(r.peers[0].probe, Probe::new(Kind::Qperf { test: "tcp_lat" }, 8));
            assert_eq!(r.peers[0].target, Some(Target::Below(1.0)));
        }
        let opt_in: Vec<&str> = rows.iter().filter(|r| r.opt_in).map(|r| r.name.as_str()).collect();
        assert_eq!(
            opt_in,
            [
                "veth_write_lat",
                "veth_write_bw_64",
                "veth_write_bw_64k",
                "veth_write_bw_1m",
                "mpi_lat_8",
                "mpi_bw_64k",
                "mpi_bw_1m"
            ]
        );
    }

    #[test]
    fn veth_rows_set_xdp_against_the_kernel_tcp_transport_and_raw_tcp() {
        let rows = select(&[VETH_GROUP.into()]).unwrap();
        assert_eq!(rows.len(), 4);
        for r in &rows {
            assert!(r.opt_in && r.uiw.on_veth() && r.peers.iter().all(|p| p.probe.on_veth()), "{}", r.name);
            let Kind::VethPerftest { prog, transport } = r.uiw.kind else { panic!("{}", r.name) };
            assert_eq!(transport, Transport::Xdp);
            assert_eq!(r.peers[0].probe.kind, Kind::VethPerftest { prog, transport: Transport::Tcp });
            assert_eq!(r.peers[0].probe.size, r.uiw.size);
            assert_eq!(r.peers[1].target, None, "raw TCP is informational");
        }
        let t = |i: usize| rows[i].peers[0].target;
        assert_eq!((rows[0].uiw.size, t(0)), (8, Some(Target::Below(1.0))), "latency ahead");
        assert_eq!(rows[0].peers[1].probe.kind, Kind::VethTcpPp);
        assert_eq!((rows[1].uiw.size, t(1)), (64, Some(Target::Above(1.0))), "message rate ahead");
        assert_eq!((rows[2].uiw.size, t(2)), (65536, Some(Target::AtLeast(1.0))), "bandwidth at least equal");
        assert_eq!((rows[3].uiw.size, t(3)), (1 << 20, Some(Target::AtLeast(1.0))));
        assert!(rows[1..].iter().all(|r| r.peers[1].probe.kind == Kind::VethTcpBw));
        // Opt-in: not in a default run, selectable one by one.
        assert!(select(&[]).unwrap().iter().all(|r| !r.opt_in));
        assert_eq!(select(&["veth_write_bw_1m".into()]).unwrap().len(), 1);
        // One repetition alternates xdp, kernel-TCP transport, raw TCP.
        let ids: Vec<String> = probe_order(&rows[..1]).iter().map(|p| p.id()).collect();
        assert_eq!(ids, ["veth.uiw_xdp.ib_write_lat.8", "veth.uiw_tcp.ib_write_lat.8", "veth.tcp.pp_busy.8"]);
    }

    #[test]
    fn opt_in_rows_only_by_name() {
        let default = select(&[]).unwrap();
        assert_eq!(default.len(), all().len() - 7, "the 3 MPI rows and the 4 veth rows");
        assert!(default.iter().all(|r| !r.name.starts_with("mpi_") && !r.name.starts_with("veth_")));
        assert!(default.iter().any(|r| r.name == "qperf_rc_lat"));
        let r = select(&["mpi_lat_8".into(), "qperf_rc_lat".into(), "qperf_rc_rdma_write_poll_lat".into()]).unwrap();
        let ids: Vec<String> = probe_order(&r).iter().map(|p| p.id()).collect();
        assert_eq!(
            ids,
            [
                "uiw.mpi_lat_verbs_ofi_rxm.8",
                "libfabric.mpi_lat_tcp.8",
                "tcp.mpi_lat_ob1_btl_tcp.8",
                "uiw.qperf_rc_lat.8",
                "tcp.qperf_tcp_lat.8",
                "uiw.qperf_rc_rdma_write_poll_lat.8"
            ],
            "uiw and its peer alternate; the shared tcp_lat runs once per repetition"
        );
    }

    #[test]
    fn selection_and_order() {
        let r = select(&["write_lat".into(), "sweep".into()]).unwrap();
        assert_eq!(r.len(), 1);
        assert!(select(&["nope".into()])
            .unwrap_err()
            .contains("write_bw_64k"));
        let order = probe_order(&select(&["write_lat".into(), "send_lat".into()]).unwrap());
        let ids: Vec<String> = order.iter().map(|p| p.id()).collect();
        assert_eq!(
            ids,
            [
                "uiw.ib_write_lat.8",
                "tcp.pp_busy.8",
                "ucx.am_lat.8",
                "libfabric.fi_pingpong.8",
                "ucx.tag_lat.8",
                "uiw.ib_send_lat.8"
            ]
        );
    }
}
