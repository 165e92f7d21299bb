//! The measurements: one program (or server/client pair) at one size, what
//! it measures, on which side, and the exact command lines.

use crate::parse;
use crate::proc::Cmd;
use crate::setup::{Ctx, Host, Transport};
use std::time::Duration;

/// What a probe's figure is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// GB/s, 10^9 bytes per second.
    Bandwidth,
    /// µs.
    Latency,
}

impl Metric {
    pub fn unit(self) -> &'static str {
        match self {
            Metric::Bandwidth => "GB/s",
            Metric::Latency => "µs",
        }
    }
}

/// The program behind a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// perftest program (ib_write_bw, ib_send_lat, …) over uiw, MPA CRC off (`UIW_CRC=0`).
    Perftest {
        prog: &'static str,
    },
    /// The same perftest program with MPA CRC32c requested (`UIW_CRC=1` on both sides).
    PerftestCrc {
        prog: &'static str,
    },
    TcpBw,
    /// `tcpbench bw -n STREAMS`: that many TCP streams at once, summed at the receivers; with
    /// `one_thread` (`-1`), one thread per side serves them all, as perftest's one posting
    /// thread and uiw's one progress thread do (else a thread per stream and side, which the
    /// scheduler may pair up on one CPU each).
    TcpBwN {
        streams: u32,
        one_thread: bool,
    },
    /// A perftest bandwidth program over uiw with `-q QPS` (that many QPs at once).
    PerftestQ {
        prog: &'static str,
        qps: u32,
    },
    TcpPp,
    Iperf3,
    UcxPutBw,
    UcxAmLat,
    UcxTagLat,
    FiPingpong,
    FiRmaBw,
    /// examples/c/placement_lag.c over uiw (issue 9): in one process, the time from an RDMA
    /// Write's completion at the initiator to its data being visible at a passive target
    /// (whose CQ nobody polls). The figure is the p99 of one run; p50, p99.9 and max are its
    /// details.
    PlacementLag,
    /// A perftest program between the veth test bed's two namespaces (issue 12): client on
    /// host A, server on host B, over the uiw device published there with `transport`.
    VethPerftest {
        prog: &'static str,
        transport: Transport,
    },
    /// `tcpbench bw -l` on host B (the receiver, measuring), `tcpbench bw -c` on host A.
    VethTcpBw,
    /// `tcpbench pp -l -b` (echo) on host B, `tcpbench pp -c -b` (timing) on host A.
    VethTcpPp,
    /// perftest/mpi/mpi_check.c, `lat SIZE ITERS`: two Open MPI ranks (`--mca pml cm --mca
    /// mtl ofi`) ping-ponging, in the MPI network namespace ([`crate::setup::MpiNet`]). The
    /// figure is the median half round trip; mean and p99 are its details.
    MpiLat {
        fabric: Fabric,
    },
    /// mpi_check `bw SIZE BYTES`: rank 0 streams to rank 1, 64 messages in flight.
    MpiBw {
        fabric: Fabric,
    },
    /// qperf 0.4.11, server and client on this host: an RC test with rdma_cm (`-cm 1`) over
    /// uiw, or `tcp_lat` over plain TCP.
    Qperf {
        test: &'static str,
    },
}

/// The libfabric provider under an MPI probe's ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fabric {
    /// `FI_PROVIDER="verbs;ofi_rxm"` on the uiw device of the namespace's veth, under `uiw run`.
    UiwVerbs,
    /// `FI_PROVIDER=tcp` (libfabric gives it as `tcp;ofi_rxm`) on the same veth.
    Tcp,
    /// Open MPI's own TCP transport (`--mca pml ob1 --mca btl self,tcp`), no libfabric: an
    /// informational second TCP reference, to show whether libfabric's tcp is the slow part.
    Ob1Tcp,
}

impl Fabric {
    fn id(self) -> &'static str {
        match self {
            Fabric::UiwVerbs => "verbs_ofi_rxm",
            Fabric::Tcp => "tcp",
            Fabric::Ob1Tcp => "ob1_btl_tcp",
        }
    }
    fn label(self) -> &'static str {
        match self {
            Fabric::UiwVerbs => "uiw (libfabric verbs;ofi_rxm)",
            Fabric::Tcp => "libfabric tcp",
            Fabric::Ob1Tcp => "Open MPI's TCP BTL (pml ob1)",
        }
    }
}

/// A run's further figures besides its main one, named: `[("p50", 1.2), …]`.
pub type Details = Vec<(&'static str, f64)>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    pub kind: Kind,
    pub size: u64,
}

