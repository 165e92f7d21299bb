//! Everything before the first measurement: the C helpers compiled with
//! gcc, the congestion control checked to really reach the programs'
//! sockets, missing peer packages installed, `uiw up`, the machine
//! described.

use crate::probes::{Fabric, Probe};
use crate::proc::{run_capture, Cmd};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

const TCPBENCH_C: &str = include_str!("../c/tcpbench.c");
const CC_PRELOAD_C: &str = include_str!("../c/cc_preload.c");
const CC_CHECK_C: &str = include_str!("../c/cc_check.c");
/// The placement-lag probe: one of the example programs (its behaviour is tested there, by
/// examples/tests/placement_lag.rs), built here against the installed libibverbs.
const PLACEMENT_LAG_C: &str = include_str!("../../examples/c/placement_lag.c");
/// The two-host test bed of the veth rows (two network namespaces, veths to a bridge): the
/// repository's own script, written out beside the helpers so the binary needs no checkout.
const TESTBED_SH: &str = include_str!("../../ci/testbed.sh");
/// The MPI rows' program (ping-pong, streaming, allreduce, every byte checked); CI runs its
/// full check over uiw (rdmacm/tests/apps.rs).
const MPI_CHECK_C: &str = include_str!("../mpi/mpi_check.c");

/// Debian packages providing the peer tools.
pub const PACKAGES: &[(&str, &str)] = &[
    ("ib_write_bw", "perftest"),
    ("ucx_perftest", "ucx-utils"),
    ("fi_pingpong", "libfabric-bin"),
    ("iperf3", "iperf3"),
    ("qperf", "qperf"),
];

/// What every probe needs to build its commands.
#[derive(Debug)]
pub struct Ctx {
    pub cc: String,
    /// The kernel's available congestion controls (for reading `ss`).
    pub known_cc: Vec<String>,
    pub preload: PathBuf,
    pub tcpbench: PathBuf,
    /// The placement-lag probe ([`build_placement_lag`]; whether it built is in `tools`).
    pub placement_lag: PathBuf,
    /// The `uiw` binary, or why uiw rows cannot run.
    pub uiw: Result<PathBuf, String>,
    pub device: String,
    /// Tool name → available, or why not.
    pub tools: BTreeMap<String, Result<(), String>>,
    pub logs: PathBuf,
    /// The veth test bed (set up only when a veth row is selected), or why it is not there.
    pub veth: Result<VethBed, String>,
    /// The MPI rows' namespace and device, when they are selected and could be set up
    /// (why not is in `tools["mpi_check"]`).
    pub mpi: Option<MpiNet>,
}

impl Ctx {
    /// A command for a peer program, under the congestion-control preload.
    pub fn cmd(&self, program: &str) -> Cmd {
        let mut preload = self.preload.display().to_string();
        if let Ok(old) = std::env::var("LD_PRELOAD") {
            if !old.is_empty() {
                preload = format!("{preload}:{old}");
            }
        }
        Cmd::new(program)
            .env("LD_PRELOAD", preload)
            .env("BENCH_TCPCC", self.cc.clone())
    }

    /// `uiw run -- prog args…` under the same preload (uiw appends its shim).
    pub fn uiw_cmd(&self, prog: &str, args: &[String]) -> Result<Cmd, String> {
        let uiw = self.uiw.as_ref().map_err(Clone::clone)?;
        Ok(self
            .cmd(&uiw.display().to_string())
            .args(["run", "--", prog])
            .args(args.iter().cloned()))
    }

    /// Can `p` run here: its tool, uiw for a probe of uiw (on lo or on the veth test bed), and
    /// the test bed for the veth probes.
    pub fn probe_available(&self, p: &Probe) -> Result<(), String> {
        if p.on_veth() {
            self.veth.as_ref().map(|_| ()).map_err(Clone::clone)?;
        }
        if p.stack().starts_with("uiw") {
            self.uiw.as_ref().map_err(Clone::clone)?;
        }
        self.available(p.tool())
    }

