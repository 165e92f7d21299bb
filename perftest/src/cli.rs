//! Command-line options and the manual page (`--help`).

use std::path::PathBuf;

pub const HELP: &str = "\
NAME
    uiw-bench - perftest over uiw against raw TCP, UCX and libfabric, same run, same congestion control

SYNOPSIS
    uiw-bench [--quick] [--reps N] [--out DIR] [--cc NAME] [--only ROW[,ROW...]]...
              [--no-sweep] [--no-install] [--uiw PATH] [--device NAME]
    uiw-bench --list
    uiw-bench --help

DESCRIPTION
    Runs perftest (ib_write_bw, ib_write_lat, ib_send_lat, ib_read_bw, ib_send_bw,
    ib_read_lat) on the uiw device through `uiw run`, and beside it, in the same run,
    the peers it is measured against: raw single-stream TCP (tcpbench bw, and iperf3),
    TCP ping-pong with both sides busy-polling (tcpbench pp -b), UCX over tcp
    (ucx_perftest put_bw zcopy, am_lat, tag_lat) and libfabric's tcp provider
    (fi_pingpong; fi_rma_bw where installed).
    Applications, each against the same application over TCP in the same run: two Open
    MPI ranks of perftest/mpi/mpi_check.c (built with mpicc) over libfabric's
    `verbs;ofi_rxm` on uiw against `FI_PROVIDER=tcp`, and qperf's RC latency tests with
    rdma_cm (`-cm 1`) against qperf's own tcp_lat. The qperf rows are part of every
    run; the MPI rows are opt-in (name them in --only).
    One probe has no peer: placement_lag (built from examples/c/placement_lag.c, with
    gcc and libibverbs-dev) measures, in one process, how long after an RDMA Write's
    completion its data is visible at a target nobody polls, judged against issue 9's
    absolute bound.

    Every probe runs N times, interleaved: repetition 1 runs every probe once, uiw and
    its peers alternating, then repetition 2, and so on. The table shows medians with
    min-max, the ratio uiw/peer of the medians, the ratio within each repetition, and
    the issue's targets as pass/miss (judged on the ratio of the medians):
        ib_write_bw 64 KiB and 1 MiB  >= 0.9 x raw single-stream TCP, > UCX put_bw
        ib_write_lat, ib_send_lat 8 B <= 1.2 x TCP busy-poll half round trip,
                                      <  UCX am_lat, < libfabric fi_pingpong
        placement_lag 8 B and 4 KiB   p99 <= 100 us (issue 9: 'well under 100 us')
        veth_write_lat (xdp)          <  uiw's kernel-TCP transport (issue 12)
        veth_write_bw_64 (xdp)        >  uiw's kernel-TCP transport (message rate)
        veth_write_bw_64k, _1m (xdp)  >= uiw's kernel-TCP transport
        mpi_lat_8                     <  Open MPI over libfabric tcp
        mpi_bw_64k, mpi_bw_1m         >= Open MPI over libfabric tcp
        qperf_rc_lat, qperf_rc_rdma_write_poll_lat   < qperf tcp_lat
    The other rows are informational.

    Two groups of rows are opt-in, left out of a run without --only: the veth rows
    (`--only veth`, or some of their names) and the MPI rows (`--only mpi_lat_8,...`).
    --list marks them `(opt-in)`.

    The veth rows (issue 12) set up, once per run, two network namespaces joined by
    veths and a bridge (ci/testbed.sh, embedded: MTU 1500, the veths' offloads off, as uiw's
    userspace TCP needs) and publish uiw_veth0 in each twice: with `--transport xdp`
    (AF_XDP, uiw's userspace TCP) and with `--transport tcp` (the kernel's TCP), each in
    its own state dir. Each repetition then runs, client in one namespace, server in the
    other: perftest over the xdp devices, perftest over the kernel-TCP devices, and raw
    kernel TCP (tcpbench -l/-c) between the same namespaces under the same congestion
    control. The ratios are xdp / kernel-TCP transport and xdp / raw TCP. Every xdp run
    is checked to have opened the xdp transport (the provider's VERBS_LOG_LEVEL=3 line),
    every kernel-TCP run to have opened none. Without root, ip/nft/ethtool or AF_XDP the
    rows say `unavailable: <reason>`. The test bed is torn down at the end of the run.

    Every program, uiw's runs included, gets the same TCP congestion control: the
    benchmark builds cc_preload.so and LD_PRELOADs it, so the program's own sockets
    (and uiw's, which live in the program's process) are set with TCP_CONGESTION.
    Before measuring, cc_check verifies this on a fresh socket, plain and under
    `uiw run`; during bandwidth runs `ss` reads the congestion control of the
    client's live sockets, and the table header reports what it saw.

    Then a message-size sweep, 2 B ... 8 MiB in powers of two, one pass: ib_write_bw -a,
    ib_write_lat -a and ib_send_lat -a over uiw, tcpbench bw and pp -b at each size, and
    UCX put_bw / tag_lat at each size (not with --quick). Drawn as two SVG charts.

    A probe that fails shows `failed: <reason>` in its cell; a peer whose tool is not
    installed shows `unavailable: <reason>`. Nothing aborts the run once measuring
    started; each program has a deadline after which its process group is killed.

    Root is needed to publish the device (`uiw up`), for the veth rows' test bed and
    the MPI rows' namespace, to set a congestion control not in
    net.ipv4.tcp_allowed_congestion_control (cubic here), and to install missing
    packages (apt-get install -y perftest ucx-utils libfabric-bin iperf3 qperf; the MPI
    rows' openmpi-bin libopenmpi-dev are not installed for you).

OPTIONS
    --quick        1 repetition, 1-second bandwidth runs, fewer latency iterations, a
                   shorter sweep without UCX. A smoke test: do not quote its numbers.
    --reps N       repetitions per probe (default 3).
    --out DIR      results directory (default ./uiw-bench-results). Created if missing;
                   files in it are overwritten.
    --cc NAME      TCP congestion control for every row (default cubic, if the kernel
                   has it, else the system default).
    --only ROW     run only these rows (comma-separated or repeated). `sweep` selects
                   the sweep, `veth` the four veth rows. Without --only: every row but
                   the opt-in ones (veth_*, mpi_*), and the sweep. See --list.
    --no-sweep     skip the message-size sweep.
    --no-install   do not apt-get install missing peer packages.
    --uiw PATH     the uiw binary (default: beside uiw-bench, then PATH).
    --device NAME  the uiw device (default uiw_lo).
    --list         print the rows and their peers, then exit.
    -h, --help     this text.

ROWS
    write_bw_64k write_bw_1m   ib_write_bw -s SIZE -D secs, requester side
    write_bw_1m_crc            ib_write_bw 1 MiB with MPA CRC32c requested (UIW_CRC=1 on
                               both sides) against the same without: CRC's cost. Every
                               other uiw row and the sweep run with UIW_CRC=0.
    write_bw_64                ib_write_bw -s 64: message rate against 64-byte TCP writes
    write_bw_64_q4             ib_write_bw -s 64 -q 4 against four such TCP streams
    write_bw_64k_q2            ib_write_bw -s 65536 -q 2 against two TCP streams, and
                               (information) the same two streams served by one thread
                               per side, as perftest and uiw serve its two QPs
    write_lat send_lat         ib_write_lat / ib_send_lat -s 8 -n iters, t_typical
                               (median) of the half round trip
    read_bw_64k read_bw_1m     ib_read_bw, informational
    send_bw_64k send_bw_1m     ib_send_bw, informational
    read_lat                   ib_read_lat 8 B: a full read round trip, compared with
                               the peers' half round trips x 2 (target: <= 1.2x, i.e.
                               2.4x the TCP half round trip)
    placement_lag placement_lag_4k
                               placement_lag -s 8 / -s 4096 -n iters (examples/c/
                               placement_lag.c) under `uiw run`: in one process, the
                               time from an RDMA Write's completion at the initiator to
                               its data being visible at a passive target (its CQ never
                               polled); p99 of each run, with p50, p99.9 and max beside
                               it. No peer: judged against issue 9's bound, p99 <= 100 us
    veth_write_lat             ib_write_lat -s 8 across the veth pair: xdp transport vs
                               kernel-TCP transport vs raw TCP busy-poll ping-pong
                               (tcpbench pp -b, half round trip)
    veth_write_bw_64           ib_write_bw -s 64 across the veth pair (message rate): xdp
                               vs kernel-TCP transport vs raw TCP 64-byte send()s
    veth_write_bw_64k veth_write_bw_1m
                               ib_write_bw -s 64K / 1M across the veth pair: xdp vs
                               kernel-TCP transport vs raw single-stream TCP (receiver)
    veth                       all four veth rows (opt-in: not part of a run without
                               --only; need root)
    mpi_lat_8 mpi_bw_64k mpi_bw_1m
                               opt-in (only with --only: they need Open MPI, which is not
                               installed for you, and make a network namespace; about 30 s
                               per repetition).
                               Two Open MPI ranks (mpirun --mca pml cm --mca mtl ofi) of
                               mpi_check `lat 8 ITERS` (ping-pong, median half round trip;
                               mean and p99 beside it) or `bw SIZE BYTES` (64 messages in
                               flight, timed at rank 0 until rank 1's acknowledgement),
                               every message (lat) or a window after the timed ones (bw)
                               checked. uiw: `uiw run -- mpirun ... -x
                               FI_PROVIDER=verbs;ofi_rxm` (uiw run sets
                               FI_OFI_RXM_SAR_LIMIT=16384: rxm's rendezvous above
                               16 KiB); peer: the same with FI_PROVIDER=tcp
                               FI_TCP_NODELAY=1 (libfabric's defaults); and, informational, Open
                               MPI's own TCP (--mca pml ob1 --mca btl self,tcp). All in a
                               network namespace of the run's own (uiw-bench-PID: a veth,
                               v0 10.77.0.1/24, uiw_v0 published there from
                               DIR/mpi-state), as libfabric 1.17's verbs provider skips
                               loopback netdevs. Needs root, openmpi-bin,
                               libopenmpi-dev (mpicc) and iproute2; else `unavailable`
    qperf_rc_lat qperf_rc_rdma_write_poll_lat
                               qperf -cm 1 -m 8 -t secs 127.0.0.1 rc_lat (or
                               rc_rdma_write_poll_lat) quit, server and client under
                               `uiw run`, against qperf -m 8 tcp_lat (plain TCP, run once
                               per repetition for both rows). qperf's latency is half the
                               round trip. Needs qperf (Debian package qperf) and uiw
    sweep                      the size sweep

UNITS
    Bandwidth in GB/s = 10^9 bytes/s. perftest prints MB/sec with MB = 2^20 bytes and
    ucx_perftest MB/s likewise: both are converted. tcpbench and iperf3 measure at the
    receiver, perftest and ucx_perftest at the requester/initiator; the table says which.
    Latency in microseconds: half a round trip (perftest write/send_lat, tcpbench pp,
    ucx am_lat/tag_lat, fi_pingpong usec/xfer), except ib_read_lat.

OUTPUT
    DIR/results.md     the table, the setup, the exact commands
    DIR/results.csv    every repetition of every probe (value or failure reason)
    DIR/results.json   all of it, with medians, ratios and verdicts
    DIR/sweep.csv      the sweep's points
    DIR/bandwidth.svg, DIR/latency.svg   the sweep's charts (and .png when
                       rsvg-convert is installed: Debian librsvg2-bin)
    DIR/logs/          stdout/stderr of every program run
    DIR/bin/           the compiled helpers (tcpbench, cc_preload.so, cc_check,
                       placement_lag, mpi_check)
    DIR/mpi-state/     the MPI rows' uiw state directory (uiw_v0)

ENVIRONMENT
    UIW_STATE_DIR      passed through to `uiw up` and `uiw run` (the uiw state dir); the
                       veth rows use their own, under /tmp/PREFIX-testbed
    UIW_TESTBED_PREFIX the veth test bed's name (namespaces PREFIX-a, PREFIX-b; default
                       uwb<pid>)
    LD_PRELOAD         kept, after cc_preload.so
    PATH               where the peer tools are looked up

