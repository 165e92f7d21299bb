//! The measurements: one program (or server/client pair) at one size, what
//! it measures, on which side, and the exact command lines.

use crate::parse;
use crate::proc::Cmd;
use crate::setup::Ctx;
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
    /// `tcpbench bw -n STREAMS`: that many TCP streams at once, summed at the receivers.
    TcpBwN {
        streams: u32,
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
}

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
            Kind::TcpBwN { streams } => return format!("tcp.bw_{streams}streams.{}", self.size),
            Kind::TcpBw => "tcp.bw",
            Kind::TcpPp => "tcp.pp_busy",
            Kind::Iperf3 => "tcp.iperf3",
            Kind::UcxPutBw => "ucx.put_bw_zcopy",
            Kind::UcxAmLat => "ucx.am_lat",
            Kind::UcxTagLat => "ucx.tag_lat",
            Kind::FiPingpong => "libfabric.fi_pingpong",
            Kind::FiRmaBw => "libfabric.fi_rma_bw_write",
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
            Kind::TcpBwN { streams } => format!("TCP {streams} streams {s} (tcpbench bw -n {streams})"),
            Kind::TcpBw => format!("TCP single stream {s} (tcpbench bw)"),
            Kind::TcpPp => format!("TCP busy-poll ping-pong {s} (tcpbench pp -b)"),
            Kind::Iperf3 => format!("TCP iperf3 -l {s}"),
            Kind::UcxPutBw => format!("UCX UCT tcp put_bw zcopy {s}"),
            Kind::UcxAmLat => format!("UCX UCT tcp am_lat {s}"),
            Kind::UcxTagLat => format!("UCX UCP tag_lat {s} (UCX_TLS=tcp)"),
            Kind::FiPingpong => format!("libfabric tcp fi_pingpong {s}"),
            Kind::FiRmaBw => format!("libfabric tcp fi_rma_bw write {s}"),
        }
    }

    /// The software stack, for the table's peer column and the charts.
    pub fn stack(&self) -> &'static str {
        match self.kind {
            Kind::Perftest { .. } | Kind::PerftestCrc { .. } | Kind::PerftestQ { .. } => "uiw",
            Kind::TcpBw | Kind::TcpBwN { .. } | Kind::TcpPp | Kind::Iperf3 => "TCP",
            Kind::UcxPutBw | Kind::UcxAmLat | Kind::UcxTagLat => "UCX",
            Kind::FiPingpong | Kind::FiRmaBw => "libfabric",
        }
    }

    pub fn metric(&self) -> Metric {
        match self.kind {
            Kind::Perftest { prog } if prog.ends_with("_lat") => Metric::Latency,
            Kind::Perftest { .. } | Kind::PerftestCrc { .. } | Kind::PerftestQ { .. } => Metric::Bandwidth,
            Kind::TcpBw | Kind::TcpBwN { .. } | Kind::Iperf3 | Kind::UcxPutBw | Kind::FiRmaBw => Metric::Bandwidth,
            Kind::TcpPp | Kind::UcxAmLat | Kind::UcxTagLat | Kind::FiPingpong => Metric::Latency,
        }
    }

    /// Which side's clock the figure comes from.
    pub fn side(&self) -> &'static str {
        match self.kind {
            Kind::Perftest {
                prog: "ib_read_lat",
            } => "requester, full read round trip",
            Kind::Perftest { .. } if self.metric() == Metric::Latency => {
                "requester, half round trip"
            }
            Kind::Perftest { .. } | Kind::PerftestCrc { .. } | Kind::PerftestQ { .. } => "requester",
            Kind::TcpBw | Kind::TcpBwN { .. } | Kind::Iperf3 => "receiver",
            Kind::UcxPutBw | Kind::FiRmaBw => "initiator",
            Kind::TcpPp | Kind::UcxAmLat | Kind::UcxTagLat | Kind::FiPingpong => {
                "client, half round trip"
            }
        }
    }

    /// The program that must exist on PATH (or be built) for this probe.
    pub fn tool(&self) -> &'static str {
        match self.kind {
            Kind::Perftest { prog } | Kind::PerftestCrc { prog } | Kind::PerftestQ { prog, .. } => prog,
            Kind::TcpBw | Kind::TcpBwN { .. } | Kind::TcpPp => "tcpbench",
            Kind::Iperf3 => "iperf3",
            Kind::UcxPutBw | Kind::UcxAmLat | Kind::UcxTagLat => "ucx_perftest",
            Kind::FiPingpong => "fi_pingpong",
            Kind::FiRmaBw => "fi_rma_bw",
        }
    }

    pub fn parse(&self, out: &str) -> Result<f64, String> {
        match self.kind {
            Kind::Perftest { .. } if self.metric() == Metric::Latency => parse::perftest_lat(out),
            Kind::Perftest { .. } | Kind::PerftestCrc { .. } | Kind::PerftestQ { .. } => parse::perftest_bw(out),
            Kind::TcpBw | Kind::TcpBwN { .. } => parse::tcpbench_bw(out),
            Kind::TcpPp => parse::tcpbench_pp(out),
            Kind::Iperf3 => parse::iperf3_json(out),
            Kind::UcxPutBw => parse::ucx_bw(out),
            Kind::UcxAmLat | Kind::UcxTagLat => parse::ucx_lat(out),
            Kind::FiPingpong => parse::fabtests_lat(out),
            Kind::FiRmaBw => parse::fabtests_bw(out),
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
        ctx.available(self.tool())?;
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
                }
            }
            Kind::TcpBw | Kind::TcpBwN { .. } | Kind::TcpPp => {
                let mut c = ctx
                    .cmd(&ctx.tcpbench.display().to_string())
                    .arg(if self.kind == Kind::TcpPp { "pp" } else { "bw" })
                    .args(["-s", &size, "-t", &secs_arg(len.secs), "-p", &p]);
                if let Kind::TcpBwN { streams } = self.kind {
                    c = c.args(["-n", &streams.to_string()]);
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
    fn ucx_iterations_are_bounded() {
        let l = Lengths::normal();
        assert_eq!(ucx_iters(&l, 1 << 20), 2048);
        assert_eq!(ucx_iters(&l, 2), 1_000_000);
        assert_eq!(ucx_iters(&l, 8 << 30), 1_000);
    }
}