    /// `mpirun` of two mpi_check ranks with `args`, in the MPI namespace, over `fabric`: for
    /// uiw under `uiw run` with `FI_PROVIDER="verbs;ofi_rxm"` on the veth's device, else
    /// plainly with `FI_PROVIDER=tcp` on the same veth, or Open MPI's own TCP (ob1, btl tcp).
    pub fn mpi_cmd(&self, fabric: Fabric, args: &[String]) -> Result<Cmd, String> {
        let net = self.mpi.as_ref().ok_or("the MPI namespace is not set up")?;
        let mut c = self.cmd("ip").args(["netns", "exec", &net.netns]);
        if fabric == Fabric::UiwVerbs {
            let uiw = self.uiw.as_ref().map_err(Clone::clone)?;
            c = c
                .arg(uiw.display().to_string())
                .args(["run", "--"])
                .env("UIW_STATE_DIR", net.state_dir.display().to_string());
        }
        c = c.arg("mpirun").args(MPIRUN_ARGS.iter().copied());
        c = match fabric {
            Fabric::UiwVerbs => c.args(MPIRUN_OFI.iter().copied()).args(["-x", "FI_PROVIDER=verbs;ofi_rxm"]),
            // TCP_NODELAY, as the fi_pingpong peer has it: the tcp provider's own default
            // ("overrides default TCP_NODELAY socket setting", unset) cost it 5x at 64 KiB
            // here (51 against 257 MB/s, same run) and milliseconds of tail latency.
            Fabric::Tcp => c.args(MPIRUN_OFI.iter().copied()).args([
                "-x",
                "FI_PROVIDER=tcp",
                "-x",
                &format!("FI_TCP_IFACE={MPI_VETH}"),
                "-x",
                "FI_TCP_NODELAY=1",
            ]),
            Fabric::Ob1Tcp => c.args(["--mca", "pml", "ob1", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", MPI_VETH]),
        };
        Ok(c.arg(net.exe.display().to_string()).args(args.iter().cloned()))
    }

    pub fn available(&self, tool: &str) -> Result<(), String> {
        if tool.starts_with("ib_") || tool == "placement_lag" {
            self.uiw.as_ref().map_err(Clone::clone)?;
        }
        match self.tools.get(tool) {
            Some(r) => r.clone(),
            None => Err(format!("{tool} not checked")),
        }
    }
}

/// Is `prog` an executable on PATH?
pub fn on_path(prog: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|p| {
            p.is_file()
                && p.metadata().is_ok_and(|m| {
                    use std::os::unix::fs::PermissionsExt;
                    m.permissions().mode() & 0o111 != 0
                })
        })
}

/// mpirun's options for every fabric: two ranks, out-of-band traffic on the veth.
pub const MPIRUN_ARGS: &[&str] = &["--allow-run-as-root", "--oversubscribe", "-np", "2", "--mca", "oob_tcp_if_include", MPI_VETH];

/// mpirun's options for the libfabric fabrics (as rdmacm/tests/apps.rs runs mpi_check in CI):
/// the cm PML over libfabric's MTL, and Open MPI's default `mtl_ofi_provider_exclude` without
/// `tcp` (its default, "shm,sockets,tcp,udp,rstream,usnic", would leave the tcp peer with
/// "PML cm cannot be selected").
pub const MPIRUN_OFI: &[&str] = &[
    "--mca",
    "pml",
    "cm",
    "--mca",
    "mtl",
    "ofi",
    "--mca",
    "btl",
    "self",
    "--mca",
    "mtl_ofi_provider_exclude",
    "shm,sockets,udp,rstream,usnic",
];

/// The namespace's veth end that carries the address and the uiw device (`uiw_v0`).
const MPI_VETH: &str = "v0";
const NETNS_PREFIX: &str = "uiw-bench-";

/// The MPI rows' network: a namespace of this run's own (`uiw-bench-<pid>`) with a veth pair,
/// `v0` 10.77.0.1/24 and `v1`, and a uiw device on `v0` published from a state directory of
/// its own. libfabric 1.17's verbs provider skips loopback netdevs, so uiw_lo cannot serve
/// MPI; the namespace keeps the address off the host's network, and the separate state
/// directory leaves uiw_v0 the only device the ranks see. Dropping it withdraws the device
/// and deletes the namespace.
#[derive(Debug)]
pub struct MpiNet {
    pub netns: String,
    pub state_dir: PathBuf,
    /// mpi_check, built with mpicc.
    pub exe: PathBuf,
    uiw: PathBuf,
    logs: PathBuf,
}

fn ip(args: &[&str], logs: &Path) -> Result<(), String> {
    let o = run_capture(&Cmd::new("ip").args(args.iter().copied()), Duration::from_secs(30), &logs.join("ip"))?;
    if o.success() {
        Ok(())
    } else {
        Err(format!("ip {} failed: {}", args.join(" "), o.stderr.trim()))
    }
}

impl MpiNet {
    /// Checks what the MPI rows need (Open MPI with its libfabric MTL, mpicc, iproute2, root,
    /// uiw), builds mpi_check into `bin`, and sets the namespace and device up. Err says why
    /// the rows cannot run.
    pub fn up(uiw: &Result<PathBuf, String>, bin: &Path, logs: &Path, state_dir: &Path) -> Result<MpiNet, String> {
        for (prog, pkg) in [
            ("mpirun", "openmpi-bin"),
            ("ompi_info", "openmpi-bin"),
            ("mpicc", "libopenmpi-dev"),
            ("ip", "iproute2"),
        ] {
            on_path(prog).ok_or_else(|| format!("{prog} not found (Debian package {pkg})"))?;
        }
        if !is_root() {
            return Err("not root: the MPI rows need a network namespace with a veth (libfabric 1.17's verbs provider skips loopback netdevs)".into());
        }
        let o = run_capture(&Cmd::new("ompi_info").arg("--parsable"), Duration::from_secs(60), &logs.join("ompi_info"))?;
        if !o.stdout.contains("mca:mtl:ofi:") {
            return Err("Open MPI has no libfabric MTL (no mca:mtl:ofi in `ompi_info --parsable`)".into());
        }
        let uiw = uiw.as_ref().map_err(Clone::clone)?.clone();
        let c = bin.join("mpi_check.c");
        let exe = bin.join("mpi_check");
        std::fs::write(&c, MPI_CHECK_C).map_err(|e| format!("cannot write {}: {e}", c.display()))?;
        let cmd = Cmd::new("mpicc")
            .args(["-O2", "-Wall", "-Werror", "-o"])
            .arg(exe.display().to_string())
            .arg(c.display().to_string());
        let o = run_capture(&cmd, Duration::from_secs(120), &logs.join("mpicc-mpi_check"))?;
        if !o.success() {
            return Err(format!("mpicc failed to build mpi_check: {}", o.stderr.trim()));
        }
        let exe = exe.canonicalize().unwrap_or(exe);
        remove_stale_namespaces(logs);
        let _ = std::fs::remove_dir_all(state_dir);
        std::fs::create_dir_all(state_dir).map_err(|e| format!("cannot create {}: {e}", state_dir.display()))?;
        let state_dir = state_dir.canonicalize().unwrap_or_else(|_| state_dir.to_path_buf());
        let net = MpiNet {
            netns: format!("{NETNS_PREFIX}{}", std::process::id()),
            state_dir,
            exe,
            uiw,
            logs: logs.to_path_buf(),
        };
        let ns = net.netns.as_str();
        ip(&["netns", "add", ns], logs)?;
        // From here on, dropping `net` undoes what was done.
        for args in [
            &["-n", ns, "link", "set", "lo", "up"][..],
            &["-n", ns, "link", "add", MPI_VETH, "type", "veth", "peer", "name", "v1"],
            &["-n", ns, "addr", "add", "10.77.0.1/24", "dev", MPI_VETH],
            &["-n", ns, "link", "set", MPI_VETH, "up"],
            &["-n", ns, "link", "set", "v1", "up"],
        ] {
            ip(args, logs)?;
        }
        let o = run_capture(&net.uiw_in_ns(&["up", "--netdev", MPI_VETH]), Duration::from_secs(60), &logs.join("uiw-up-mpi"))?;
        if !o.success() {
            return Err(format!(
                "`uiw up --netdev {MPI_VETH}` in namespace {ns} failed: {}",
                crate::parse::failure_reason(&o.stderr, &o.stdout).unwrap_or_default()
            ));
        }
        Ok(net)
    }

