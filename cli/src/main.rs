//! `uiw`: publish, inspect and use uiw software iWARP devices (see `uiw --help`).
//! The few libc calls it needs are `uiw_kabi::sys`'s safe wrappers.
#![forbid(unsafe_code)]

mod help;
mod libs;
mod netdev;
mod nodes;
mod stat;
mod state;
mod tree;

use state::{Entry, Paths};
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// A failure with its exit status and message.
struct Fail(u8, String);

type Res<T = ()> = Result<T, Fail>;

fn fail<T>(msg: impl Into<String>) -> Res<T> {
    Err(Fail(1, msg.into()))
}
fn usage<T>(msg: impl Into<String>) -> Res<T> {
    Err(Fail(2, format!("{}\nTry 'uiw --help'.", msg.into())))
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match real_main(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Fail(code, msg)) => {
            if !msg.is_empty() {
                eprintln!("uiw: {msg}");
            }
            ExitCode::from(code)
        }
    }
}

fn real_main(args: Vec<OsString>) -> Res {
    let mut it = args.into_iter().peekable();
    let mut state_override: Option<PathBuf> = None;
    let cmd = loop {
        let Some(a) = it.next() else {
            print!("{}", help::MAIN);
            return usage("no command given");
        };
        match a.to_str() {
            Some("-h") | Some("--help") | Some("help") => {
                print!("{}", help::MAIN);
                return Ok(());
            }
            Some("-V") | Some("--version") => {
                println!("uiw {}", env!("CARGO_PKG_VERSION"));
                return Ok(());
            }
            Some("--state-dir") => match it.next() {
                Some(v) => state_override = Some(v.into()),
                None => return usage("--state-dir needs a directory"),
            },
            Some(s) if s.starts_with("--state-dir=") => state_override = Some(s["--state-dir=".len()..].into()),
            Some(s) => break s.to_string(),
            None => return usage(format!("unknown command {a:?}")),
        }
    };
    let rest: Vec<OsString> = it.collect();
    // Commands that only use devices may fall back to root's /run/uiw (see state.rs).
    let paths = Paths::from_env_for(state_override, matches!(cmd.as_str(), "show" | "list" | "env" | "run" | "stat" | "statistic"));
    let page = match cmd.as_str() {
        "up" => help::UP,
        "down" => help::DOWN,
        "show" | "list" => help::SHOW,
        "env" => help::ENV,
        "run" => help::RUN,
        "stat" | "statistic" => help::STAT,
        "install" => help::INSTALL,
        "uninstall" => help::UNINSTALL,
        other => return usage(format!("unknown command '{other}'")),
    };
    // `run` passes everything after the command through; other commands take --help anywhere.
    let wants_help = |v: &[OsString]| v.iter().any(|a| a == "-h" || a == "--help");
    if cmd != "run" && wants_help(&rest) || cmd == "run" && rest.first().is_some_and(|a| a == "-h" || a == "--help") {
        print!("{page}");
        return Ok(());
    }
    match cmd.as_str() {
        "up" => {
            let rootless = rest.iter().any(|a| a == "--rootless");
            let rest: Vec<OsString> = rest.into_iter().filter(|a| a != "--rootless").collect();
            let (rest, transport) = transport_opt(rest)?;
            let want = netdev_opts(&rest, "up")?;
            check_transport(transport, &want)?;
            cmd_up(&paths, want, true, rootless, transport)
        }
        "down" => cmd_down(&paths, netdev_opts(&rest, "down")?),
        "show" | "list" => cmd_show(&paths, parse_show(&rest)?),
        "env" => {
            no_args(&rest, "env")?;
            cmd_env(&paths)
        }
        "run" => cmd_run(&paths, rest),
        "stat" | "statistic" => cmd_stat(&paths, parse_stat(&rest)?),
        "install" => cmd_install(&paths, provider_dir_opt(&rest, "install")?),
        "uninstall" => cmd_uninstall(&paths, provider_dir_opt(&rest, "uninstall")?),
        _ => unreachable!(),
    }
}

fn no_args(rest: &[OsString], cmd: &str) -> Res {
    match rest.first() {
        None => Ok(()),
        Some(a) => usage(format!("{cmd}: unexpected argument {a:?}")),
    }
}

/// `uiw up --transport tcp|packet|xdp`: what carries the device's iWARP streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    /// The kernel's TCP sockets (the default; needs no privileges).
    Tcp,
    /// uiw's userspace TCP on raw frames.
    Raw(uiw_rawnet::probe::Kind),
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Transport::Tcp => f.write_str("tcp"),
            Transport::Raw(k) => write!(f, "{k}"),
        }
    }
}