EXIT STATUS
    0 the benchmark ran (cells may still say failed/unavailable); 1 setup failed
    (gcc missing, congestion control not settable, output dir not writable);
    2 usage error.

EXAMPLES
    cargo run -p uiw-perftest --release -- --quick --no-sweep
    cargo run -p uiw-perftest --release -- --reps 5 --out /tmp/bench
    UIW_STATE_DIR=/tmp/uiw-bench-state target/release/uiw-bench --only write_lat,send_lat
    target/release/uiw-bench --only veth --reps 3 --out results/veth     # as root
    target/release/uiw-bench --no-sweep --only mpi_lat_8,mpi_bw_64k,mpi_bw_1m   # as root

CAVEATS
    Loopback on a small shared VM: both ends share the vCPUs and neighbours steal
    time. Only figures from the same run are comparable; read the min-max spread
    before the medians. The targets are judged on medians.
";

#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub quick: bool,
    pub reps: usize,
    pub out: PathBuf,
    pub cc: Option<String>,
    pub only: Vec<String>,
    pub sweep: bool,
    pub install: bool,
    pub uiw: Option<PathBuf>,
    pub device: String,
    pub list: bool,
    pub help: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            quick: false,
            reps: 3,
            out: PathBuf::from("uiw-bench-results"),
            cc: None,
            only: Vec::new(),
            sweep: true,
            install: true,
            uiw: None,
            device: "uiw_lo".into(),
            list: false,
            help: false,
        }
    }
}