    fn uiw_in_ns(&self, args: &[&str]) -> Cmd {
        Cmd::new("ip")
            .args(["netns", "exec", &self.netns])
            .arg(self.uiw.display().to_string())
            .args(args.iter().copied())
            .env("UIW_STATE_DIR", self.state_dir.display().to_string())
    }
}

impl Drop for MpiNet {
    fn drop(&mut self) {
        let _ = run_capture(&self.uiw_in_ns(&["down"]), Duration::from_secs(60), &self.logs.join("uiw-down-mpi"));
        let _ = ip(&["netns", "del", &self.netns], &self.logs);
    }
}

/// Deletes the namespaces of earlier runs that were killed before they could (named after a
/// pid that is gone).
fn remove_stale_namespaces(logs: &Path) {
    let Ok(dir) = std::fs::read_dir("/run/netns") else { return };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(NETNS_PREFIX).and_then(|p| p.parse::<u32>().ok()) else { continue };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", &name], logs);
        }
    }
}

/// Effective uid 0, from /proc/self/status ("Uid: real effective saved fs").
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// Compiles the embedded C helpers into `bin`.
pub fn build_helpers(bin: &Path, logs: &Path) -> Result<(PathBuf, PathBuf, PathBuf), String> {
    std::fs::create_dir_all(bin).map_err(|e| format!("cannot create {}: {e}", bin.display()))?;
    on_path("gcc").ok_or(
        "gcc not found on PATH (apt-get install -y gcc): it builds tcpbench and cc_preload.so",
    )?;
    let mut built = Vec::new();
    for (name, src, extra) in [
        ("tcpbench", TCPBENCH_C, &["-pthread"][..]),
        (
            "cc_preload.so",
            CC_PRELOAD_C,
            &["-shared", "-fPIC", "-ldl"][..],
        ),
        ("cc_check", CC_CHECK_C, &[][..]),
    ] {
        let c = bin.join(format!("{}.c", name.trim_end_matches(".so")));
        std::fs::write(&c, src).map_err(|e| format!("cannot write {}: {e}", c.display()))?;
        let out = bin.join(name);
        let cmd = Cmd::new("gcc")
            .args(["-O2", "-Wall", "-o"])
            .arg(out.display().to_string())
            .arg(c.display().to_string())
            .args(extra.iter().copied());
        let o = run_capture(
            &cmd,
            Duration::from_secs(120),
            &logs.join(format!("gcc-{name}")),
        )?;
        if !o.success() {
            return Err(format!("gcc failed to build {name}: {}", o.stderr.trim()));
        }
        built.push(out);
    }
    let mut it = built.into_iter();
    Ok((it.next().unwrap(), it.next().unwrap(), it.next().unwrap()))
}