/// Take `--transport X` / `--transport=X` out of `rest`.
fn transport_opt(rest: Vec<OsString>) -> Res<(Vec<OsString>, Transport)> {
    let mut out = Vec::new();
    let mut t = Transport::Tcp;
    let mut it = rest.into_iter();
    while let Some(a) = it.next() {
        let v = if a == "--transport" || a == "-t" {
            match it.next() {
                Some(v) => v,
                None => return usage("up: --transport needs tcp, packet or xdp"),
            }
        } else if let Some(v) = a.to_str().and_then(|s| s.strip_prefix("--transport=")) {
            v.into()
        } else {
            out.push(a);
            continue;
        };
        t = match v.to_str() {
            Some("tcp") => Transport::Tcp,
            Some("packet") => Transport::Raw(uiw_rawnet::probe::Kind::Packet),
            Some("xdp") => Transport::Raw(uiw_rawnet::probe::Kind::Xdp),
            _ => return usage(format!("up: --transport {v:?}: say tcp, packet or xdp")),
        };
    }
    Ok((out, t))
}

/// Refuse a raw-frame transport that cannot run, saying why: no interface named, or missing
/// privileges (the provider opens the transport in each process that uses the device, and
/// needs CAP_NET_RAW, CAP_NET_ADMIN and, for xdp, CAP_BPF there).
fn check_transport(t: Transport, netdevs: &[String]) -> Res {
    let Transport::Raw(kind) = t else { return Ok(()) };
    if netdevs.is_empty() || netdevs.iter().any(|n| n == "lo") {
        return usage(format!(
            "up: --transport {kind} needs --netdev NAME, an Ethernet interface (not lo): it sends and receives raw Ethernet frames"
        ));
    }
    if let Err(e) = uiw_rawnet::probe::probe(kind) {
        return fail(format!("up: --transport {kind}: {e}; use --transport tcp (the kernel's TCP), which needs no privileges"));
    }
    Ok(())
}

fn netdev_opts(rest: &[OsString], cmd: &str) -> Res<Vec<String>> {
    let mut out = Vec::new();
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        let s = a.to_str().unwrap_or("");
        let v = if s == "--netdev" || s == "-n" || s == "netdev" {
            match it.next().and_then(|v| v.to_str()) {
                Some(v) => v.to_string(),
                None => return usage(format!("{cmd}: --netdev needs a network device name")),
            }
        } else if let Some(v) = s.strip_prefix("--netdev=") {
            v.to_string()
        } else if s == "--config" || s.starts_with("--config=") {
            let file = match s.strip_prefix("--config=") {
                Some(f) => PathBuf::from(f),
                None => match it.next() {
                    Some(f) => PathBuf::from(f),
                    None => return usage(format!("{cmd}: --config needs a file")),
                },
            };
            let names = config_netdevs(&file)?;
            if names.is_empty() {
                return fail(format!("{cmd}: {} names no network device", file.display()));
            }
            for v in names {
                if !out.contains(&v) {
                    out.push(v);
                }
            }
            continue;
        } else {
            return usage(format!("{cmd}: unexpected argument {a:?}"));
        };
        if !out.contains(&v) {
            out.push(v);
        }
    }
    Ok(out)
}

/// The network devices a config file (`/etc/uiw/devices`) names: whitespace-separated
/// words, `#` to the end of a line a comment.
fn config_netdevs(file: &Path) -> Res<Vec<String>> {
    let text = fs::read_to_string(file).map_err(|e| io_fail("cannot read", file, e))?;
    Ok(text
        .lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .flat_map(|l| l.split_whitespace())
        .map(str::to_string)
        .collect())
}

fn parse_show(rest: &[OsString]) -> Res<bool> {
    let mut details = false;
    for a in rest {
        match a.to_str() {
            Some("-d") | Some("--details") => details = true,
            _ => return usage(format!("show: unexpected argument {a:?}")),
        }
    }
    Ok(details)
}

fn parse_stat(rest: &[OsString]) -> Res<stat::Opts> {
    let mut o = stat::Opts::default();
    let mut it = rest.iter().map(|a| a.to_str().unwrap_or(""));
    let known: Vec<&str> = uiw_kabi::stats::COUNTERS.iter().map(|c| c.1).collect();
    let mut first = true;
    while let Some(a) = it.next() {
        match a {
            "show" if first => {}
            "qp" if first => o.qp = true,
            "--qp" => o.qp = true,
            "-a" | "--all" => o.all = true,
            "-j" | "--json" => o.json = true,
            "--prune" => o.prune = true,
            "-d" | "--dev" | "dev" => match it.next() {
                Some(v) => o.dev = Some(v.trim_end_matches("/1").to_string()),
                None => return usage("stat: -d needs a device name"),
            },
            "-p" | "--pid" | "pid" => match it.next().and_then(|v| v.parse().ok()) {
                Some(v) => o.pid = Some(v),
                None => return usage("stat: -p needs a process id"),
            },
            "-c" | "--counter" => match it.next() {
                Some(v) => {
                    for c in v.split(',') {
                        if !known.contains(&c) {
                            return usage(format!("stat: unknown counter '{c}' (counters: {})", known.join(", ")));
                        }
                        o.counters.push(c.to_string());
                    }
                }
                None => return usage("stat: -c needs counter names"),
            },
            other => return usage(format!("stat: unexpected argument {other:?}")),
        }
        first = false;
    }
    Ok(o)
}

