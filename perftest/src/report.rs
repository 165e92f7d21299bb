//! The results: the Markdown table (ratios, targets, pass/miss), the raw
//! repetitions as CSV, everything as JSON.

use crate::bench::{fmt_num, ProbeResult};
use crate::json::Json;
use crate::rows::{Bound, Row};
use crate::stats::{judge, ratio, Summary};
use crate::sweep::SweepSeries;

/// What the header of the results says about the run.
#[derive(Debug, Clone)]
pub struct Meta {
    pub date: String,
    pub machine: String,
    pub cc: String,
    pub reps: usize,
    pub quick: bool,
    pub uiw_commit: String,
    /// Setup notes: installs, `uiw up`, …
    pub notes: Vec<String>,
}

/// What a row's uiw figure is compared with: a peer's measurement, or the bound on
/// the figure itself.
#[derive(Debug, Clone)]
pub enum Against<'a> {
    Peer(&'a ProbeResult),
    Bound(&'a Bound),
}

impl Against<'_> {
    fn summary(&self) -> Option<Summary> {
        match self {
            Against::Peer(p) => p.summary(),
            Against::Bound(b) => Some(Summary {
                median: b.value,
                min: b.value,
                max: b.value,
                n: 1,
            }),
        }
    }

    pub fn label(&self) -> String {
        match self {
            Against::Peer(p) => p.probe.label(),
            Against::Bound(b) => format!("bound ({})", b.source),
        }
    }

    /// The figure's cell (`scale` applies to a peer).
    pub fn cell(&self, unit: &str, scale: f64) -> String {
        match self {
            Against::Peer(p) => p.cell(scale),
            Against::Bound(b) => format!("{} {unit}", fmt_num(b.value)),
        }
    }

    pub fn side(&self) -> &'static str {
        match self {
            Against::Peer(p) => p.probe.side(),
            Against::Bound(_) => "—",
        }
    }

    /// For JSON: the peer probe's id, or `bound`.
    pub fn id(&self) -> String {
        match self {
            Against::Peer(p) => p.probe.id(),
            Against::Bound(_) => "bound".into(),
        }
    }
}

/// One comparison: a row's uiw figure against one peer, or against its bound.
#[derive(Debug, Clone)]
pub struct Comparison<'a> {
    pub row: &'a Row,
    pub uiw: &'a ProbeResult,
    pub peer: Against<'a>,
    pub scale: f64,
    pub ratio: Option<f64>,
    /// The ratio within each repetition that measured both (uiw's figure and the peer's,
    /// taken minutes apart at most): see [`paired_ratios`].
    pub per_rep: Vec<f64>,
    pub verdict: crate::stats::Verdict,
    pub target: Option<crate::stats::Target>,
}

fn find<'a>(results: &'a [ProbeResult], p: &crate::probes::Probe) -> &'a ProbeResult {
    results
        .iter()
        .find(|r| &r.probe == p)
        .expect("every row's probes were run")
}

fn scaled(s: Summary, k: f64) -> Summary {
    Summary {
        median: s.median * k,
        min: s.min * k,
        max: s.max * k,
        n: s.n,
    }
}

/// uiw's figure over the peer's (times `scale`) in each repetition where both ran. The
/// ratio of medians can pair figures from different moments when the machine changes speed
/// during a run (these 2-vCPU guests do, within seconds); the ratios within repetitions show
/// it as a spread.
pub fn paired_ratios(uiw: &ProbeResult, peer: &ProbeResult, scale: f64) -> Vec<f64> {
    uiw.samples
        .iter()
        .filter_map(|u| {
            let p = peer.samples.iter().find(|p| p.rep == u.rep)?;
            match (&u.value, &p.value) {
                (Ok(a), Ok(b)) if *b * scale > 0.0 => Some(a / (b * scale)),
                _ => None,
            }
        })
        .collect()
}

