//! The message-size sweep (2 B … 8 MiB): perftest's `-a` over uiw beside
//! tcpbench (and UCX unless `--quick`) at the same sizes, one pass, drawn
//! as two SVG charts.

use crate::bench::run_plan;
use crate::parse;
use crate::probes::{Kind, Lengths, Metric, Plan, Probe};
use crate::proc::{free_port, Cmd};
use crate::setup::Ctx;
use crate::svg::{Chart, Series};
use std::time::Duration;

/// 2^1 … 2^23, what perftest's `-a` runs.
pub fn sizes() -> Vec<u64> {
    (1..=23).map(|e| 1u64 << e).collect()
}

#[derive(Debug, Clone)]
pub struct SweepSeries {
    pub name: String,
    pub metric: Metric,
    pub side: String,
    pub points: Vec<(u64, f64)>,
    /// (size if the failure is per size, reason)
    pub failures: Vec<(Option<u64>, String)>,
    pub commands: Vec<String>,
}

impl SweepSeries {
    fn new(name: &str, metric: Metric, side: &str) -> Self {
        SweepSeries {
            name: name.into(),
            metric,
            side: side.into(),
            points: Vec::new(),
            failures: Vec::new(),
            commands: Vec::new(),
        }
    }
}

fn perftest_all(ctx: &Ctx, prog: &'static str, iters: u64) -> SweepSeries {
    let metric = if prog.ends_with("_lat") {
        Metric::Latency
    } else {
        Metric::Bandwidth
    };
    let side = Probe::new(Kind::Perftest { prog }, 8).side();
    let mut s = SweepSeries::new(&format!("uiw {prog}"), metric, side);
    let plan = (|| -> Result<Plan, String> {
        ctx.available(prog)?;
        let port = free_port()?;
        let mut args: Vec<String> = [
            "-d",
            &ctx.device,
            "-x",
            "0",
            "-p",
            &port.to_string(),
            "-a",
            "-F",
            "-n",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        args.push(iters.to_string());
        // CRC off, as the rows without `_crc`, whatever uiw's default.
        let server = ctx.uiw_cmd(prog, &args)?.env("UIW_CRC", "0");
        args.push("127.0.0.1".into());
        Ok(Plan {
            server: Some(server),
            client: ctx.uiw_cmd(prog, &args)?.env("UIW_CRC", "0"),
            port: Some(port),
            timeout: Duration::from_secs(400),
            audit_after: None,
            measured_by_server: false,
            client_netns: None,
        })
    })();
    let plan = match plan {
        Ok(p) => p,
        Err(e) => {
            s.failures.push((None, format!("unavailable: {e}")));
            return s;
        }
    };
    s.commands = plan
        .server
        .iter()
        .chain([&plan.client])
        .map(Cmd::display)
        .collect();
    eprintln!("uiw-bench: sweep {prog} -a …");
    let out = run_plan(ctx, &plan, &ctx.logs.join(format!("sweep-{prog}")));
    match out.stdout.and_then(|o| parse::perftest(&o)) {
        Ok(rows) => {
            for r in rows {
                let v = if metric == Metric::Bandwidth {
                    r.bw_avg_gbps
                } else {
                    r.t_typical_us.or(r.t_avg_us)
                };
                if let Some(v) = v {
                    s.points.push((r.bytes, v));
                }
            }
        }
        Err(e) => s.failures.push((None, format!("failed: {e}"))),
    }
    s
}

fn per_size(ctx: &Ctx, kind: Kind, len: &Lengths, name: &str) -> SweepSeries {
    let p0 = Probe::new(kind, 8);
    let mut s = SweepSeries::new(name, p0.metric(), p0.side());
    if let Err(e) = ctx.available(p0.tool()) {
        s.failures.push((None, format!("unavailable: {e}")));
        return s;
    }
    eprintln!("uiw-bench: sweep {name} …");
    for size in sizes() {
        let probe = Probe::new(kind, size);
        let r = free_port()
            .and_then(|port| probe.plan(ctx, len, port))
            .and_then(|plan| {
                if s.commands.is_empty() {
                    s.commands = plan
                        .server
                        .iter()
                        .chain([&plan.client])
                        .map(Cmd::display)
                        .collect();
                }
                let out = run_plan(ctx, &plan, &ctx.logs.join(format!("sweep-{}", probe.id())));
                probe.parse(&out.stdout?)
            });
        match r {
            Ok(v) => s.points.push((size, v)),
            Err(e) => s.failures.push((Some(size), e)),
        }
    }
    s
}

/// Runs the whole sweep.
pub fn run(ctx: &Ctx, quick: bool) -> Vec<SweepSeries> {
    let (bw_iters, lat_iters) = if quick { (200, 100) } else { (1000, 1000) };
    let bw_len = Lengths {
        secs: if quick { 0.3 } else { 1.0 },
        lat_iters: 1000,
        ucx_bytes: 256 << 20,
    };
    let pp_len = Lengths {
        secs: if quick { 0.2 } else { 0.5 },
        ..bw_len
    };
    let mut v = vec![
        perftest_all(ctx, "ib_write_bw", bw_iters),
        per_size(ctx, Kind::TcpBw, &bw_len, "TCP tcpbench bw"),
    ];
    if !quick {
        v.push(per_size(ctx, Kind::UcxPutBw, &bw_len, "UCX put_bw zcopy"));
    }
    v.push(perftest_all(ctx, "ib_write_lat", lat_iters));
    v.push(perftest_all(ctx, "ib_send_lat", lat_iters));
    v.push(per_size(
        ctx,
        Kind::TcpPp,
        &pp_len,
        "TCP busy-poll ping-pong",
    ));
    if !quick {
        let lat_len = Lengths {
            lat_iters: 1000,
            ..bw_len
        };
        v.push(per_size(ctx, Kind::UcxTagLat, &lat_len, "UCX tag_lat"));
    }
    v
}

/// The two charts of a sweep: bandwidth and latency against size.
pub fn charts(series: &[SweepSeries], cc: &str) -> (Chart, Chart) {
    let pick = |m: Metric| -> Vec<Series> {
        series
            .iter()
            .filter(|s| s.metric == m)
            .map(|s| Series {
                name: s.name.clone(),
                detail: s.side.clone(),
                points: s.points.iter().map(|&(x, y)| (x as f64, y)).collect(),
            })
            .collect()
    };
    (
        Chart {
            title: format!("Bandwidth vs message size, loopback, cc {cc}"),
            x_label: "message size (bytes, log scale)".into(),
            y_label: "bandwidth, GB/s (10^9 B/s)".into(),
            log_y: false,
            series: pick(Metric::Bandwidth),
        },
        Chart {
            title: format!("Latency vs message size, loopback, cc {cc}"),
            x_label: "message size (bytes, log scale)".into(),
            y_label: "latency, µs (log scale)".into(),
            log_y: true,
            series: pick(Metric::Latency),
        },
    )
}

/// `series,size,value,unit,side` lines.
pub fn csv(series: &[SweepSeries]) -> String {
    let mut s = String::from("series,size_bytes,value,unit,side\n");
    for ser in series {
        for (size, v) in &ser.points {
            s.push_str(&format!(
                "{},{size},{v},{},{}\n",
                crate::report::csv_field(&ser.name),
                ser.metric.unit(),
                crate::report::csv_field(&ser.side)
            ));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_sizes() {
        let s = sizes();
        assert_eq!(s.len(), 23);
        assert_eq!((s[0], s[22]), (2, 8 << 20));
    }

    #[test]
    fn charts_split_by_metric() {
        let mut a = SweepSeries::new("uiw ib_write_bw", Metric::Bandwidth, "requester");
        a.points = vec![(2, 0.1), (4, 0.2)];
        let b = SweepSeries::new(
            "TCP busy-poll ping-pong",
            Metric::Latency,
            "client, half round trip",
        );
        let (bw, lat) = charts(&[a.clone(), b], "cubic");
        assert_eq!(bw.series.len(), 1);
        assert_eq!(bw.series[0].name, "uiw ib_write_bw");
        assert_eq!(bw.series[0].detail, "requester");
        assert_eq!(bw.series[0].points, vec![(2.0, 0.1), (4.0, 0.2)]);
        assert!(lat.log_y && !bw.log_y);
        assert!(bw.title.contains("cubic"));
        assert_eq!(csv(&[a]), "series,size_bytes,value,unit,side\nuiw ib_write_bw,2,0.1,GB/s,requester\nuiw ib_write_bw,4,0.2,GB/s,requester\n");
    }
}