fn cmd_stat(paths: &Paths, o: stat::Opts) -> Res {
    let dir = paths.stats();
    let mut procs = stat::scan(&dir);
    procs.retain(|p| (o.dev.is_none() || o.dev.as_deref() == Some(p.snap.ibdev.as_str())) && (o.pid.is_none() || o.pid == Some(p.snap.pid)));
    if o.prune {
        let n = stat::prune(&procs);
        println!("removed the statistics of {n} exited process(es)");
        return Ok(());
    }
    if o.json {
        println!("{}", stat::render_json(&procs, &o));
        return Ok(());
    }
    let lines = stat::render(&procs, &o);
    if lines.is_empty() {
        let exited = procs.iter().filter(|p| !p.live).count();
        eprintln!(
            "uiw: stat: no {} process uses a device of {}{}",
            if o.all { "" } else { "running" },
            paths.state.display(),
            if exited > 0 && !o.all { format!(" ({exited} exited: uiw stat -a)") } else { String::new() }
        );
    }
    for l in lines {
        println!("{l}");
    }
    Ok(())
}

fn provider_dir_opt(rest: &[OsString], cmd: &str) -> Res<Option<PathBuf>> {
    let mut it = rest.iter();
    let mut dir = None;
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("--provider-dir") => match it.next() {
                Some(v) => dir = Some(PathBuf::from(v)),
                None => return usage(format!("{cmd}: --provider-dir needs a directory")),
            },
            Some(s) if s.starts_with("--provider-dir=") => dir = Some(s["--provider-dir=".len()..].into()),
            _ => return usage(format!("{cmd}: unexpected argument {a:?}")),
        }
    }
    Ok(dir)
}

fn ibdev_for(netdev: &str) -> String {
    format!("uiw_{netdev}")
}

fn need_root_msg(node: &Path) -> String {
    format!(
        "up: creating {} needs root (like `rdma link add`); run it once with sudo: sudo uiw up",
        node.display()
    )
}

fn io_fail(what: &str, p: &Path, e: std::io::Error) -> Fail {
    Fail(1, format!("{what} {}: {e}", p.display()))
}

/// Can `up` create nodes in `dev`: is the (nearest existing) directory there writable? Not
/// for users, nor for root in a container whose /dev is read-only.
fn can_make_nodes(dev: &Path) -> bool {
    let mut d = Some(dev);
    while let Some(p) = d {
        if p.exists() {
            return uiw_kabi::sys::is_writable(p);
        }
        d = p.parent();
    }
    false
}

const ROOTLESS_NOTE: &str = "rootless mode (/dev/infiniband cannot be written here): no /dev/infiniband/uverbsN node was created and none is needed; \
programs see the devices when started with `uiw run` (or with `eval \"$(uiw env)\"`), whose shim answers libibverbs' \
opens of /dev/infiniband and /sys/class/infiniband from this state directory. Other users' programs do not see them.";