/// Compiles the placement-lag probe into `bin` (it needs libibverbs' headers: Debian's
/// libibverbs-dev). A failure only makes its rows unavailable: the reason is returned.
pub fn build_placement_lag(bin: &Path, logs: &Path) -> (PathBuf, Result<(), String>) {
    let out = bin.join("placement_lag");
    let c = bin.join("placement_lag.c");
    let built = (|| {
        std::fs::write(&c, PLACEMENT_LAG_C)
            .map_err(|e| format!("cannot write {}: {e}", c.display()))?;
        let cmd = Cmd::new("gcc")
            .args(["-O2", "-Wall", "-o"])
            .arg(out.display().to_string())
            .arg(c.display().to_string())
            .arg("-libverbs");
        let o = run_capture(
            &cmd,
            Duration::from_secs(120),
            &logs.join("gcc-placement_lag"),
        )?;
        if o.success() {
            Ok(())
        } else {
            Err(format!(
                "gcc failed to build placement_lag (is libibverbs-dev installed?): {}",
                o.stderr
                    .lines()
                    .find(|l| l.contains("error"))
                    .unwrap_or(o.stderr.trim())
            ))
        }
    })();
    (out.canonicalize().unwrap_or(out), built)
}

pub fn available_cc() -> Vec<String> {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .unwrap_or_default()
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// Makes `cc` available (loading `tcp_<cc>` if needed), and returns the
/// kernel's list.
pub fn ensure_cc(cc: &str, logs: &Path) -> Result<Vec<String>, String> {
    let mut known = available_cc();
    if !known.iter().any(|k| k == cc) {
        let _ = run_capture(
            &Cmd::new("modprobe").arg(format!("tcp_{cc}")),
            Duration::from_secs(20),
            &logs.join("modprobe"),
        );
        known = available_cc();
    }
    if !known.iter().any(|k| k == cc) {
        return Err(format!(
            "congestion control {cc:?} is not available in this kernel (available: {})",
            known.join(" ")
        ));
    }
    Ok(known)
}

/// Runs cc_check as `cmd` and demands it reports `cc`.
pub fn verify_cc(cmd: &Cmd, cc: &str, what: &str, log: &Path) -> Result<(), String> {
    let o = run_capture(cmd, Duration::from_secs(30), log)?;
    let got = o
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("cc="))
        .map(str::to_string);
    match got {
        Some(g) if g == cc => Ok(()),
        Some(g) => Err(format!(
            "{what}: a new TCP socket gets congestion control {g:?}, not {cc:?} ({}); setting a \
             congestion control outside net.ipv4.tcp_allowed_congestion_control needs root",
            o.stderr.trim()
        )),
        None => Err(format!(
            "{what}: cc_check printed no result ({}; {})",
            o.describe(Duration::from_secs(30)),
            o.stderr.trim()
        )),
    }
}