pub fn comparisons<'a>(rows: &'a [Row], results: &'a [ProbeResult]) -> Vec<Comparison<'a>> {
    let mut v = Vec::new();
    for row in rows {
        let uiw = find(results, &row.uiw);
        for p in &row.peers {
            let peer = find(results, &p.probe);
            let ratio = match (uiw.summary(), peer.summary()) {
                (Some(u), Some(q)) => ratio(&u, &scaled(q, p.scale)),
                _ => None,
            };
            v.push(Comparison {
                row,
                uiw,
                peer: Against::Peer(peer),
                scale: p.scale,
                ratio,
                per_rep: if peer.unavailable.is_none() { paired_ratios(uiw, peer, p.scale) } else { Vec::new() },
                verdict: judge(p.target, ratio),
                target: p.target,
            });
        }
        if let Some(b) = &row.bound {
            let against = Against::Bound(b);
            let ratio = match (uiw.summary(), against.summary()) {
                (Some(u), Some(q)) => ratio(&u, &q),
                _ => None,
            };
            v.push(Comparison {
                row,
                uiw,
                peer: against,
                scale: 1.0,
                ratio,
                per_rep: Vec::new(),
                verdict: judge(Some(b.target), ratio),
                target: Some(b.target),
            });
        }
    }
    v
}

fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// The congestion controls `ss` saw on the measured programs' sockets.
pub fn cc_seen(results: &[ProbeResult]) -> (Vec<String>, usize) {
    let mut seen: Vec<String> = Vec::new();
    let mut audited = 0;
    for r in results {
        if !r.cc_seen.is_empty() {
            audited += 1;
        }
        for c in &r.cc_seen {
            if !seen.contains(c) {
                seen.push(c.clone());
            }
        }
    }
    (seen, audited)
}