/// `uiw up`: add `want` (default lo, when nothing is published yet) and refresh all.
/// `rootless`: publish without /dev/infiniband nodes (also chosen by itself when this user
/// cannot create them).
fn cmd_up(paths: &Paths, mut want: Vec<String>, verbose: bool, rootless: bool, transport: Transport) -> Res {
    for c in [':', ';'] {
        if paths.state.to_string_lossy().contains(c) {
            return fail(format!("state directory {} must not contain '{c}' (RDMAV_DRIVERS splits on it)", paths.state.display()));
        }
    }
    let old = state::read_manifest(&paths.manifest());
    let rootless = rootless
        || std::env::var_os("UIW_ROOTLESS").is_some_and(|v| v == "1")
        || old.iter().any(|e| e.rootless)
        || !can_make_nodes(&paths.dev_dir);
    let reg = if rootless {
        None
    } else {
        match nodes::Registry::open_locked(&paths.registry) {
            Ok(r) => Some(r),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS)) => {
                return fail(format!(
                    "up: cannot write the node registry {} ({e}); publish as root (sudo uiw up), or without device nodes: uiw up --rootless",
                    paths.registry.display()
                ))
            }
            Err(e) => return Err(io_fail("up: cannot open node registry", &paths.registry, e)),
        }
    };
    fs::create_dir_all(&paths.state).map_err(|e| io_fail("up: cannot create state directory", &paths.state, e))?;

    if want.is_empty() && old.is_empty() {
        want.push("lo".into());
    }
    // Devices: previously published ones (refreshed), then the new ones.
    let mut entries: Vec<Entry> = old.clone();
    // The devices named now take the transport asked for (tcp unless said); the others keep
    // theirs.
    for n in &want {
        match entries.iter_mut().find(|e| &e.netdev == n) {
            Some(e) => e.transport = transport.to_string(),
            None => entries.push(Entry {
                ibdev: ibdev_for(n),
                netdev: n.clone(),
                uverbs: u32::MAX,
                rootless,
                transport: transport.to_string(),
            }),
        }
    }
    let mut netdevs = Vec::new();
    let mut kept = Vec::new();
    for e in entries {
        match netdev::lookup(&paths.host_sysfs, &e.netdev) {
            Ok(nd) => {
                netdevs.push(nd);
                kept.push(e);
            }
            Err(msg) if want.contains(&e.netdev) => return fail(format!("up: {msg}")),
            Err(msg) => eprintln!("uiw: up: dropping {}: {msg}", e.ibdev),
        }
    }
    let mut entries = kept;

    // Allocate nodes: keep each device's index when still valid, else the lowest free one.
    // Rootless: an index whose node does not exist at all (the shim answers only for absent
    // nodes) or is a uiw node (opens as /dev/null all the same).
    let kernel = tree::kernel_uverbs(&paths.host_sysfs);
    let mut taken: Vec<u32> = Vec::new();
    #[allow(clippy::needless_range_loop)]
    for i in 0..entries.len() {
        let cur = entries[i].uverbs;
        let usable = |n: u32, taken: &Vec<u32>| {
            !kernel.contains(&n) && !taken.contains(&n) && nodes::shape(&paths.node(n)) != nodes::Shape::Foreign
        };
        let n = if cur != u32::MAX && usable(cur, &taken) {
            cur
        } else {
            let mut n = 0;
            while !usable(n, &taken) {
                n += 1;
            }
            n
        };
        taken.push(n);
        entries[i].uverbs = n;
        entries[i].rootless = rootless;
    }
    let mut devices = Vec::new();
    for (e, nd) in entries.iter().zip(netdevs) {
        let rdev = match &reg {
            // The shim opens /dev/null for the node: its numbers are what libibverbs checks.
            None => (1, 3),
            Some(reg) => {
                let node = paths.node(e.uverbs);
                let rdev = match nodes::ensure(&node) {
                    Ok(r) => r,
                    Err(nodes::NodeError::NeedRoot(p)) => return fail(need_root_msg(&p)),
                    Err(nodes::NodeError::Io(p, err)) => return Err(io_fail("up: cannot create", &p, err)),
                };
                reg.register(&format!("uverbs{}", e.uverbs), &paths.state)
                    .map_err(|err| io_fail("up: cannot register node in", &paths.registry, err))?;
                rdev
            }
        };
        devices.push(tree::Device { ibdev: e.ibdev.clone(), uverbs: e.uverbs, rdev, netdev: nd, transport: e.transport.clone() });
    }
    let mirror = tree::scan_kernel(&paths.host_sysfs, &devices);
    tree::publish(&paths.sysfs(), &devices, &mirror, &paths.host_sysfs).map_err(|e| io_fail("up: cannot write", &paths.sysfs(), e))?;
    state::write_manifest(&paths.manifest(), &entries).map_err(|e| io_fail("up: cannot write", &paths.manifest(), e))?;
    // Nodes an earlier `up` of this state dir used and no longer does.
    if let Some(reg) = &reg {
        for o in old.iter().filter(|o| !o.rootless) {
            if !entries.iter().any(|e| e.uverbs == o.uverbs) {
                release_node(paths, reg, o.uverbs);
            }
        }
    }
    // Statistics files of the processes using the devices (uiw stat): any user's programs
    // may write there, as in /tmp.
    if !paths.stats().is_dir() && fs::create_dir(paths.stats()).is_ok() {
        use std::os::unix::fs::PermissionsExt;
        let _ = fs::set_permissions(paths.stats(), fs::Permissions::from_mode(0o1777));
    }
    let missing = link_libs(paths);
    if verbose {
        for d in &devices {
            println!("{}", show_line(&paths.sysfs().join("class/infiniband").join(&d.ibdev), &d.ibdev, false));
        }
        for m in missing {
            eprintln!("uiw: note: {m}");
        }
        if rootless {
            eprintln!("uiw: {ROOTLESS_NOTE}\nuiw: state directory: {}", paths.state.display());
        }
    }
    Ok(())
}