/// Installs the Debian packages of missing peer tools (root only).
/// Returns a note for the report.
pub fn install_missing(logs: &Path) -> Option<String> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(tool, _)| on_path(tool).is_none())
        .map(|(_, pkg)| *pkg)
        .collect();
    if missing.is_empty() {
        return None;
    }
    if !is_root() {
        return Some(format!(
            "not root: did not install {} (run `apt-get install -y {}` as root)",
            missing.join(" "),
            missing.join(" ")
        ));
    }
    eprintln!("uiw-bench: apt-get install -y {}", missing.join(" "));
    let cmd = Cmd::new("apt-get")
        .args(["install", "-y", "-q"])
        .args(missing.iter().copied())
        .env("DEBIAN_FRONTEND", "noninteractive");
    match run_capture(
        &cmd,
        Duration::from_secs(600),
        &logs.join("apt-get-install"),
    ) {
        Ok(o) if o.success() => Some(format!("installed {}", missing.join(" "))),
        Ok(o) => Some(format!(
            "apt-get install -y {} failed ({}; a fresh machine may need `apt-get update` first)",
            missing.join(" "),
            o.describe(Duration::from_secs(600))
        )),
        Err(e) => Some(e),
    }
}

/// Which tools the probes need, and whether each is here.
pub fn check_tools(tcpbench: &Path) -> BTreeMap<String, Result<(), String>> {
    let mut m = BTreeMap::new();
    for prog in crate::rows::PERFTEST_PROGS {
        let r = on_path(prog)
            .map(|_| ())
            .ok_or_else(|| format!("{prog} not found (Debian package perftest)"));
        m.insert(prog.to_string(), r);
    }
    for (tool, pkg) in PACKAGES.iter().skip(1) {
        let r = on_path(tool)
            .map(|_| ())
            .ok_or_else(|| format!("{tool} not found (Debian package {pkg})"));
        m.insert(tool.to_string(), r);
    }
    m.insert(
        "fi_rma_bw".into(),
        on_path("fi_rma_bw")
            .map(|_| ())
            .ok_or_else(|| "no fi_rma_bw (Debian 12 packages no fabtests)".to_string()),
    );
    m.insert(
        "mpi_check".into(),
        Err("the MPI rows were not selected (they are opt-in: --only mpi_lat_8,…)".into()),
    );
    m.insert(
        "tcpbench".into(),
        if tcpbench.is_file() {
            Ok(())
        } else {
            Err("tcpbench was not built".into())
        },
    );
    m
}

/// The `uiw` binary: `--uiw`, else beside this executable (cargo puts a
/// profile's binaries together), else on PATH.
pub fn find_uiw(explicit: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = explicit {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(format!("--uiw {}: no such file", p.display()))
        };
    }
    if let Some(p) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("uiw")))
        .filter(|p| p.is_file())
    {
        return Ok(p);
    }
    on_path("uiw").ok_or_else(|| {
        "uiw binary not found beside uiw-bench nor on PATH (cargo build --workspace --release, or --uiw PATH)".into()
    })
}