pub fn markdown(
    meta: &Meta,
    rows: &[Row],
    results: &[ProbeResult],
    sweep: &[SweepSeries],
) -> String {
    let mut s = String::new();
    s.push_str("# uiw-bench results\n\n");
    s.push_str(&format!("- **Date**: {}\n", meta.date));
    s.push_str(&format!("- **Machine**: {}\n", meta.machine));
    s.push_str(&format!("- **uiw**: {}\n", meta.uiw_commit));
    let (seen, audited) = cc_seen(results);
    let audit = if audited == 0 {
        "no bandwidth run lived long enough to be checked with `ss`".to_string()
    } else if seen == [meta.cc.clone()] {
        format!(
            "`ss` saw only `{}` on the sockets of {audited} bandwidth probes",
            meta.cc
        )
    } else {
        format!(
            "**warning**: `ss` saw {} on the sockets of {audited} bandwidth probes",
            seen.join(", ")
        )
    };
    s.push_str(&format!(
        "- **TCP congestion control: `{}` for every row** (forced on every program's sockets, uiw's \
         included, through LD_PRELOAD of cc_preload.so; checked before the run with cc_check; {audit})\n",
        meta.cc
    ));
    s.push_str(&format!(
        "- **Repetitions**: {}{}, interleaved (each repetition runs every probe once, uiw and peers \
         alternating); figures are medians (min–max)\n",
        meta.reps,
        if meta.quick { " (--quick: short runs, smoke test only)" } else { "" }
    ));
    s.push_str(
        "- **Units**: GB/s = 10^9 bytes/s (perftest's and UCX's MB/s are 2^20 B/s and were converted); \
         latency in µs, half round trip unless the side says otherwise\n",
    );
    s.push_str(
        "- **Ratio** = uiw median / peer median (or / the issue's bound, for a row judged on its own \
         figure); the issue's targets are marked pass/miss on it. **Per repetition**: the ratio \
         within each repetition (uiw's figure and the peer's, minutes apart at most); a spread there \
         means the machine changed speed during the run, and the medians may pair different \
         moments\n",
    );
    for n in &meta.notes {
        s.push_str(&format!("- {}\n", md_cell(n)));
    }
    s.push_str("\n| row | uiw | uiw side | peer | peer figure | peer side | uiw/peer | per repetition | target | verdict |\n");
    s.push_str("|---|---|---|---|---|---|---|---|---|---|\n");
    let mut last_row = String::new();
    for c in comparisons(rows, results) {
        let first = c.row.name != last_row;
        last_row = c.row.name.clone();
        let (name, uiw, uside) = if first {
            (
                format!("**{}**", c.row.name),
                c.uiw.cell(1.0),
                c.uiw.probe.side().to_string(),
            )
        } else {
            (String::new(), "〃".into(), String::new())
        };
        let mut peer = c.peer.label();
        if c.scale != 1.0 {
            peer.push_str(&format!(" ×{}", crate::stats::trim_float(c.scale)));
        }
        let per_rep = if c.per_rep.len() > 1 {
            c.per_rep.iter().map(|r| fmt_num(*r)).collect::<Vec<_>>().join(" ")
        } else {
            "—".into()
        };
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            name,
            md_cell(&uiw),
            uside,
            md_cell(&peer),
            md_cell(&c.peer.cell(c.uiw.probe.metric().unit(), c.scale)),
            if c.scale == 2.0 && c.peer.side().ends_with("half round trip") {
                c.peer
                    .side()
                    .replace("half round trip", "2 × half round trip")
            } else {
                c.peer.side().to_string()
            },
            c.ratio.map_or("n/a".into(), |r| format!("{}×", fmt_num(r))),
            per_rep,
            c.target.map_or("—".into(), |t| t.label()),
            c.verdict.label()
        ));
    }
    if !sweep.is_empty() {
        s.push_str("\n## Size sweep (one pass)\n\n");
        s.push_str("Charts: [bandwidth.svg](bandwidth.svg), [latency.svg](latency.svg); numbers in sweep.csv.\n\n");
        for ser in sweep {
            let pts = ser.points.len();
            let mut line = format!("- {} ({}): {pts} sizes", ser.name, ser.side);
            if let Some((size, why)) = ser.failures.first() {
                let at = size
                    .map(|z| format!(" at {}", crate::probes::size_label(z)))
                    .unwrap_or_default();
                line.push_str(&format!(
                    "; {} failure(s), first{at}: {}",
                    ser.failures.len(),
                    md_cell(why)
                ));
            }
            s.push_str(&line);
            s.push('\n');
        }
    }
    s.push_str("\n## Commands (first repetition; ports change per run)\n\n");
    for r in results {
        if r.commands.is_empty() {
            continue;
        }
        s.push_str(&format!("- {}:\n", r.probe.label()));
        for c in &r.commands {
            s.push_str(&format!("  - `{c}`\n"));
        }
    }
    for ser in sweep.iter().filter(|x| !x.commands.is_empty()) {
        s.push_str(&format!("- sweep {} (per size):\n", ser.name));
        for c in &ser.commands {
            s.push_str(&format!("  - `{c}`\n"));
        }
    }
    s
}

/// A CSV field, quoted when it has to be.
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// Every repetition of every probe.
pub fn csv(results: &[ProbeResult]) -> String {
    let mut s = String::from("probe,stack,label,unit,side,rep,value,status,detail\n");
    for r in results {
        let head = format!(
            "{},{},{},{},{}",
            r.probe.id(),
            r.probe.stack(),
            csv_field(&r.probe.label()),
            r.probe.metric().unit(),
            csv_field(r.probe.side())
        );
        if let Some(u) = &r.unavailable {
            s.push_str(&format!("{head},,,unavailable,{}\n", csv_field(u)));
            continue;
        }
        for smp in &r.samples {
            match &smp.value {
                Ok(v) => {
                    let d: Vec<String> = smp
                        .details
                        .iter()
                        .map(|(n, x)| format!("{n}={x}"))
                        .collect();
                    s.push_str(&format!("{head},{},{v},ok,{}\n", smp.rep + 1, d.join(" ")))
                }
                Err(e) => s.push_str(&format!(
                    "{head},{},,failed,{}\n",
                    smp.rep + 1,
                    csv_field(e)
                )),
            }
        }
    }
    s
}