fn release_node(paths: &Paths, reg: &nodes::Registry, n: u32) {
    let name = format!("uverbs{n}");
    reg.unregister(&name, &paths.state);
    if reg.users(&name).is_empty() {
        nodes::remove(&paths.node(n));
    }
}

/// (Re)create `<state>/lib/{libuiw-rdmavN.so (every N of state::provider_links),
/// libuiw_preload.so,rdmacm/librdmacm.so.1}` as symlinks to the built libraries. Returns notes about what could not be found (the
/// librdmacm drop-in is optional: without it rdma_cm programs use the system's).
fn link_libs(paths: &Paths) -> Vec<String> {
    let mut notes = Vec::new();
    let lib = paths.lib();
    let _ = fs::create_dir_all(&lib);
    let provider = "provider libuiw_rdmav34.so (cargo build -p uiw-provider)";
    let mut wanted: Vec<(String, &[&str], &str)> = Vec::new();
    for (i, link) in state::provider_links().into_iter().enumerate() {
        // One note for a missing provider, not one per name.
        wanted.push((link, libs::PROVIDER_FILES, if i == 0 { provider } else { "" }));
    }
    wanted.push((state::PRELOAD_NAME.into(), libs::PRELOAD_FILES, "preload shim libuiw_preload.so (cargo build -p uiw-preload)"));
    wanted.push((state::RDMACM_LINK.into(), libs::RDMACM_FILES, ""));
    for (link, names, what) in wanted {
        let dst = lib.join(&link);
        if let Some(d) = dst.parent() {
            let _ = fs::create_dir_all(d);
        }
        match libs::find(paths, names) {
            Some(src) => {
                if fs::read_link(&dst).ok().as_deref() == Some(src.as_path()) {
                    continue;
                }
                let tmp = dst.with_file_name(format!(".{}.tmp", dst.file_name().unwrap_or_default().to_string_lossy()));
                let _ = fs::remove_file(&tmp);
                if std::os::unix::fs::symlink(&src, &tmp).and_then(|_| fs::rename(&tmp, &dst)).is_err() {
                    notes.push(format!("cannot link {} -> {}", dst.display(), src.display()));
                }
            }
            None => {
                if !dst.exists() && !what.is_empty() {
                    notes.push(format!(
                        "{what} not found next to uiw, in $UIW_LIBDIR or in the source tree's target/; programs will see no uiw device until it is built"
                    ));
                }
            }
        }
    }
    notes
}

fn cmd_down(paths: &Paths, which: Vec<String>) -> Res {
    let old = state::read_manifest(&paths.manifest());
    if old.is_empty() {
        // Nothing published; still clean up leftovers of an interrupted `up`.
        remove_state(paths);
        return Ok(());
    }
    let (gone, keep): (Vec<Entry>, Vec<Entry>) =
        old.into_iter().partition(|e| which.is_empty() || which.contains(&e.netdev));
    // Rootless devices have no node and no registry entry.
    let reg = if gone.iter().all(|e| e.rootless) {
        None
    } else {
        Some(nodes::Registry::open_locked(&paths.registry).map_err(|e| io_fail("down: cannot open node registry", &paths.registry, e))?)
    };
    let release = |gone: &[Entry]| {
        if let Some(reg) = &reg {
            for e in gone.iter().filter(|e| !e.rootless) {
                release_node(paths, reg, e.uverbs);
            }
        }
    };
    for w in &which {
        if !gone.iter().any(|e| &e.netdev == w) {
            eprintln!("uiw: down: {} is not published", ibdev_for(w));
        }
    }
    if keep.is_empty() {
        let _ = fs::remove_file(paths.manifest());
        release(&gone);
        remove_state(paths);
        return Ok(());
    }
    state::write_manifest(&paths.manifest(), &keep).map_err(|e| io_fail("down: cannot write", &paths.manifest(), e))?;
    release(&gone);
    drop(reg);
    // Rebuild the tree from what is left (also refreshes it).
    cmd_up(paths, Vec::new(), false, false, Transport::Tcp)
}

fn remove_state(paths: &Paths) {
    let _ = fs::remove_dir_all(paths.sysfs());
    let _ = fs::remove_dir_all(paths.state.join(".sysfs.new"));
    let _ = fs::remove_dir_all(paths.state.join(".sysfs.old"));
    let _ = fs::remove_dir_all(paths.lib());
    let _ = fs::remove_dir_all(paths.stats());
    let _ = fs::remove_file(paths.manifest());
    let _ = fs::remove_dir(&paths.state);
}

fn read1(p: &Path) -> String {
    fs::read_to_string(p).map(|s| s.trim_end().to_string()).unwrap_or_default()
}