/// `uiw up`: publishes uiw_lo (needs root the first time).
pub fn uiw_up(uiw: &Path, logs: &Path) -> Result<(), String> {
    let o = run_capture(
        &Cmd::new(uiw.display().to_string()).arg("up"),
        Duration::from_secs(60),
        &logs.join("uiw-up"),
    )?;
    if o.success() {
        Ok(())
    } else {
        Err(format!(
            "`uiw up` failed ({}): {}",
            o.describe(Duration::from_secs(60)),
            crate::parse::failure_reason(&o.stderr, &o.stdout).unwrap_or_default()
        ))
    }
}

/// One line describing the machine: CPU model, vCPUs, kernel, lo MTU.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let ncpu = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let os = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("PRETTY_NAME=")
                    .map(|v| v.trim_matches('"').to_string())
            })
        })
        .unwrap_or_default();
    let mtu = std::fs::read_to_string("/sys/class/net/lo/mtu")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    format!("{cpu}, {ncpu} vCPUs, {os}, kernel {kernel}, lo MTU {mtu}")
}

/// Current UTC date and time, `2026-11-22 02:10 UTC` (from `date`, to need no
/// time crate).
pub fn now_utc() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown date".into())
}

/// What carries a uiw device's streams on the veth test bed (`uiw up --transport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// AF_XDP: uiw's userspace TCP on raw frames.
    Xdp,
    /// The kernel's TCP sockets.
    Tcp,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Xdp => "xdp",
            Transport::Tcp => "tcp",
        }
    }
}

/// Which host of the test bed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Host {
    /// The client (requester, sender) side: 198.51.100.1.
    A,
    /// The server side: 198.51.100.2.
    B,
}

/// The veth rows' test bed: `ci/testbed.sh up --transport xdp` (namespaces PREFIX-a and
/// PREFIX-b, each with a veth to a bridge in PREFIX-w, MTU 1500, the veths' offloads off, a uiw device published with
/// the xdp transport in each), plus in each namespace a second state dir publishing the same
/// netdev with the kernel-TCP transport. Torn down on drop.
#[derive(Debug)]
pub struct VethBed {
    pub prefix: String,
    pub script: PathBuf,
    pub uiw: PathBuf,
    /// The uiw device on both hosts and with both transports (`uiw_veth0`).
    pub dev: String,
    pub netdev: String,
    pub addr_a: String,
    pub addr_b: String,
    pub mtu: String,
    /// `/tmp/PREFIX-testbed`: the script's state dirs `a`, `b` (xdp) and ours, `tcp-a`, `tcp-b`.
    pub dir: PathBuf,
    pub logs: PathBuf,
}

impl VethBed {
    pub fn ns(&self, h: Host) -> String {
        match h {
            Host::A => format!("{}-a", self.prefix),
            Host::B => format!("{}-b", self.prefix),
        }
    }

    /// The uiw state dir of `h`'s device with transport `t`.
    pub fn state(&self, h: Host, t: Transport) -> PathBuf {
        let host = if h == Host::A { "a" } else { "b" };
        match t {
            Transport::Xdp => self.dir.join(host),
            Transport::Tcp => self.dir.join(format!("tcp-{host}")),
        }
    }

    /// `ip netns exec NS PROGRAM`: `cmd` (built with [`Ctx::cmd`], its environment kept) run
    /// on host `h`.
    pub fn on(&self, h: Host, cmd: Cmd) -> Cmd {
        let mut c = Cmd::new("ip").args(["netns", "exec", &self.ns(h)]).arg(cmd.program).args(cmd.args);
        c.env = cmd.env;
        c
    }