fn summary_json(s: Option<Summary>) -> Json {
    match s {
        None => Json::Null,
        Some(s) => Json::obj([
            ("median", Json::Num(s.median)),
            ("min", Json::Num(s.min)),
            ("max", Json::Num(s.max)),
            ("n", Json::Num(s.n as f64)),
        ]),
    }
}

pub fn json(meta: &Meta, rows: &[Row], results: &[ProbeResult], sweep: &[SweepSeries]) -> Json {
    let probes = results
        .iter()
        .map(|r| {
            Json::obj([
                ("id", Json::str(r.probe.id())),
                ("label", Json::str(r.probe.label())),
                ("stack", Json::str(r.probe.stack())),
                ("size_bytes", Json::Num(r.probe.size as f64)),
                ("unit", Json::str(r.probe.metric().unit())),
                ("side", Json::str(r.probe.side())),
                (
                    "unavailable",
                    r.unavailable.clone().map_or(Json::Null, Json::Str),
                ),
                (
                    "samples",
                    Json::Arr(
                        r.samples
                            .iter()
                            .map(|s| match &s.value {
                                Ok(v) => Json::obj([
                                    ("rep", Json::Num((s.rep + 1) as f64)),
                                    ("value", Json::Num(*v)),
                                    (
                                        "details",
                                        Json::Obj(
                                            s.details
                                                .iter()
                                                .map(|(n, x)| (n.to_string(), Json::Num(*x)))
                                                .collect(),
                                        ),
                                    ),
                                ]),
                                Err(e) => Json::obj([
                                    ("rep", Json::Num((s.rep + 1) as f64)),
                                    ("failed", Json::str(e.clone())),
                                ]),
                            })
                            .collect(),
                    ),
                ),
                ("summary", summary_json(r.summary())),
                (
                    "cc_seen_by_ss",
                    Json::Arr(r.cc_seen.iter().cloned().map(Json::Str).collect()),
                ),
                (
                    "commands",
                    Json::Arr(r.commands.iter().cloned().map(Json::Str).collect()),
                ),
            ])
        })
        .collect();
    let comps = comparisons(rows, results)
        .iter()
        .map(|c| {
            Json::obj([
                ("row", Json::str(c.row.name.clone())),
                ("uiw", Json::str(c.uiw.probe.id())),
                ("peer", Json::str(c.peer.id())),
                ("peer_scale", Json::Num(c.scale)),
                ("ratio", Json::opt_num(c.ratio)),
                ("ratios_per_repetition", Json::Arr(c.per_rep.iter().map(|r| Json::Num(*r)).collect())),
                (
                    "target",
                    c.target.map_or(Json::Null, |t| Json::str(t.label())),
                ),
                ("verdict", Json::str(c.verdict.label().trim_matches('*'))),
            ])
        })
        .collect();
    let sw = sweep
        .iter()
        .map(|s| {
            Json::obj([
                ("series", Json::str(s.name.clone())),
                ("unit", Json::str(s.metric.unit())),
                ("side", Json::str(s.side.clone())),
                (
                    "points",
                    Json::Arr(
                        s.points
                            .iter()
                            .map(|&(z, v)| Json::Arr(vec![Json::Num(z as f64), Json::Num(v)]))
                            .collect(),
                    ),
                ),
                (
                    "failures",
                    Json::Arr(
                        s.failures
                            .iter()
                            .map(|(z, e)| {
                                Json::obj([
                                    ("size_bytes", z.map_or(Json::Null, |z| Json::Num(z as f64))),
                                    ("reason", Json::str(e.clone())),
                                ])
                            })
                            .collect(),
                    ),
                ),
            ])
        })
        .collect();
    Json::obj([
        ("date", Json::str(meta.date.clone())),
        ("machine", Json::str(meta.machine.clone())),
        ("uiw", Json::str(meta.uiw_commit.clone())),
        ("congestion_control", Json::str(meta.cc.clone())),
        ("repetitions", Json::Num(meta.reps as f64)),
        ("quick", Json::Bool(meta.quick)),
        (
            "notes",
            Json::Arr(meta.notes.iter().cloned().map(Json::Str).collect()),
        ),
        (
            "units",
            Json::obj([
                ("bandwidth", Json::str("GB/s = 1e9 B/s")),
                ("latency", Json::str("µs")),
            ]),
        ),
        ("probes", Json::Arr(probes)),
        ("comparisons", Json::Arr(comps)),
        ("sweep", Json::Arr(sw)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Sample;
    use crate::rows::select;

    fn results_for(
        rows: &[Row],
        f: impl Fn(&crate::probes::Probe) -> Vec<Result<f64, String>>,
    ) -> Vec<ProbeResult> {
        crate::rows::probe_order(rows)
            .into_iter()
            .map(|p| {
                let mut r = ProbeResult::new(p.clone());
                if p.tool() == "fi_rma_bw" {
                    r.unavailable = Some("not packaged".into());
                }
                r.samples = f(&p)
                    .into_iter()
                    .enumerate()
                    .map(|(rep, value)| Sample {
                        rep,
                        value,
                        details: Vec::new(),
                    })
                    .collect();
                r
            })
            .collect()
    }

    fn meta() -> Meta {
        Meta {
            date: "2026-11-22 02:00 UTC".into(),
            machine: "test".into(),
            cc: "cubic".into(),
            reps: 3,
            quick: false,
            uiw_commit: "abc".into(),
            notes: vec![],
        }
    }

    #[test]
    fn verdicts_in_table() {
        let rows = select(&["write_bw_64k".into(), "write_lat".into()]).unwrap();
        let results = results_for(&rows, |p| match p.id().as_str() {
            "uiw.ib_write_bw.65536" => vec![Ok(3.0), Ok(3.2), Ok(2.8)],
            "tcp.bw.65536" => vec![Ok(4.0), Ok(4.0), Ok(4.0)],
            "ucx.put_bw_zcopy.65536" => vec![Ok(1.0), Ok(1.0), Ok(1.0)],
            "uiw.ib_write_lat.8" => vec![Err("exit status 1: Couldn't post send".into())],
            _ => vec![Ok(2.0)],
        });
        let c = comparisons(&rows, &results);
        assert_eq!(c.len(), 8);
        assert_eq!(c[0].ratio, Some(0.75));
        assert_eq!(c[0].verdict, crate::stats::Verdict::Miss);
        assert_eq!(c[1].ratio, Some(3.0));
        assert_eq!(c[1].verdict, crate::stats::Verdict::Pass);
        assert_eq!(c[2].ratio, None, "unavailable peer");
        assert_eq!(c[4].verdict, crate::stats::Verdict::Unjudged);
        let md = markdown(&meta(), &rows, &results, &[]);
        assert!(md.contains("| **write_bw_64k** | 3.00 GB/s (2.80–3.20) | requester | TCP single stream 64 KiB (tcpbench bw) | 4.00 GB/s (4.00–4.00) | receiver | 0.75× | 0.75 0.80 0.70 | ≥ 0.9× | **miss** |"), "{md}");
        assert!(md.contains("| 〃 |  | UCX UCT tcp put_bw zcopy 64 KiB | 1.00 GB/s (1.00–1.00) | initiator | 3.00× | 3.00 3.20 2.80 | > 1× | **pass** |"), "{md}");
        assert!(md.contains("unavailable: not packaged"));
        assert!(md.contains("| **write_lat** | failed: exit status 1: Couldn't post send |"));
        assert!(md.contains("`cubic` for every row"));
        let csv = csv(&results);
        assert!(csv.contains(
            "uiw.ib_write_bw.65536,uiw,uiw ib_write_bw 64 KiB,GB/s,requester,2,3.2,ok,\n"
        ));
        assert!(csv.contains(",1,,failed,exit status 1: Couldn't post send\n"));
        let j = json(&meta(), &rows, &results, &[]).to_pretty();
        assert!(j.contains("\"verdict\": \"miss\""));
        assert!(j.contains("\"ratios_per_repetition\": [\n"), "{j}");
        // A repetition that failed on either side has no ratio of its own.
        let lat = results_for(&rows, |p| match p.id().as_str() {
            "uiw.ib_write_lat.8" => vec![Ok(8.0), Err("exit status 1".into()), Ok(12.0)],
            _ => vec![Ok(4.0), Ok(4.0), Err("timeout".into())],
        });
        let u = lat.iter().find(|r| r.probe.id() == "uiw.ib_write_lat.8").unwrap();
        let t = lat.iter().find(|r| r.probe.id().starts_with("tcp.pp_busy")).expect("the TCP ping-pong peer");
        assert_eq!(paired_ratios(u, t, 1.0), vec![2.0]);
        assert_eq!(paired_ratios(u, t, 2.0), vec![1.0]);
        assert!(j.contains("\"median\": 3"));
    }

    #[test]
    fn read_lat_peers_are_doubled() {
        let rows = select(&["read_lat".into()]).unwrap();
        let results = results_for(&rows, |p| {
            if p.stack() == "uiw" {
                vec![Ok(10.0)]
            } else {
                vec![Ok(2.5)]
            }
        });
        let c = comparisons(&rows, &results);
        assert_eq!(c[0].ratio, Some(2.0));
        let md = markdown(&meta(), &rows, &results, &[]);
        assert!(md.contains("TCP busy-poll ping-pong 8 B (tcpbench pp -b) ×2 | 5.00 µs | client, 2 × half round trip |"), "{md}");
    }

    #[test]
    fn placement_lag_is_judged_against_its_bound() {
        let rows = select(&["placement_lag".into()]).unwrap();
        let mut results = results_for(&rows, |_| vec![Ok(40.0), Ok(250.0), Ok(60.0)]);
        for (i, s) in results[0].samples.iter_mut().enumerate() {
            s.details = vec![("p50", 1.0 + i as f64), ("p99.9", 900.0), ("max", 3000.0)];
        }
        let c = comparisons(&rows, &results);
        assert_eq!(c.len(), 1, "no peer, one bound");
        assert_eq!(c[0].ratio, Some(0.6));
        assert_eq!(c[0].verdict, crate::stats::Verdict::Pass);
        let md = markdown(&meta(), &rows, &results, &[]);
        assert!(md.contains("| **placement_lag** | p99 60.0 µs (40.0–250); p50 2.00 µs, p99.9 900 µs, max 3000 µs (medians) | initiator's completion to data seen at the passive target, p99 | bound (issue 9: p99 well under 100 µs) | 100 µs | — | 0.60× | — | ≤ 1× | **pass** |"), "{md}");
        results[0].samples.truncate(2);
        results[0].samples[0].value = Ok(300.0);
        let c = comparisons(&rows, &results);
        assert_eq!(
            c[0].verdict,
            crate::stats::Verdict::Miss,
            "median p99 275 µs"
        );
        let csv = csv(&results);
        assert!(
            csv.contains(",1,300,ok,p50=1 p99.9=900 max=3000\n"),
            "{csv}"
        );
        let j = json(&meta(), &rows, &results, &[]).to_pretty();
        assert!(
            j.contains("\"peer\": \"bound\"") && j.contains("\"p99.9\": 900"),
            "{j}"
        );
    }

    #[test]
    fn csv_quoting() {
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"x\""), "\"say \"\"x\"\"\"");
        assert_eq!(csv_field("plain"), "plain");
    }
}