/// "4: ACTIVE" -> "ACTIVE"; "5: LinkUp" -> "LINK_UP" (rdma tool spelling).
fn state_word(s: &str) -> String {
    let w = s.split_once(": ").map(|x| x.1).unwrap_or(s);
    let mut out = String::new();
    let mut prev_lower = false;
    for c in w.chars() {
        if c.is_ascii_uppercase() && prev_lower {
            out.push('_');
        }
        prev_lower = c.is_ascii_lowercase();
        if c == ' ' {
            out.push('_');
        } else {
            out.push(c.to_ascii_uppercase());
        }
    }
    if out.is_empty() {
        "UNKNOWN".into()
    } else {
        out
    }
}

fn show_line(dev: &Path, ibdev: &str, kernel: bool) -> String {
    let mut lines = Vec::new();
    let mut ports: Vec<String> = fs::read_dir(dev.join("ports"))
        .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    ports.sort_by_key(|p| p.parse::<u32>().unwrap_or(0));
    for p in ports {
        let pd = dev.join("ports").join(&p);
        let mut l = format!(
            "link {ibdev}/{p} state {} physical_state {}",
            state_word(&read1(&pd.join("state"))),
            state_word(&read1(&pd.join("phys_state")))
        );
        let mut nd = read1(&dev.join("uiw/netdev"));
        if nd.is_empty() {
            nd = read1(&pd.join("gid_attrs/ndevs/0"));
        }
        if !nd.is_empty() {
            l.push_str(&format!(" netdev {nd}"));
        }
        let tr = read1(&dev.join("uiw/transport"));
        if !tr.is_empty() {
            l.push_str(&format!(" transport {tr}"));
        }
        if kernel {
            l.push_str(" (kernel)");
        }
        lines.push(l);
    }
    lines.join("\n")
}

fn cmd_show(paths: &Paths, details: bool) -> Res {
    let entries = state::read_manifest(&paths.manifest());
    let root = paths.sysfs().join("class/infiniband");
    if entries.is_empty() {
        eprintln!("uiw: no uiw device published from {}; publish one with: sudo uiw up", paths.state.display());
    }
    for e in &entries {
        let d = root.join(&e.ibdev);
        println!("{}", show_line(&d, &e.ibdev, false));
        if details {
            println!("    node /dev/infiniband/uverbs{} node_guid {} mtu {} ifindex {}",
                e.uverbs, read1(&d.join("node_guid")), read1(&d.join("uiw/mtu")), read1(&d.join("uiw/ifindex")));
            let n: usize = read1(&d.join("uiw/gid_tbl_len")).parse().unwrap_or(0);
            for i in 0..n {
                println!("    gid {i} {}", read1(&d.join(format!("ports/1/gids/{i}"))));
            }
        }
    }
    let mut others: Vec<String> = fs::read_dir(&root)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_type().map(|t| t.is_symlink()).unwrap_or(false))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    others.sort();
    for o in others {
        let l = show_line(&root.join(&o), &o, true);
        if !l.is_empty() {
            println!("{l}");
        }
    }
    Ok(())
}