    /// The offload settings of host `h`'s veth as `ethtool -k` shows them (for the report).
    pub fn offloads(&self) -> String {
        let cmd = Cmd::new("ip").args(["netns", "exec", &self.ns(Host::A), "ethtool", "-k", &self.netdev]);
        match run_capture(&cmd, Duration::from_secs(10), &self.logs.join("veth-ethtool")) {
            Ok(o) if o.success() => {
                let want = [
                    "tx-checksumming:",
                    "tcp-segmentation-offload:",
                    "generic-segmentation-offload:",
                    "generic-receive-offload:",
                ];
                o.stdout
                    .lines()
                    .filter(|l| want.iter().any(|w| l.starts_with(w)))
                    .map(|l| l.replace(':', ""))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
            _ => "unknown (ethtool -k failed)".into(),
        }
    }
}

impl Drop for VethBed {
    fn drop(&mut self) {
        for h in [Host::A, Host::B] {
            let st = self.state(h, Transport::Tcp);
            let down = self.on(h, Cmd::new(self.uiw.display().to_string()).arg("down"))
                .env("UIW_STATE_DIR", st.display().to_string());
            let _ = run_capture(&down, Duration::from_secs(30), &self.logs.join(format!("veth-uiw-down-tcp-{h:?}")));
        }
        let down = Cmd::new(self.script.display().to_string()).args(["-p", &self.prefix, "down"]);
        match run_capture(&down, Duration::from_secs(60), &self.logs.join("veth-testbed-down")) {
            Ok(o) if o.success() => eprintln!("uiw-bench: veth test bed {} torn down", self.prefix),
            Ok(o) => eprintln!(
                "uiw-bench: `{} down` failed ({}): {}",
                down.display(),
                o.describe(Duration::from_secs(60)),
                o.stderr.trim()
            ),
            Err(e) => eprintln!("uiw-bench: {e}"),
        }
    }
}

/// The test bed's name: `UIW_TESTBED_PREFIX` if set, else `uwb` and this process's id
/// (unique among concurrent runs; at most 20 characters, as the script demands).
pub fn veth_prefix() -> String {
    std::env::var("UIW_TESTBED_PREFIX")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| format!("uwb{}", std::process::id()))
}

/// Sets up the veth rows' test bed, or says why it cannot be here: not root, no uiw, a tool
/// missing (ip, nft, ethtool), or AF_XDP unavailable (`uiw up --transport xdp` probes it and
/// says so).
pub fn veth_up(uiw: &Result<PathBuf, String>, bin: &Path, logs: &Path) -> Result<VethBed, String> {
    if !is_root() {
        return Err("needs root: network namespaces, a veth pair and AF_XDP (CAP_NET_RAW, CAP_NET_ADMIN, CAP_BPF)".into());
    }
    let uiw = uiw.as_ref().map_err(|e| format!("uiw: {e}"))?.clone();
    for (tool, pkg) in [("ip", "iproute2"), ("nft", "nftables"), ("ethtool", "ethtool")] {
        if on_path(tool).is_none() && !Path::new("/usr/sbin").join(tool).exists() {
            return Err(format!("{tool} not found (Debian package {pkg})"));
        }
    }
    let script = bin.join("testbed.sh");
    std::fs::write(&script, TESTBED_SH).map_err(|e| format!("cannot write {}: {e}", script.display()))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("chmod {}: {e}", script.display()))?;
    }
    let script = script.canonicalize().unwrap_or(script);
    let prefix = veth_prefix();
    let up = Cmd::new(script.display().to_string())
        .args(["-p", &prefix, "up", "--transport", "xdp", "--uiw"])
        .arg(uiw.display().to_string());
    let o = run_capture(&up, Duration::from_secs(120), &logs.join("veth-testbed-up"))?;
    if !o.success() {
        let why = o.stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim().to_string();
        // The script tears a failed bed down itself.
        return Err(format!("`{}` failed ({}): {why}", up.display(), o.describe(Duration::from_secs(120))));
    }
    let bed = VethBed {
        dir: PathBuf::from(format!("/tmp/{prefix}-testbed")),
        prefix,
        script,
        uiw: uiw.clone(),
        dev: "uiw_veth0".into(),
        netdev: "veth0".into(),
        addr_a: "198.51.100.1".into(),
        addr_b: "198.51.100.2".into(),
        mtu: "1500".into(),
        logs: logs.to_path_buf(),
    };
    // From here on, dropping `bed` tears it down.
    for h in [Host::A, Host::B] {
        let st = bed.state(h, Transport::Tcp);
        let cmd = bed
            .on(h, Cmd::new(uiw.display().to_string()).args(["up", "--netdev", &bed.netdev, "--transport", "tcp"]))
            .env("UIW_STATE_DIR", st.display().to_string());
        let o = run_capture(&cmd, Duration::from_secs(60), &logs.join(format!("veth-uiw-up-tcp-{h:?}")))?;
        if !o.success() {
            return Err(format!(
                "`{}` failed ({}): {}",
                cmd.display(),
                o.describe(Duration::from_secs(60)),
                crate::parse::failure_reason(&o.stderr, &o.stdout).unwrap_or_default()
            ));
        }
    }
    Ok(bed)
}