/// `64 KiB`, `1 MiB`, `8 B`.
pub fn size_label(n: u64) -> String {
    if n >= 1 << 20 && n & ((1 << 20) - 1) == 0 {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n & ((1 << 10) - 1) == 0 {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} B")
    }
}

impl Probe {
    pub fn new(kind: Kind, size: u64) -> Self {
        Probe { kind, size }
    }

    /// Stable identifier used in CSV/JSON and log names: `uiw.ib_write_bw.65536`.
    pub fn id(&self) -> String {
        let k = match self.kind {
            Kind::Perftest { prog } => return format!("uiw.{prog}.{}", self.size),
            Kind::PerftestCrc { prog } => return format!("uiw_crc.{prog}.{}", self.size),
            Kind::PerftestQ { prog, qps } => return format!("uiw.{prog}_q{qps}.{}", self.size),
            Kind::VethPerftest { prog, transport } => {
                return format!("veth.uiw_{}.{prog}.{}", transport.name(), self.size)
            }
            Kind::VethTcpBw => "veth.tcp.bw",
            Kind::VethTcpPp => "veth.tcp.pp_busy",
            Kind::TcpBwN { streams, one_thread: false } => return format!("tcp.bw_{streams}streams.{}", self.size),
            Kind::TcpBwN { streams, one_thread: true } => return format!("tcp.bw_{streams}streams_1thread.{}", self.size),
            Kind::TcpBw => "tcp.bw",
            Kind::TcpPp => "tcp.pp_busy",
            Kind::Iperf3 => "tcp.iperf3",
            Kind::UcxPutBw => "ucx.put_bw_zcopy",
            Kind::UcxAmLat => "ucx.am_lat",
            Kind::UcxTagLat => "ucx.tag_lat",
            Kind::FiPingpong => "libfabric.fi_pingpong",
            Kind::FiRmaBw => "libfabric.fi_rma_bw_write",
            Kind::PlacementLag => "uiw.placement_lag_p99",
            Kind::MpiLat { fabric } | Kind::MpiBw { fabric } => {
                let test = if matches!(self.kind, Kind::MpiLat { .. }) { "lat" } else { "bw" };
                return format!("{}.mpi_{test}_{}.{}", self.stack_id(), fabric.id(), self.size);
            }
            Kind::Qperf { test } => return format!("{}.qperf_{test}.{}", self.stack_id(), self.size),
        };
        format!("{k}.{}", self.size)
    }

    /// Human name for the table.
    pub fn label(&self) -> String {
        let s = size_label(self.size);
        match self.kind {
            Kind::Perftest { prog } => format!("uiw {prog} {s}"),
            Kind::PerftestCrc { prog } => format!("uiw {prog} {s}, MPA CRC on (UIW_CRC=1)"),
            Kind::PerftestQ { prog, qps } => format!("uiw {prog} -q {qps} {s}"),
            Kind::TcpBwN { streams, one_thread: false } => format!("TCP {streams} streams {s} (tcpbench bw -n {streams})"),
            Kind::TcpBwN { streams, one_thread: true } => {
                format!("TCP {streams} streams {s}, one thread per side (tcpbench bw -n {streams} -1)")
            }
            Kind::TcpBw => format!("TCP single stream {s} (tcpbench bw)"),
            Kind::TcpPp => format!("TCP busy-poll ping-pong {s} (tcpbench pp -b)"),
            Kind::Iperf3 => format!("TCP iperf3 -l {s}"),
            Kind::UcxPutBw => format!("UCX UCT tcp put_bw zcopy {s}"),
            Kind::UcxAmLat => format!("UCX UCT tcp am_lat {s}"),
            Kind::UcxTagLat => format!("UCX UCP tag_lat {s} (UCX_TLS=tcp)"),
            Kind::FiPingpong => format!("libfabric tcp fi_pingpong {s}"),
            Kind::FiRmaBw => format!("libfabric tcp fi_rma_bw write {s}"),
            Kind::PlacementLag => format!("uiw placement lag {s} (placement_lag)"),
            Kind::VethPerftest { prog, transport: Transport::Xdp } => {
                format!("uiw {prog} {s}, xdp transport, veth")
            }
            Kind::VethPerftest { prog, transport: Transport::Tcp } => {
                format!("uiw {prog} {s}, kernel-TCP transport, veth")
            }
            Kind::VethTcpBw => format!("raw TCP single stream {s}, veth (tcpbench bw)"),
            Kind::VethTcpPp => format!("raw TCP busy-poll ping-pong {s}, veth (tcpbench pp -b)"),
            Kind::MpiLat { fabric } => format!("Open MPI ping-pong {s} over {} (mpi_check)", fabric.label()),
            Kind::MpiBw { fabric } => format!("Open MPI stream {s} over {} (mpi_check)", fabric.label()),
            Kind::Qperf { test } if test.starts_with("tcp_") => format!("qperf {test} {s}"),
            Kind::Qperf { test } => format!("uiw qperf -cm 1 {test} {s}"),
        }
    }