/// The variables for `env` and `run`: (name, value to set, how to combine with an existing value).
#[derive(Debug)]
enum Join {
    Replace,
    /// append to an existing value with this separator
    Append(&'static str),
    /// prepend to an existing value with this separator
    Prepend(&'static str),
    /// set only where the variable is not set at all (a default the user may override)
    Default,
}

/// libfabric's rxm (`FI_PROVIDER="verbs;ofi_rxm"`, how MPI and other libfabric applications use
/// verbs devices) moves messages above its eager limit (16 KiB) and up to this one by
/// segmentation and reassembly: copied through 16 KiB bounce buffers on both sides, each
/// segment a Send. At the eager limit, rxm sends them by rendezvous instead: the receiver
/// reads the data with one RDMA Read, straight between the two applications' buffers. uiw's
/// memory registration costs no pinning, and the bounce copies take the CPUs the data path
/// needs: 64 KiB Open MPI messages moved 3.05-3.36 GB/s this way against 1.63-1.68 with rxm's
/// default 128 KiB (interleaved runs, 2 CPUs).
const RXM_SAR_LIMIT: (&str, &str) = ("FI_OFI_RXM_SAR_LIMIT", "16384");

fn uiw_env(paths: &Paths) -> Res<Vec<(&'static str, String, Join)>> {
    let writable = uiw_kabi::sys::is_writable(&paths.state);
    let notes = if writable {
        link_libs(paths)
    } else {
        Vec::new()
    };
    for n in notes {
        eprintln!("uiw: note: {n}");
    }
    let mut v = vec![("SYSFS_PATH", paths.sysfs().display().to_string(), Join::Replace)];
    if libs::installed(paths).is_none() {
        v.push(("RDMAV_DRIVERS", paths.lib().join("libuiw").display().to_string(), Join::Append(":")));
    }
    v.push(("LD_PRELOAD", paths.lib().join(state::PRELOAD_NAME).display().to_string(), Join::Append(" ")));
    // The librdmacm drop-in: a directory `rdmacm` next to whichever provider we use, else
    // the link link_libs made in <state>/lib/rdmacm.
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Ok(p) = fs::canonicalize(paths.lib().join(state::PROVIDER_LINK)) {
        if let Some(d) = p.parent() {
            dirs.push(d.to_path_buf());
        }
    }
    if paths.lib().join(state::RDMACM_LINK).is_file() {
        dirs.push(paths.lib());
    }
    dirs.extend(libs::search_dirs(paths));
    if let Some(d) = dirs.iter().map(|d| d.join("rdmacm")).find(|d| d.is_dir()) {
        let d = fs::canonicalize(&d).unwrap_or(d);
        v.push(("LD_LIBRARY_PATH", d.display().to_string(), Join::Prepend(":")));
    }
    v.push((RXM_SAR_LIMIT.0, RXM_SAR_LIMIT.1.to_string(), Join::Default));
    Ok(v)
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

fn cmd_env(paths: &Paths) -> Res {
    if state::read_manifest(&paths.manifest()).is_empty() {
        eprintln!("uiw: warning: no uiw device published from {}; publish one with: sudo uiw up", paths.state.display());
    }
    for (k, v, j) in uiw_env(paths)? {
        let q = shell_quote(&v);
        match j {
            Join::Replace => println!("export {k}={q}"),
            Join::Append(sep) => println!("export {k}=\"${{{k}:+${k}{sep}}}\"{q}"),
            Join::Prepend(sep) => println!("export {k}={q}\"${{{k}:+{sep}${k}}}\""),
            Join::Default => println!("[ -n \"${{{k}+set}}\" ] || export {k}={q}"),
        }
    }
    Ok(())
}

fn cmd_run(paths: &Paths, rest: Vec<OsString>) -> Res {
    let mut argv = rest;
    if argv.first().is_some_and(|a| a == "--") {
        argv.remove(0);
    }
    if argv.is_empty() {
        return usage("run: no command given (uiw run -- CMD [ARGS]...)");
    }
    if state::read_manifest(&paths.manifest()).is_empty() {
        eprintln!("uiw: run: no device published yet; publishing uiw_lo (uiw up)");
        cmd_up(paths, Vec::new(), false, false, Transport::Tcp)?;
    }
    let mut cmd = std::process::Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    for (k, v, j) in uiw_env(paths)? {
        let cur = std::env::var(k).unwrap_or_default();
        let parts_contain = |sep: &str| cur.split(sep).any(|p| p == v);
        let val = match j {
            Join::Default if std::env::var_os(k).is_some() => continue,
            Join::Replace | Join::Default => v,
            Join::Append(_) | Join::Prepend(_) if cur.is_empty() => v,
            Join::Append(sep) if parts_contain(sep) => cur,
            Join::Prepend(sep) if parts_contain(sep) => cur,
            Join::Append(sep) => format!("{cur}{sep}{v}"),
            Join::Prepend(sep) => format!("{v}{sep}{cur}"),
        };
        cmd.env(k, val);
    }
    use std::os::unix::process::CommandExt;
    let e = cmd.exec();
    Err(Fail(if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 }, format!("run: cannot execute {:?}: {e}", argv[0])))
}

fn copy_atomic(src: &Path, dst: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = dst.with_file_name(format!(".{}.uiw-tmp", dst.file_name().unwrap_or_default().to_string_lossy()));
    fs::copy(src, &tmp)?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o644))?;
    fs::rename(&tmp, dst)
}

/// Where `uiw install` puts things: the provider in libibverbs' provider directory, the
/// shim and the librdmacm drop-in in the private `<libdir>/uiw/` (the drop-in as
/// `rdmacm/librdmacm.so.1`, reached only through `uiw run`'s `LD_LIBRARY_PATH`: the
/// system's librdmacm is not touched), and the driver file. The provider is also linked
/// there under every other name of `state::provider_links`.
struct Targets {
    provider: PathBuf,
    shim: PathBuf,
    rdmacm: PathBuf,
    driver: PathBuf,
}

fn install_targets(paths: &Paths, dir: Option<PathBuf>) -> Res<Targets> {
    let pdir = match dir {
        Some(d) => d,
        None => match libs::provider_dir(paths) {
            Some(d) => d,
            None => return fail("cannot find libibverbs' provider directory (is libibverbs installed?); pass --provider-dir DIR"),
        },
    };
    let private = pdir.parent().map(|p| p.join("uiw")).unwrap_or_else(|| pdir.join("uiw"));
    Ok(Targets {
        provider: pdir.join(state::PROVIDER_LINK),
        shim: private.join(state::PRELOAD_NAME),
        rdmacm: private.join("rdmacm/librdmacm.so.1"),
        driver: paths.rooted("/etc/libibverbs.d/uiw.driver"),
    })
}

