//! Running probes: one server/client run with its deadline, its output
//! parsed and its sockets' congestion control looked at; and the
//! repetitions, interleaved.

use crate::parse;
use crate::probes::{Details, Lengths, Plan, Probe};
use crate::proc::{free_port, start, wait_listening, Cmd};
use crate::setup::Ctx;
use crate::stats::{summarize, Summary};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a server may take to start listening.
const LISTEN_LIMIT: Duration = Duration::from_secs(15);
/// How long a server may linger after its client finished.
const SERVER_GRACE: Duration = Duration::from_secs(5);

/// What one run gave: the client's output, or why it failed; plus the
/// congestion controls `ss` saw on the client's sockets.
#[derive(Debug)]
pub struct RunOutput {
    pub stdout: Result<String, String>,
    pub cc_seen: Vec<String>,
}

fn ss_snapshot(ctx: &Ctx, pid: u32) -> Vec<String> {
    match std::process::Command::new("ss").args(["-tinpH"]).output() {
        Ok(o) => parse::ss_congestion(&String::from_utf8_lossy(&o.stdout), pid, &ctx.known_cc),
        Err(_) => Vec::new(),
    }
}

fn failed(what: &str, o: &crate::proc::Outcome, timeout: Duration) -> String {
    let mut s = format!("{what} {}", o.describe(timeout));
    if let Some(r) = parse::failure_reason(&o.stderr, &o.stdout) {
        s.push_str(": ");
        s.push_str(&r);
    }
    s
}

/// Runs `plan` once. `log` is the base name of its log files.
pub fn run_plan(ctx: &Ctx, plan: &Plan, log: &Path) -> RunOutput {
    let mut cc_seen = Vec::new();
    let server = match &plan.server {
        None => None,
        Some(cmd) => match start(cmd, &log.with_file_name(format!("{}-server", name(log)))) {
            Ok(s) => Some(s),
            Err(e) => {
                return RunOutput {
                    stdout: Err(e),
                    cc_seen,
                }
            }
        },
    };
    let mut server = server;
    if let (Some(s), Some(port)) = (server.as_mut(), plan.port) {
        if !wait_listening(s, port, LISTEN_LIMIT) {
            let s = server.take().expect("server is Some");
            let o = s.finish(Instant::now() + SERVER_GRACE);
            let why = if o.timed_out {
                format!(
                    "server not listening on port {port} after {} s",
                    LISTEN_LIMIT.as_secs()
                )
            } else {
                failed("server", &o, SERVER_GRACE)
            };
            return RunOutput {
                stdout: Err(why),
                cc_seen,
            };
        }
    }
    let start_t = Instant::now();
    let deadline = start_t + plan.timeout;
    let mut client = match start(
        &plan.client,
        &log.with_file_name(format!("{}-client", name(log))),
    ) {
        Ok(c) => c,
        Err(e) => {
            if let Some(s) = server {
                s.finish(Instant::now());
            }
            return RunOutput {
                stdout: Err(e),
                cc_seen,
            };
        }
    };
    if let Some(after) = plan.audit_after {
        if !client.wait_until(start_t + after) {
            cc_seen = ss_snapshot(ctx, client.pid);
        }
    }
    let o = client.finish(deadline);
    let server_o = server.map(|s| s.finish(Instant::now() + SERVER_GRACE));
    let stdout = if o.success() {
        Ok(o.stdout)
    } else {
        let mut why = failed("", &o, plan.timeout).trim_start().to_string();
        if let Some(so) = server_o.filter(|so| !so.success()) {
            if let Some(r) = parse::failure_reason(&so.stderr, &so.stdout) {
                why.push_str(&format!(" (server: {r})"));
            }
        }
        Err(why)
    };
    RunOutput { stdout, cc_seen }
}

fn name(log: &Path) -> String {
    log.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// One repetition's figure (or failure) of a probe.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub rep: usize,
    pub value: Result<f64, String>,
    /// The run's further figures, named ([`Probe::details`]).
    pub details: Details,
}

