//! uiw-bench: perftest over uiw beside raw TCP, UCX and libfabric, in one
//! interleaved run under one TCP congestion control. `--help` is the manual.

#![forbid(unsafe_code)]

mod bench;
mod cli;
mod json;
mod parse;
mod probes;
mod proc;
mod report;
mod rows;
mod setup;
mod stats;
mod svg;
mod sweep;

use probes::Lengths;
use std::path::Path;
use std::time::Duration;

enum Fail {
    Usage(String),
    Setup(String),
}

fn main() {
    let code = match run() {
        Ok(()) => 0,
        Err(Fail::Usage(m)) => {
            eprintln!("uiw-bench: {m}");
            2
        }
        Err(Fail::Setup(m)) => {
            eprintln!("uiw-bench: setup failed: {m}");
            1
        }
    };
    std::process::exit(code);
}

fn write(path: &Path, text: &str) -> Result<(), Fail> {
    std::fs::write(path, text)
        .map_err(|e| Fail::Setup(format!("cannot write {}: {e}", path.display())))
}

fn uiw_commit() -> String {
    let dir = env!("CARGO_MANIFEST_DIR");
    std::process::Command::new("git")
        .args(["-C", dir, "describe", "--always", "--dirty", "--abbrev=10"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| format!("commit {}", String::from_utf8_lossy(&o.stdout).trim()))
        .unwrap_or_else(|| "commit unknown".into())
}

fn default_cc() -> String {
    if setup::available_cc().iter().any(|c| c == "cubic") {
        "cubic".into()
    } else {
        std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "cubic".into())
    }
}