/// Parses the arguments after the program name.
pub fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options::default();
    let mut reps_given = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        let mut value = |name: &str| -> Result<String, String> {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or_else(|| format!("{name} needs a value (see --help)"))
        };
        match flag {
            "-h" | "--help" => o.help = true,
            "--list" => o.list = true,
            "--quick" => o.quick = true,
            "--no-sweep" => o.sweep = false,
            "--no-install" => o.install = false,
            "--reps" => {
                let v = value("--reps")?;
                o.reps = v
                    .parse()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| format!("--reps {v}: want a whole number ≥ 1"))?;
                reps_given = true;
            }
            "--out" => o.out = PathBuf::from(value("--out")?),
            "--cc" => o.cc = Some(value("--cc")?),
            "--only" => {
                let v = value("--only")?;
                o.only.extend(
                    v.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(String::from),
                );
            }
            "--uiw" => o.uiw = Some(PathBuf::from(value("--uiw")?)),
            "--device" => o.device = value("--device")?,
            other => return Err(format!("unknown argument {other:?} (see --help)")),
        }
    }
    if o.quick && !reps_given {
        o.reps = 1;
    }
    if !o.only.is_empty() {
        o.sweep = o.sweep && o.only.iter().any(|r| r == "sweep");
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(a: &[&str]) -> Result<Options, String> {
        parse(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn defaults_and_flags() {
        assert_eq!(p(&[]).unwrap(), Options::default());
        let o = p(&[
            "--quick",
            "--out",
            "/tmp/x",
            "--cc=reno",
            "--only",
            "write_lat,send_lat",
            "--only",
            "sweep",
        ])
        .unwrap();
        assert_eq!(o.reps, 1);
        assert_eq!(o.out, PathBuf::from("/tmp/x"));
        assert_eq!(o.cc.as_deref(), Some("reno"));
        assert_eq!(o.only, ["write_lat", "send_lat", "sweep"]);
        assert!(o.sweep);
        let o = p(&["--quick", "--reps", "2", "--only", "write_lat"]).unwrap();
        assert_eq!(o.reps, 2);
        assert!(!o.sweep, "--only without sweep skips it");
    }

    #[test]
    fn errors() {
        assert!(p(&["--reps", "0"]).unwrap_err().contains("--reps 0"));
        assert!(p(&["--reps"]).unwrap_err().contains("needs a value"));
        assert!(p(&["--bogus"]).unwrap_err().contains("unknown argument"));
    }

    #[test]
    fn help_names_every_option() {
        for f in [
            "--quick",
            "--reps",
            "--out",
            "--cc",
            "--only",
            "--no-sweep",
            "--no-install",
            "--uiw",
            "--device",
            "--list",
        ] {
            assert!(HELP.contains(f), "{f} undocumented");
        }
        for r in crate::rows::all() {
            assert!(HELP.contains(&r.name), "row {} undocumented", r.name);
        }
        assert!(HELP.contains("--only veth"));
    }
}