/// Everything measured for one probe.
#[derive(Debug, Clone)]
pub struct ProbeResult {
    pub probe: Probe,
    /// Set when the probe could not run at all here.
    pub unavailable: Option<String>,
    pub samples: Vec<Sample>,
    pub cc_seen: Vec<String>,
    /// The command lines of the first run (server first, if any).
    pub commands: Vec<String>,
}

impl ProbeResult {
    pub fn new(probe: Probe) -> Self {
        ProbeResult {
            probe,
            unavailable: None,
            samples: Vec::new(),
            cc_seen: Vec::new(),
            commands: Vec::new(),
        }
    }

    pub fn summary(&self) -> Option<Summary> {
        if self.unavailable.is_some() {
            return None;
        }
        let ok: Vec<f64> = self
            .samples
            .iter()
            .filter_map(|s| s.value.as_ref().ok().copied())
            .collect();
        summarize(&ok)
    }

    /// Each detail's median over the successful runs, in the probe's order.
    pub fn detail_medians(&self) -> Details {
        let mut names: Vec<&'static str> = Vec::new();
        for s in &self.samples {
            for (n, _) in &s.details {
                if !names.contains(n) {
                    names.push(n);
                }
            }
        }
        names
            .into_iter()
            .filter_map(|n| {
                let v: Vec<f64> = self
                    .samples
                    .iter()
                    .filter_map(|s| s.details.iter().find(|d| d.0 == n).map(|d| d.1))
                    .collect();
                summarize(&v).map(|s| (n, s.median))
            })
            .collect()
    }

    fn first_failure(&self) -> Option<&str> {
        self.samples
            .iter()
            .find_map(|s| s.value.as_ref().err().map(String::as_str))
    }

    /// The table cell: `3.41 GB/s (3.30–3.52)`, with failures said.
    pub fn cell(&self, scale: f64) -> String {
        if let Some(u) = &self.unavailable {
            return format!("unavailable: {u}");
        }
        let unit = self.probe.metric().unit();
        let failures = self.samples.iter().filter(|s| s.value.is_err()).count();
        match self.summary() {
            None => match self.first_failure() {
                Some(r) => format!("failed: {r}"),
                None => "not run".into(),
            },
            Some(s) => {
                let mut c = if s.n > 1 {
                    format!(
                        "{} {unit} ({}–{})",
                        fmt_num(s.median * scale),
                        fmt_num(s.min * scale),
                        fmt_num(s.max * scale)
                    )
                } else {
                    format!("{} {unit}", fmt_num(s.median * scale))
                };
                if let Some(name) = self.probe.figure_name() {
                    c = format!("{name} {c}");
                }
                let details = self.detail_medians();
                if !details.is_empty() {
                    let d: Vec<String> = details
                        .iter()
                        .map(|(n, v)| format!("{n} {} {unit}", fmt_num(v * scale)))
                        .collect();
                    c.push_str(&format!("; {}", d.join(", ")));
                    if s.n > 1 {
                        c.push_str(" (medians)");
                    }
                }
                if failures > 0 {
                    c.push_str(&format!(
                        " [{failures} of {} runs failed: {}]",
                        self.samples.len(),
                        self.first_failure().unwrap_or("")
                    ));
                }
                c
            }
        }
    }
}