fn run() -> Result<(), Fail> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = cli::parse(&args).map_err(Fail::Usage)?;
    if opts.help {
        print!("{}", cli::HELP);
        return Ok(());
    }
    let rows = rows::select(&opts.only).map_err(Fail::Usage)?;
    if opts.list {
        let all = rows::all();
        let w = all.iter().map(|r| r.name.len()).max().unwrap_or(0);
        for r in all {
            let mut peers: Vec<String> = r
                .peers
                .iter()
                .map(|p| match p.target {
                    Some(t) => format!("{} [{}]", p.probe.label(), t.label()),
                    None => p.probe.label(),
                })
                .collect();
            if let Some(b) = &r.bound {
                peers.push(format!(
                    "{} {} ({}) [{}]",
                    bench::fmt_num(b.value),
                    r.uiw.metric().unit(),
                    b.source,
                    b.target.label()
                ));
            }
            let opt = if r.opt_in { "(opt-in) " } else { "" };
            println!("{:<w$} {opt}{} vs {}", r.name, r.uiw.label(), peers.join("; "));
        }
        println!("{:<w$} the four veth_* rows (opt-in: root, two network namespaces)", rows::VETH_GROUP);
        println!("{:<w$} size sweep 2 B … 8 MiB", "sweep");
        return Ok(());
    }

    let out = &opts.out;
    let logs = out.join("logs");
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir_all(&logs)
        .map_err(|e| Fail::Setup(format!("cannot create {}: {e}", logs.display())))?;
    let logs = logs
        .canonicalize()
        .map_err(|e| Fail::Setup(format!("{}: {e}", logs.display())))?;
    let bin = out.join("bin");
    let (tcpbench, preload, cc_check) = setup::build_helpers(&bin, &logs).map_err(Fail::Setup)?;
    let (tcpbench, preload, cc_check) = (
        tcpbench.canonicalize().unwrap_or(tcpbench),
        preload.canonicalize().unwrap_or(preload),
        cc_check.canonicalize().unwrap_or(cc_check),
    );

    let cc = opts.cc.clone().unwrap_or_else(default_cc);
    let known_cc = setup::ensure_cc(&cc, &logs).map_err(Fail::Setup)?;
    let mut notes = Vec::new();
    if opts.install {
        notes.extend(setup::install_missing(&logs));
    }
    let mut tools = setup::check_tools(&tcpbench);
    let (placement_lag, built) = setup::build_placement_lag(&bin, &logs);
    tools.insert("placement_lag".into(), built);
    let uiw =
        setup::find_uiw(opts.uiw.as_deref()).and_then(|u| setup::uiw_up(&u, &logs).map(|()| u));
    let probes = rows::probe_order(&rows);
    let veth = if probes.iter().any(|p| p.on_veth()) {
        eprintln!("uiw-bench: setting up the veth test bed (two network namespaces)");
        let bed = setup::veth_up(&uiw, &bin, &logs);
        match &bed {
            Ok(b) => notes.push(format!(
                "veth rows: test bed `{}` (ci/testbed.sh): namespaces {} ({}) and {} ({}), each with a \
                 veth to a bridge, MTU {}, veth offloads: {}; device {} published in each namespace twice, \
                 with `--transport xdp` and with `--transport tcp` (own UIW_STATE_DIR each); \
                 client on A, server on B. The xdp transport's streams are uiw's userspace TCP \
                 (NewReno, RFC 5681/6582): the congestion control above applies to the kernel \
                 sockets only (the tcp transport's streams, raw TCP, perftest's exchange socket)",
                b.prefix,
                b.ns(setup::Host::A),
                b.addr_a,
                b.ns(setup::Host::B),
                b.addr_b,
                b.mtu,
                b.offloads(),
                b.dev
            )),
            Err(e) => notes.push(format!("veth rows unavailable: {e}")),
        }
        bed
    } else {
        Err("no veth row selected".into())
    };
    let mut ctx = setup::Ctx {
        cc: cc.clone(),
        known_cc,
        preload,
        tcpbench,
        placement_lag,
        uiw,
        device: opts.device.clone(),
        tools,
        logs,
        veth,
        mpi: None,
    };
    let check = ctx.cmd(&cc_check.display().to_string());
    setup::verify_cc(&check, &cc, "cc_preload.so", &ctx.logs.join("cc_check"))
        .map_err(Fail::Setup)?;
    if ctx.uiw.is_ok() {
        let under_uiw = ctx
            .uiw_cmd(&cc_check.display().to_string(), &[])
            .expect("uiw is Ok");
        if let Err(e) = setup::verify_cc(
            &under_uiw,
            &cc,
            "under `uiw run`",
            &ctx.logs.join("cc_check-uiw"),
        ) {
            ctx.uiw = Err(e);
        }
    }
    if let Err(e) = &ctx.uiw {
        notes.push(format!("uiw rows cannot run: {e}"));
    }
    if probes.iter().any(|p| p.tool() == "mpi_check") {
        let state = out.join("mpi-state");
        let mpi = setup::MpiNet::up(&ctx.uiw, &bin, &ctx.logs, &state);
        ctx.tools.insert("mpi_check".into(), mpi.as_ref().map(|_| ()).map_err(Clone::clone));
        match mpi {
            Ok(net) => {
                notes.push(format!(
                    "MPI rows: namespace {} with a veth (v0 10.77.0.1/24), uiw_v0 published there from {}",
                    net.netns,
                    net.state_dir.display()
                ));
                ctx.mpi = Some(net);
            }
            Err(e) => notes.push(format!("MPI rows cannot run: {e}")),
        }
    }
    let used: Vec<&str> = probes.iter().map(|p| p.tool()).collect();
    for (tool, r) in &ctx.tools {
        if let (Err(e), true) = (r, used.contains(&tool.as_str()) || (opts.sweep && tool != "mpi_check" && tool != "qperf")) {
            eprintln!("uiw-bench: {tool}: {e}");
        }
    }

    let meta = report::Meta {
        date: setup::now_utc(),
        machine: setup::machine(),
        cc: cc.clone(),
        reps: opts.reps,
        quick: opts.quick,
        uiw_commit: uiw_commit(),
        notes,
    };
    let len = if opts.quick {
        Lengths::quick()
    } else {
        Lengths::normal()
    };
    eprintln!(
        "uiw-bench: {} rows, {} repetition(s), cc {cc}, results in {}",
        rows.len(),
        opts.reps,
        out.display()
    );
    let results = bench::run_interleaved(&ctx, &probes, opts.reps, &len);

    let sweep = if opts.sweep {
        sweep::run(&ctx, opts.quick)
    } else {
        Vec::new()
    };
    if !sweep.is_empty() {
        write(&out.join("sweep.csv"), &sweep::csv(&sweep))?;
        let (bw, lat) = sweep::charts(&sweep, &cc);
        for (name, chart) in [("bandwidth", bw), ("latency", lat)] {
            let svg = out.join(format!("{name}.svg"));
            write(&svg, &svg::render(&chart))?;
            if setup::on_path("rsvg-convert").is_some() {
                let png = out.join(format!("{name}.png"));
                let cmd = proc::Cmd::new("rsvg-convert").args([
                    "-o",
                    &png.display().to_string(),
                    &svg.display().to_string(),
                ]);
                match proc::run_capture(
                    &cmd,
                    Duration::from_secs(60),
                    &ctx.logs.join(format!("rsvg-{name}")),
                ) {
                    Ok(o) if o.success() => {}
                    Ok(o) => eprintln!("uiw-bench: rsvg-convert {name}: {}", o.stderr.trim()),
                    Err(e) => eprintln!("uiw-bench: {e}"),
                }
            }
        }
    }

    let md = report::markdown(&meta, &rows, &results, &sweep);
    write(&out.join("results.md"), &md)?;
    write(&out.join("results.csv"), &report::csv(&results))?;
    write(
        &out.join("results.json"),
        &report::json(&meta, &rows, &results, &sweep).to_pretty(),
    )?;
    println!("{md}");
    eprintln!("uiw-bench: wrote {}/results.{{md,csv,json}}", out.display());
    Ok(())
}