    /// The software stack, for the table's peer column and the charts.
    pub fn stack(&self) -> &'static str {
        match self.kind {
            Kind::Perftest { .. }
            | Kind::PerftestCrc { .. }
            | Kind::PerftestQ { .. }
            | Kind::PlacementLag => "uiw",
            Kind::VethPerftest { transport: Transport::Xdp, .. } => "uiw-xdp",
            Kind::VethPerftest { transport: Transport::Tcp, .. } => "uiw-tcp",
            Kind::VethTcpBw | Kind::VethTcpPp => "TCP",
            Kind::TcpBw | Kind::TcpBwN { .. } | Kind::TcpPp | Kind::Iperf3 => "TCP",
            Kind::UcxPutBw | Kind::UcxAmLat | Kind::UcxTagLat => "UCX",
            Kind::FiPingpong | Kind::FiRmaBw => "libfabric",
            Kind::MpiLat { fabric } | Kind::MpiBw { fabric } => match fabric {
                Fabric::UiwVerbs => "uiw",
                Fabric::Tcp => "libfabric",
                Fabric::Ob1Tcp => "TCP",
            },
            Kind::Qperf { test } if test.starts_with("tcp_") => "TCP",
            Kind::Qperf { .. } => "uiw",
        }
    }

    /// The first part of [`Probe::id`].
    fn stack_id(&self) -> &'static str {
        match self.stack() {
            "uiw" => "uiw",
            "TCP" => "tcp",
            _ => "libfabric",
        }
    }

    pub fn metric(&self) -> Metric {
        match self.kind {
            Kind::Perftest { prog } | Kind::VethPerftest { prog, .. } if prog.ends_with("_lat") => {
                Metric::Latency
            }
            Kind::VethPerftest { .. } | Kind::VethTcpBw => Metric::Bandwidth,
            Kind::VethTcpPp => Metric::Latency,
            Kind::Perftest { .. } | Kind::PerftestCrc { .. } | Kind::PerftestQ { .. } => Metric::Bandwidth,
            Kind::TcpBw | Kind::TcpBwN { .. } | Kind::Iperf3 | Kind::UcxPutBw | Kind::FiRmaBw => Metric::Bandwidth,
            Kind::TcpPp | Kind::UcxAmLat | Kind::UcxTagLat | Kind::FiPingpong | Kind::PlacementLag => Metric::Latency,
            Kind::MpiLat { .. } | Kind::Qperf { .. } => Metric::Latency,
            Kind::MpiBw { .. } => Metric::Bandwidth,
        }
    }

    /// Which side's clock the figure comes from.
    pub fn side(&self) -> &'static str {
        match self.kind {
            Kind::Perftest {
                prog: "ib_read_lat",
            } => "requester, full read round trip",
            Kind::Perftest { .. } | Kind::VethPerftest { .. } if self.metric() == Metric::Latency => {
                "requester, half round trip"
            }
            Kind::VethPerftest { .. } => "requester",
            Kind::VethTcpBw => "receiver",
            Kind::VethTcpPp => "client, half round trip",
            Kind::Perftest { .. } | Kind::PerftestCrc { .. } | Kind::PerftestQ { .. } => "requester",
            Kind::TcpBw | Kind::TcpBwN { .. } | Kind::Iperf3 => "receiver",
            Kind::UcxPutBw | Kind::FiRmaBw => "initiator",
            Kind::TcpPp | Kind::UcxAmLat | Kind::UcxTagLat | Kind::FiPingpong => {
                "client, half round trip"
            }
            Kind::PlacementLag => "initiator's completion to data seen at the passive target, p99",
            Kind::MpiLat { .. } => "rank 0, half round trip",
            Kind::MpiBw { .. } => "rank 0 (sender), until rank 1 acknowledged",
            Kind::Qperf { .. } => "client, half round trip",
        }
    }

    /// The program that must exist on PATH (or be built) for this probe.
    pub fn tool(&self) -> &'static str {
        match self.kind {
            Kind::Perftest { prog }
            | Kind::PerftestCrc { prog }
            | Kind::PerftestQ { prog, .. }
            | Kind::VethPerftest { prog, .. } => prog,
            Kind::VethTcpBw | Kind::VethTcpPp => "tcpbench",
            Kind::TcpBw | Kind::TcpBwN { .. } | Kind::TcpPp => "tcpbench",
            Kind::Iperf3 => "iperf3",
            Kind::UcxPutBw | Kind::UcxAmLat | Kind::UcxTagLat => "ucx_perftest",
            Kind::FiPingpong => "fi_pingpong",
            Kind::FiRmaBw => "fi_rma_bw",
            Kind::PlacementLag => "placement_lag",
            Kind::MpiLat { .. } | Kind::MpiBw { .. } => "mpi_check",
            Kind::Qperf { .. } => "qperf",
        }
    }

    pub fn parse(&self, out: &str) -> Result<f64, String> {
        match self.kind {
            Kind::Perftest { .. } | Kind::VethPerftest { .. } if self.metric() == Metric::Latency => {
                parse::perftest_lat(out)
            }
            Kind::Perftest { .. }
            | Kind::PerftestCrc { .. }
            | Kind::PerftestQ { .. }
            | Kind::VethPerftest { .. } => parse::perftest_bw(out),
            Kind::TcpBw | Kind::TcpBwN { .. } | Kind::VethTcpBw => parse::tcpbench_bw(out),
            Kind::TcpPp | Kind::VethTcpPp => parse::tcpbench_pp(out),
            Kind::Iperf3 => parse::iperf3_json(out),
            Kind::UcxPutBw => parse::ucx_bw(out),
            Kind::UcxAmLat | Kind::UcxTagLat => parse::ucx_lat(out),
            Kind::FiPingpong => parse::fabtests_lat(out),
            Kind::FiRmaBw => parse::fabtests_bw(out),
            Kind::PlacementLag => parse::placement_lag(out).map(|l| l.p99),
            Kind::MpiLat { .. } => parse::mpi_lat(out).map(|l| l.median),
            Kind::MpiBw { .. } => parse::mpi_bw(out),
            Kind::Qperf { test } => parse::qperf_lat(out, test),
        }
    }

    /// Further figures of one run besides [`Probe::parse`]'s (placement lag: p50, p99.9, max),
    /// named; none for the other probes.
    pub fn details(&self, out: &str) -> Details {
        match self.kind {
            Kind::PlacementLag => parse::placement_lag(out)
                .map(|l| vec![("p50", l.p50), ("p99.9", l.p999), ("max", l.max)])
                .unwrap_or_default(),
            Kind::MpiLat { .. } => parse::mpi_lat(out)
                .map(|l| vec![("mean", l.mean), ("p99", l.p99)])
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    /// For a uiw probe on the veth test bed: did the client's streams go over the transport the
    /// probe names? The provider says so at VERBS_LOG_LEVEL 3 ("QP streams go over uiw's TCP
    /// on veth0 (xdp …)" when it opens a raw transport; nothing for the kernel's TCP), so a
    /// row labelled xdp cannot silently measure the kernel's TCP.
    pub fn check_transport(&self, client_stderr: &str) -> Result<(), String> {
        let Kind::VethPerftest { transport, .. } = self.kind else { return Ok(()) };
        let raw = client_stderr.lines().find(|l| l.contains("QP streams go over uiw's TCP on"));
        match (transport, raw) {
            (Transport::Xdp, Some(l)) if l.contains("(xdp") => Ok(()),
            (Transport::Xdp, Some(l)) => Err(format!("not the xdp transport: {}", l.trim())),
            (Transport::Xdp, None) => Err("the provider opened no xdp transport (no \"QP streams go over\" line at VERBS_LOG_LEVEL=3)".into()),
            (Transport::Tcp, Some(l)) => Err(format!("a raw transport was opened on the tcp device: {}", l.trim())),
            (Transport::Tcp, None) => Ok(()),
        }
    }

    /// Does this probe run between the veth test bed's namespaces?
    pub fn on_veth(&self) -> bool {
        matches!(self.kind, Kind::VethPerftest { .. } | Kind::VethTcpBw | Kind::VethTcpPp)
    }

    /// What the figure is, when a cell must say it (the placement lag's p99 beside its
    /// details).
    pub fn figure_name(&self) -> Option<&'static str> {
        match self.kind {
            Kind::PlacementLag => Some("p99"),
            Kind::MpiLat { .. } => Some("median"),
            _ => None,
        }
    }
}