fn cmd_install(paths: &Paths, dir: Option<PathBuf>) -> Res {
    let t = install_targets(paths, dir)?;
    let Some(src) = libs::find(paths, &["libuiw_rdmav34.so"]) else {
        return fail("install: provider libuiw_rdmav34.so not found (cargo build --release -p uiw-provider, or set UIW_LIBDIR)");
    };
    let perm = |e: std::io::Error, p: &Path| -> Fail {
        if matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS)) {
            Fail(1, format!("install: writing {} needs root: sudo uiw install", p.display()))
        } else {
            io_fail("install: cannot write", p, e)
        }
    };
    copy_atomic(&src, &t.provider).map_err(|e| perm(e, &t.provider))?;
    println!("installed {} (from {})", t.provider.display(), src.display());
    // The same file under the names newer libibverbs load (lib<name>-rdmav<PABI>.so): relative
    // links beside it, so the directory can move (DESTDIR, a package).
    for name in state::provider_links().iter().filter(|n| n.as_str() != state::PROVIDER_LINK) {
        let link = t.provider.with_file_name(name);
        let tmp = t.provider.with_file_name(format!(".{name}.uiw-tmp"));
        let _ = fs::remove_file(&tmp);
        std::os::unix::fs::symlink(state::PROVIDER_LINK, &tmp)
            .and_then(|_| fs::rename(&tmp, &link))
            .map_err(|e| perm(e, &link))?;
        println!("installed {} -> {}", link.display(), state::PROVIDER_LINK);
    }
    for (dst, names, what) in [
        (&t.shim, libs::PRELOAD_FILES, "preload shim libuiw_preload.so"),
        (&t.rdmacm, &["libuiw_rdmacm.so"][..], "librdmacm drop-in libuiw_rdmacm.so"),
    ] {
        match libs::find(paths, names) {
            Some(s) if s != *dst => {
                fs::create_dir_all(dst.parent().unwrap()).map_err(|e| perm(e, dst))?;
                copy_atomic(&s, dst).map_err(|e| perm(e, dst))?;
                println!("installed {}", dst.display());
            }
            Some(_) => {}
            None => eprintln!("uiw: install: note: {what} not found; not installed"),
        }
    }
    fs::create_dir_all(t.driver.parent().unwrap()).map_err(|e| perm(e, &t.driver))?;
    fs::write(&t.driver, "driver uiw\n").map_err(|e| perm(e, &t.driver))?;
    println!("installed {}", t.driver.display());
    Ok(())
}

fn cmd_uninstall(paths: &Paths, dir: Option<PathBuf>) -> Res {
    let dirs: Vec<PathBuf> = match dir {
        Some(d) => vec![d],
        None => libs::provider_dir_candidates(paths),
    };
    let links = state::provider_links();
    let mut targets = Vec::new();
    for d in &dirs {
        let names: Vec<PathBuf> = links.iter().map(|n| d.join(n)).filter(|p| p.symlink_metadata().is_ok()).collect();
        if names.is_empty() {
            continue;
        }
        targets.extend(names);
        if let Some(pd) = d.parent() {
            targets.push(pd.join("uiw").join(state::PRELOAD_NAME));
            targets.push(pd.join("uiw/rdmacm/librdmacm.so.1"));
        }
    }
    targets.push(paths.rooted("/etc/libibverbs.d/uiw.driver"));
    for t in targets {
        match fs::remove_file(&t) {
            Ok(()) => {
                println!("removed {}", t.display());
                // The private directories, once empty: <libdir>/uiw/rdmacm, <libdir>/uiw.
                let mut d = t.parent();
                while let Some(dir) = d.filter(|d| d.ends_with("uiw") || d.ends_with("uiw/rdmacm")) {
                    if fs::remove_dir(dir).is_err() {
                        break;
                    }
                    d = dir.parent();
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS)) => {
                return fail(format!("uninstall: removing {} needs root: sudo uiw uninstall", t.display()))
            }
            Err(e) => return Err(io_fail("uninstall: cannot remove", &t, e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn words() {
        assert_eq!(state_word("4: ACTIVE"), "ACTIVE");
        assert_eq!(state_word("5: LinkUp"), "LINK_UP");
        assert_eq!(state_word("3: Disabled"), "DISABLED");
        assert_eq!(state_word("1: DOWN"), "DOWN");
    }
    #[test]
    fn quote() {
        assert_eq!(shell_quote("a'b"), "'a'\\''b'");
    }
}