/// Three significant digits, at most two decimals: 12.3, 4.57, 0.93, 1234.
pub fn fmt_num(x: f64) -> String {
    let a = x.abs();
    if a >= 100.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// Runs `probes` `reps` times, interleaved: rep 1 runs every probe once in
/// order, then rep 2, …, so slow drifts of a noisy machine hit all alike.
pub fn run_interleaved(
    ctx: &Ctx,
    probes: &[Probe],
    reps: usize,
    len: &Lengths,
) -> Vec<ProbeResult> {
    let mut results: Vec<ProbeResult> = probes.iter().cloned().map(ProbeResult::new).collect();
    for r in results.iter_mut() {
        if let Err(e) = ctx.probe_available(&r.probe) {
            r.unavailable = Some(e);
        }
    }
    for rep in 0..reps {
        for r in results.iter_mut().filter(|r| r.unavailable.is_none()) {
            eprint!("uiw-bench: rep {}/{reps} {} … ", rep + 1, r.probe.id());
            let (value, details) = match run_probe_once(ctx, r, rep, len) {
                Ok((v, d)) => (Ok(v), d),
                Err(e) => (Err(e), Vec::new()),
            };
            match &value {
                Ok(v) => eprintln!("{} {}", fmt_num(*v), r.probe.metric().unit()),
                Err(e) => eprintln!("failed: {e}"),
            }
            r.samples.push(Sample {
                rep,
                value,
                details,
            });
        }
    }
    results
}

fn run_probe_once(
    ctx: &Ctx,
    r: &mut ProbeResult,
    rep: usize,
    len: &Lengths,
) -> Result<(f64, Details), String> {
    let port = free_port()?;
    let plan = r.probe.plan(ctx, len, port)?;
    if r.commands.is_empty() {
        r.commands = plan
            .server
            .iter()
            .chain([&plan.client])
            .map(Cmd::display)
            .collect();
    }
    let log = ctx.logs.join(format!("{}-rep{}", r.probe.id(), rep + 1));
    let out = run_plan(ctx, &plan, &log);
    for c in out.cc_seen {
        if !r.cc_seen.contains(&c) {
            r.cc_seen.push(c);
        }
    }
    let stdout = out.stdout?;
    let v = r
        .probe
        .parse(&stdout)
        .map_err(|e| format!("{e} (log: {}-client.out)", log.display()))?;
    Ok((v, r.probe.details(&stdout)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probes::Kind;

    fn res(values: &[Result<f64, &str>]) -> ProbeResult {
        let mut r = ProbeResult::new(Probe::new(Kind::TcpBw, 65536));
        r.samples = values
            .iter()
            .enumerate()
            .map(|(rep, v)| Sample {
                rep,
                value: v.map_err(|e| e.to_string()),
                details: Vec::new(),
            })
            .collect();
        r
    }

    #[test]
    fn cells() {
        assert_eq!(
            res(&[Ok(3.3), Ok(3.5), Ok(3.41)]).cell(1.0),
            "3.41 GB/s (3.30–3.50)"
        );
        assert_eq!(res(&[Ok(12.34)]).cell(1.0), "12.3 GB/s");
        assert_eq!(
            res(&[Ok(1.0), Err("exit status 1: boom")]).cell(1.0),
            "1.00 GB/s [1 of 2 runs failed: exit status 1: boom]"
        );
        assert_eq!(
            res(&[Err("timed out after 33 s")]).cell(1.0),
            "failed: timed out after 33 s"
        );
        let mut u = res(&[]);
        u.unavailable = Some("fi_rma_bw not installed".into());
        assert_eq!(u.cell(1.0), "unavailable: fi_rma_bw not installed");
        assert_eq!(res(&[Ok(1.5)]).cell(2.0), "3.00 GB/s");
    }

    #[test]
    fn placement_lag_cell_names_its_figure_and_details() {
        let mut r = ProbeResult::new(Probe::new(Kind::PlacementLag, 8));
        r.samples = [
            (12.0, 1.0, 4000.0),
            (10.0, 0.0, 3000.0),
            (14.0, 2.0, 5000.0),
        ]
        .iter()
        .enumerate()
        .map(|(rep, &(p99, p50, max))| Sample {
            rep,
            value: Ok(p99),
            details: vec![("p50", p50), ("max", max)],
        })
        .collect();
        assert_eq!(
            r.cell(1.0),
            "p99 12.0 µs (10.0–14.0); p50 1.00 µs, max 4000 µs (medians)"
        );
        assert_eq!(r.detail_medians(), vec![("p50", 1.0), ("max", 4000.0)]);
    }

    #[test]
    fn numbers() {
        assert_eq!(fmt_num(1234.5), "1234");
        assert_eq!(fmt_num(12.345), "12.3");
        assert_eq!(fmt_num(0.934), "0.93");
    }
}