/// The commands of one run of a probe.
#[derive(Debug, Clone)]
pub struct Plan {
    pub server: Option<Cmd>,
    /// The side whose output is parsed.
    pub client: Cmd,
    /// The port the server must be listening on before the client starts.
    pub port: Option<u16>,
    pub timeout: Duration,
    /// When to look at the client's sockets with `ss` (bandwidth runs only:
    /// their connections live long enough).
    pub audit_after: Option<Duration>,
    /// The server prints the figure (a receiver across the veth), not the client.
    pub measured_by_server: bool,
    /// The network namespace the client runs in (for `ss`), when not this one.
    pub client_netns: Option<String>,
}

/// Per-run lengths, from `--quick` or not.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lengths {
    /// Seconds of each bandwidth and TCP ping-pong run.
    pub secs: f64,
    /// Iterations of each latency ping-pong (perftest, UCX, libfabric).
    pub lat_iters: u64,
    /// Bytes a UCX put_bw run moves (iterations = bytes / size; 2 GiB gives
    /// BENCHMARKS.md's 2000-odd iterations at 1 MiB).
    pub ucx_bytes: u64,
}

impl Lengths {
    pub fn normal() -> Self {
        Lengths {
            secs: 3.0,
            lat_iters: 20_000,
            ucx_bytes: 2 << 30,
        }
    }
    pub fn quick() -> Self {
        Lengths {
            secs: 1.0,
            lat_iters: 5_000,
            ucx_bytes: 512 << 20,
        }
    }
}

/// Round trips of an MPI ping-pong run (mpi_check adds 200 untimed ones): half the perftest
/// iterations, as two ranks under mpirun on a loaded machine took 36 s for 20000.
pub fn mpi_lat_iters(len: &Lengths) -> u64 {
    len.lat_iters / 2
}

/// Bytes an MPI streaming run moves: a quarter of UCX put_bw's (512 MiB, or 128 MiB with
/// --quick).
pub fn mpi_bw_bytes(len: &Lengths) -> u64 {
    len.ucx_bytes / 4
}

fn secs_arg(s: f64) -> String {
    crate::stats::trim_float(s)
}

/// UCX put_bw iterations for `size` under `len`: enough bytes to last
/// roughly as long as the other bandwidth runs, within sane bounds.
pub fn ucx_iters(len: &Lengths, size: u64) -> u64 {
    (len.ucx_bytes / size.max(1)).clamp(1_000, 1_000_000)
}

impl Probe {
    /// Builds the commands for this probe (port `port` for the rendezvous).
    /// Err says why the probe cannot run here.
    pub fn plan(&self, ctx: &Ctx, len: &Lengths, port: u16) -> Result<Plan, String> {
        ctx.probe_available(self)?;
        let size = self.size.to_string();
        let p = port.to_string();
        let bw_timeout = Duration::from_secs_f64(len.secs + 30.0);
        let lat_timeout = Duration::from_secs(60);
        let plan = match self.kind {
            Kind::Perftest { prog } | Kind::PerftestCrc { prog } | Kind::PerftestQ { prog, .. } => {
                let mut args: Vec<String> = vec![
                    "-d".into(),
                    ctx.device.clone(),
                    "-x".into(),
                    "0".into(),
                    "-p".into(),
                    p,
                    "-s".into(),
                    size,
                    "-F".into(),
                ];
                if let Kind::PerftestQ { qps, .. } = self.kind {
                    args.extend(["-q".into(), qps.to_string()]);
                }
                let bw = self.metric() == Metric::Bandwidth;
                if bw {
                    args.extend(["-D".into(), secs_arg(len.secs.max(1.0).round())]);
                } else {
                    args.extend(["-n".into(), len.lat_iters.to_string()]);
                }
                let crc = matches!(self.kind, Kind::PerftestCrc { .. });
                // Explicit either way, whatever uiw's default: the rows without `_crc` are uiw
                // without CRC (the CRC row's baseline).
                let with_crc = |c: Cmd| c.env("UIW_CRC", if crc { "1" } else { "0" });
                let server = with_crc(ctx.uiw_cmd(prog, &args)?);
                args.push("127.0.0.1".into());
                let client = with_crc(ctx.uiw_cmd(prog, &args)?);
                Plan {
                    server: Some(server),
                    client,
                    port: Some(port),
                    timeout: if bw { bw_timeout } else { lat_timeout },
                    audit_after: bw.then(|| Duration::from_secs_f64(len.secs / 2.0)),
                    measured_by_server: false,
                    client_netns: None,
                }
            }
            Kind::TcpBw | Kind::TcpBwN { .. } | Kind::TcpPp => {
                let mut c = ctx
                    .cmd(&ctx.tcpbench.display().to_string())
                    .arg(if self.kind == Kind::TcpPp { "pp" } else { "bw" })
                    .args(["-s", &size, "-t", &secs_arg(len.secs), "-p", &p]);
                if let Kind::TcpBwN { streams, one_thread } = self.kind {
                    c = c.args(["-n", &streams.to_string()]);
                    if one_thread {
                        c = c.arg("-1");
                    }
                }
                if self.kind == Kind::TcpPp {
                    c = c.arg("-b");
                }
                Plan {
                    server: None,
                    client: c,
                    port: None,
                    timeout: bw_timeout,
                    audit_after: (self.kind != Kind::TcpPp)
                        .then(|| Duration::from_secs_f64(len.secs / 2.0)),
                    measured_by_server: false,
                    client_netns: None,
                }
            }
            Kind::Iperf3 => Plan {
                server: Some(
                    ctx.cmd("iperf3")
                        .args(["-s", "-B", "127.0.0.1", "-1", "-p", &p]),
                ),
                client: ctx.cmd("iperf3").args([
                    "-c",
                    "127.0.0.1",
                    "-p",
                    &p,
                    "-t",
                    &secs_arg(len.secs.max(1.0).round()),
                    "-l",
                    &size,
                    "-J",
                ]),
                port: Some(port),
                timeout: bw_timeout,
                audit_after: Some(Duration::from_secs_f64(len.secs / 2.0)),
                measured_by_server: false,
                client_netns: None,
            },
            Kind::UcxPutBw | Kind::UcxAmLat => {
                let (test, iters, extra): (&str, u64, &[&str]) = if self.kind == Kind::UcxPutBw {
                    ("put_bw", ucx_iters(len, self.size), &["-D", "zcopy"])
                } else {
                    ("am_lat", len.lat_iters * 2, &[])
                };
                Plan {
                    server: Some(ctx.cmd("ucx_perftest").args(["-p", &p])),
                    client: ctx
                        .cmd("ucx_perftest")
                        .args(["127.0.0.1", "-p", &p, "-t", test, "-x", "tcp", "-d", "lo"])
                        .args(extra.iter().copied())
                        .args(["-s", &size, "-n", &iters.to_string()]),
                    port: Some(port),
                    // UCX's tcp put_bw stalls for milliseconds at a time on a busy
                    // 2-vCPU machine: give it room rather than a timeout.
                    timeout: if self.kind == Kind::UcxPutBw {
                        Duration::from_secs(120)
                    } else {
                        lat_timeout
                    },
                    audit_after: (self.kind == Kind::UcxPutBw).then(|| Duration::from_millis(300)),
                    measured_by_server: false,
                    client_netns: None,
                }
            }
            Kind::UcxTagLat => {
                let env = |c: Cmd| c.env("UCX_TLS", "tcp").env("UCX_NET_DEVICES", "lo");
                Plan {
                    server: Some(env(ctx.cmd("ucx_perftest")).args(["-p", &p])),
                    client: env(ctx.cmd("ucx_perftest")).args([
                        "127.0.0.1",
                        "-p",
                        &p,
                        "-t",
                        "tag_lat",
                        "-s",
                        &size,
                        "-n",
                        &(len.lat_iters * 2).to_string(),
                    ]),
                    port: Some(port),
                    timeout: lat_timeout,
                    audit_after: None,
                    measured_by_server: false,
                    client_netns: None,
                }
            }
            Kind::PlacementLag => {
                let exe = ctx.placement_lag.display().to_string();
                let args: Vec<String> = vec![
                    "-d".into(),
                    ctx.device.clone(),
                    "-n".into(),
                    len.lat_iters.to_string(),
                    "-s".into(),
                    size,
                    "-q".into(),
                ];
                Plan {
                    server: None,
                    client: ctx.uiw_cmd(&exe, &args)?,
                    port: None,
                    // Each write gives up after 1 s (the program's -t): a run of stalls ends
                    // well within this.
                    timeout: lat_timeout,
                    audit_after: None,
                    measured_by_server: false,
                    client_netns: None,
                }
            }
            Kind::VethPerftest { prog, transport } => {
                let bed = ctx.veth.as_ref().map_err(Clone::clone)?;
                let uiw = ctx.uiw.as_ref().map_err(Clone::clone)?;
                let mut args: Vec<String> = vec![
                    "-d".into(),
                    bed.dev.clone(),
                    "-x".into(),
                    "0".into(),
                    "-p".into(),
                    p,
                    "-s".into(),
                    size,
                    "-F".into(),
                ];
                let bw = self.metric() == Metric::Bandwidth;
                if bw {
                    args.extend(["-D".into(), secs_arg(len.secs.max(1.0).round())]);
                } else {
                    args.extend(["-n".into(), len.lat_iters.to_string()]);
                }
                let on = |h: Host, args: &[String]| {
                    let c = ctx.cmd(&uiw.display().to_string()).args(["run", "--", prog]).args(args.iter().cloned());
                    bed.on(h, c)
                        .env("UIW_STATE_DIR", bed.state(h, transport).display().to_string())
                        .env("VERBS_LOG_LEVEL", "3")
                };
                let server = on(Host::B, &args);
                args.push(bed.addr_b.clone());
                Plan {
                    server: Some(server),
                    client: on(Host::A, &args),
                    port: Some(port),
                    timeout: if bw { bw_timeout } else { lat_timeout },
                    audit_after: bw.then(|| Duration::from_secs_f64(len.secs / 2.0)),
                    measured_by_server: false,
                    client_netns: Some(bed.ns(Host::A)),
                }
            }
            Kind::VethTcpBw | Kind::VethTcpPp => {
                let bed = ctx.veth.as_ref().map_err(Clone::clone)?;
                let bw = self.kind == Kind::VethTcpBw;
                let half = |h: Host, role: &str| {
                    let mut c = ctx
                        .cmd(&ctx.tcpbench.display().to_string())
                        .arg(if bw { "bw" } else { "pp" })
                        .args(["-s", &size, "-t", &secs_arg(len.secs), "-p", &p, "-a", &bed.addr_b, role]);
                    if !bw {
                        c = c.arg("-b");
                    }
                    bed.on(h, c)
                };
                Plan {
                    server: Some(half(Host::B, "-l")),
                    client: half(Host::A, "-c"),
                    port: Some(port),
                    timeout: bw_timeout,
                    audit_after: bw.then(|| Duration::from_secs_f64(len.secs / 2.0)),
                    measured_by_server: bw,
                    client_netns: Some(bed.ns(Host::A)),
                }
            }
            Kind::MpiLat { fabric } | Kind::MpiBw { fabric } => {
                let args = if let Kind::MpiLat { .. } = self.kind {
                    vec!["lat".to_string(), size, mpi_lat_iters(len).to_string()]
                } else {
                    vec!["bw".to_string(), size, mpi_bw_bytes(len).to_string()]
                };
                Plan {
                    server: None,
                    client: ctx.mpi_cmd(fabric, &args)?,
                    port: None,
                    // mpirun's start-up and a loaded machine's stalls (a tcp ping-pong's mean
                    // reached 840 µs at load 13: 10000 round trips in 17 s).
                    timeout: Duration::from_secs(180),
                    audit_after: None,
                    measured_by_server: false,
                    client_netns: None,
                }
            }
            Kind::Qperf { test } => {
                let rc = !test.starts_with("tcp_");
                let secs = secs_arg(len.secs.max(1.0).round());
                let qperf = |c: Cmd| c.args(["-lp", &p]);
                let mut client = vec!["-lp".to_string(), p.clone()];
                if rc {
                    client.extend(["-cm".into(), "1".into()]);
                }
                client.extend(
                    ["-m", &size, "-t", &secs, "127.0.0.1", test, "quit"].map(String::from),
                );
                let (server, client) = if rc {
                    (
                        ctx.uiw_cmd("qperf", &["-lp".into(), p.clone()])?,
                        ctx.uiw_cmd("qperf", &client)?,
                    )
                } else {
                    (qperf(ctx.cmd("qperf")), ctx.cmd("qperf").args(client))
                };
                Plan {
                    server: Some(server),
                    client,
                    port: Some(port),
                    timeout: lat_timeout,
                    audit_after: None,
                    measured_by_server: false,
                    client_netns: None,
                }
            }
            Kind::FiPingpong | Kind::FiRmaBw => {
                let (prog, extra, iters): (&str, &[&str], u64) = if self.kind == Kind::FiPingpong {
                    ("fi_pingpong", &[], len.lat_iters * 2)
                } else {
                    ("fi_rma_bw", &["-o", "write"], ucx_iters(len, self.size))
                };
                let base = |c: Cmd| {
                    c.env("FI_TCP_NODELAY", "1")
                        .args([
                            "-p",
                            "tcp",
                            "-e",
                            "msg",
                            "-S",
                            &size,
                            "-I",
                            &iters.to_string(),
                        ])
                        .args(extra.iter().copied())
                };
                Plan {
                    server: Some(base(ctx.cmd(prog)).args(["-B", &p])),
                    client: base(ctx.cmd(prog)).args(["-P", &p, "127.0.0.1"]),
                    port: Some(port),
                    timeout: if self.kind == Kind::FiPingpong {
                        lat_timeout
                    } else {
                        bw_timeout
                    },
                    audit_after: None,
                    measured_by_server: false,
                    client_netns: None,
                }
            }
        };
        Ok(plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_ids() {
        assert_eq!(size_label(65536), "64 KiB");
        assert_eq!(size_label(1 << 20), "1 MiB");
        assert_eq!(size_label(8), "8 B");
        assert_eq!(size_label(1536), "1536 B");
        let p = Probe::new(
            Kind::Perftest {
                prog: "ib_write_bw",
            },
            65536,
        );
        assert_eq!(p.id(), "uiw.ib_write_bw.65536");
        assert_eq!(p.metric(), Metric::Bandwidth);
        assert_eq!(p.side(), "requester");
        let p = Probe::new(
            Kind::Perftest {
                prog: "ib_read_lat",
            },
            8,
        );
        assert_eq!(p.metric(), Metric::Latency);
        assert_eq!(p.side(), "requester, full read round trip");
        assert_eq!(Probe::new(Kind::TcpBw, 8).side(), "receiver");
        assert_eq!(Probe::new(Kind::UcxPutBw, 8).side(), "initiator");
    }

    #[test]
    fn veth_probes_check_their_transport() {
        let p = |t| Probe::new(Kind::VethPerftest { prog: "ib_write_bw", transport: t }, 64);
        let xdp = "uiw: uiw_veth0: QP streams go over uiw's TCP on veth0 (xdp, copy mode), port 4791\n";
        let packet = "uiw: uiw_veth0: QP streams go over uiw's TCP on veth0 (packet), port 4791\n";
        assert_eq!(p(Transport::Xdp).check_transport(xdp), Ok(()));
        assert!(p(Transport::Xdp).check_transport("").unwrap_err().contains("no xdp transport"));
        assert!(p(Transport::Xdp).check_transport(packet).unwrap_err().contains("not the xdp"));
        assert_eq!(p(Transport::Tcp).check_transport("something else\n"), Ok(()));
        assert!(p(Transport::Tcp).check_transport(xdp).is_err());
        assert_eq!(Probe::new(Kind::VethTcpBw, 64).check_transport(""), Ok(()));
        assert_eq!(p(Transport::Xdp).id(), "veth.uiw_xdp.ib_write_bw.64");
        assert_eq!(p(Transport::Tcp).stack(), "uiw-tcp");
        assert_eq!(Probe::new(Kind::VethTcpBw, 64).side(), "receiver");
        assert_eq!(Probe::new(Kind::VethTcpPp, 8).metric(), Metric::Latency);
    }

    #[test]
    fn app_probes() {
        let m = Probe::new(Kind::MpiLat { fabric: Fabric::UiwVerbs }, 8);
        assert_eq!(m.id(), "uiw.mpi_lat_verbs_ofi_rxm.8");
        assert_eq!((m.stack(), m.metric(), m.tool()), ("uiw", Metric::Latency, "mpi_check"));
        let t = Probe::new(Kind::MpiBw { fabric: Fabric::Tcp }, 1 << 20);
        assert_eq!(t.id(), "libfabric.mpi_bw_tcp.1048576");
        assert_eq!((t.stack(), t.metric()), ("libfabric", Metric::Bandwidth));
        assert_eq!(t.label(), "Open MPI stream 1 MiB over libfabric tcp (mpi_check)");
        let o = Probe::new(Kind::MpiLat { fabric: Fabric::Ob1Tcp }, 8);
        assert_eq!((o.id().as_str(), o.stack()), ("tcp.mpi_lat_ob1_btl_tcp.8", "TCP"));
        let q = Probe::new(Kind::Qperf { test: "rc_rdma_write_poll_lat" }, 8);
        assert_eq!(q.id(), "uiw.qperf_rc_rdma_write_poll_lat.8");
        assert_eq!(q.label(), "uiw qperf -cm 1 rc_rdma_write_poll_lat 8 B");
        let q = Probe::new(Kind::Qperf { test: "tcp_lat" }, 8);
        assert_eq!((q.id().as_str(), q.stack()), ("tcp.qperf_tcp_lat.8", "TCP"));
        let out = include_str!("../fixtures/mpi_check_lat_8.txt");
        let m = Probe::new(Kind::MpiLat { fabric: Fabric::Tcp }, 8);
        assert_eq!(m.parse(out), Ok(7.481));
        assert_eq!(m.details(out), vec![("mean", 19.181), ("p99", 21.547)]);
        assert_eq!(mpi_lat_iters(&Lengths::normal()), 10_000);
        assert_eq!(mpi_bw_bytes(&Lengths::normal()), 512 << 20);
    }

    #[test]
    fn ucx_iterations_are_bounded() {
        let l = Lengths::normal();
        assert_eq!(ucx_iters(&l, 1 << 20), 2048);
        assert_eq!(ucx_iters(&l, 2), 1_000_000);
        assert_eq!(ucx_iters(&l, 8 << 30), 1_000);
    }
}
