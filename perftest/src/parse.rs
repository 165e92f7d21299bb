//! Parsers for each tool's own output, converting to the benchmark's units:
//! bandwidth in GB/s (10^9 bytes per second), latency in µs.
//!
//! Unit facts (checked against the tools' sources and `--help`):
//! - perftest prints `BW average[MB/sec]` with MB = 2^20 bytes (its help:
//!   "MiB=2^20 byte"), or `[Gb/sec]` (10^9 bits) with `--report_gbits`. The
//!   header says which, and the parser reads the unit from it.
//! - perftest latency columns are µs; `ib_write_lat`/`ib_send_lat` print half
//!   the round trip, `ib_read_lat` the whole read round trip.
//! - tcpbench prints `GBps=` (10^9 B/s) and `half_rtt_us`.
//! - ucx_perftest prints bandwidth in "MB/s" computed as bytes/s / 2^20, and
//!   latency in µs (half the round trip for the ping-pong tests).
//! - fi_pingpong prints `usec/xfer` with two transfers per iteration (half the
//!   round trip) and `MB/sec` as bytes per µs (10^6 B/s).
//! - iperf3 `-J` gives `bits_per_second` (10^9 bits = 1 Gbit).
//! - mpi_check (perftest/mpi/mpi_check.c) prints its own µs (each round trip timed and
//!   halved) and MB/s with MB = 10^6 bytes.
//! - qperf prints `latency = X us` (one way: the round trip halved) with its unit scaled
//!   to the figure (`ns`, `us`, `ms`, `sec`).

pub const MIB: f64 = 1_048_576.0;
pub const GB: f64 = 1e9;

/// One size's line of a perftest result table.
#[derive(Debug, Clone, PartialEq)]
pub struct PerftestRow {
    pub bytes: u64,
    pub iterations: u64,
    /// Average bandwidth in GB/s (bw tools).
    pub bw_avg_gbps: Option<f64>,
    /// t_typical (median) in µs (lat tools, iteration mode).
    pub t_typical_us: Option<f64>,
    /// t_avg in µs (lat tools).
    pub t_avg_us: Option<f64>,
}

/// Splits perftest's header into column names, gluing the words that
/// perftest separates with spaces inside one column ("BW average[MB/sec]",
/// "99% percentile[usec]").
fn perftest_columns(header: &str) -> Vec<String> {
    let mut cols: Vec<String> = Vec::new();
    let mut glue = false;
    for w in header.split_whitespace() {
        if glue {
            let last = cols.last_mut().expect("glue follows a word");
            last.push(' ');
            last.push_str(w);
            glue = false;
            continue;
        }
        glue = w == "BW" || w.ends_with('%');
        cols.push(w.to_string());
    }
    cols
}

/// Conversion factor from a perftest bandwidth column's unit to GB/s.
fn perftest_bw_factor(col: &str) -> Result<f64, String> {
    if col.ends_with("[MB/sec]") || col.ends_with("[MiB/sec]") {
        Ok(MIB / GB)
    } else if col.ends_with("[Gb/sec]") {
        Ok(1.0 / 8.0)
    } else {
        Err(format!("unknown perftest bandwidth unit in column {col:?}"))
    }
}

/// Parses every result line of a perftest run (one for a single size, one
/// per size with `-a`).
pub fn perftest(out: &str) -> Result<Vec<PerftestRow>, String> {
    let mut rows = Vec::new();
    let mut cols: Option<Vec<String>> = None;
    for line in out.lines() {
        let t = line.trim();
        if t.starts_with("#bytes") {
            cols = Some(perftest_columns(t));
            continue;
        }
        let Some(cols) = cols.as_ref() else { continue };
        let fields: Vec<&str> = t.split_whitespace().collect();
        if fields.len() < 3 || fields[0].parse::<u64>().is_err() {
            continue;
        }
        let nums: Vec<Option<f64>> = fields.iter().map(|f| f.parse::<f64>().ok()).collect();
        let get = |name_start: &str| -> Option<f64> {
            let i = cols.iter().position(|c| c.starts_with(name_start))?;
            nums.get(i).copied().flatten()
        };
        let bw = match cols.iter().find(|c| c.starts_with("BW average")) {
            Some(c) => match get("BW average") {
                Some(v) => Some(v * perftest_bw_factor(c)?),
                None => None,
            },
            None => None,
        };
        let row = PerftestRow {
            bytes: fields[0].parse().unwrap_or(0),
            iterations: nums.get(1).copied().flatten().unwrap_or(0.0) as u64,
            bw_avg_gbps: bw,
            t_typical_us: get("t_typical"),
            t_avg_us: get("t_avg"),
        };
        if row.bw_avg_gbps.is_none() && row.t_typical_us.is_none() && row.t_avg_us.is_none() {
            continue;
        }
        rows.push(row);
    }
    if rows.is_empty() {
        return Err(if cols.is_none() {
            "no perftest result table in the output".into()
        } else {
            "perftest printed its table header but no result line".into()
        });
    }
    Ok(rows)
}

/// The single bandwidth figure of a one-size perftest bw run, GB/s.
pub fn perftest_bw(out: &str) -> Result<f64, String> {
    let rows = perftest(out)?;
    rows.last()
        .and_then(|r| r.bw_avg_gbps)
        .ok_or_else(|| "perftest result line has no BW average column".into())
}

/// The single latency figure of a one-size perftest lat run: t_typical (the
/// median), or t_avg when perftest ran in duration mode, µs.
pub fn perftest_lat(out: &str) -> Result<f64, String> {
    let rows = perftest(out)?;
    let r = rows.last().expect("perftest() returns at least one row");
    r.t_typical_us
        .or(r.t_avg_us)
        .ok_or_else(|| "perftest result line has no t_typical/t_avg column".into())
}

/// `key=value` from a tcpbench RESULT line.
fn kv(line: &str, key: &str) -> Option<f64> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}

fn result_line<'a>(out: &'a str, mode: &str) -> Result<&'a str, String> {
    out.lines()
        .find(|l| l.starts_with(&format!("RESULT {mode} ")))
        .ok_or_else(|| format!("no `RESULT {mode}` line in tcpbench output"))
}

/// tcpbench bw: receiver-side GB/s.
pub fn tcpbench_bw(out: &str) -> Result<f64, String> {
    let l = result_line(out, "bw")?;
    kv(l, "GBps").ok_or_else(|| format!("no GBps= in {l:?}"))
}

/// What `placement_lag` (examples/c/placement_lag.c) measured: the time from the Write's
/// completion at the initiator to the data being visible at the passive target, µs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lag {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

/// placement_lag's `lag_us: p50=… p99=… p99.9=… max=…` line. A run whose writes did not all
/// become visible prints no such line (and exits 1): that is an error here too.
pub fn placement_lag(out: &str) -> Result<Lag, String> {
    let l = out
        .lines()
        .find(|l| l.starts_with("lag_us: "))
        .ok_or("no `lag_us:` line in placement_lag output")?;
    let get = |k: &str| kv(l, k).ok_or_else(|| format!("no {k}= in {l:?}"));
    Ok(Lag {
        p50: get("p50")?,
        p99: get("p99")?,
        p999: get("p99.9")?,
        max: get("max")?,
    })
}

/// mpi_check's closing `N passed, N failed` line: an error unless it is there with 0 failed
/// (the first `not ok` line says why).
fn mpi_check_passed(out: &str) -> Result<(), String> {
    let line = out
        .lines()
        .rev()
        .find(|l| l.ends_with(" failed") && l.contains(" passed, "))
        .ok_or("no `N passed, N failed` line in mpi_check output")?;
    if line.ends_with(", 0 failed") {
        return Ok(());
    }
    let why = out.lines().find(|l| l.starts_with("not ok")).unwrap_or(line);
    Err(format!("mpi_check: {why}"))
}

/// `X us` after `key` in an mpi_check figure line.
fn mpi_us(l: &str, key: &str) -> Result<f64, String> {
    let mut w = l.split_whitespace().skip_while(|w| *w != key).skip(1);
    match (w.next().map(str::parse::<f64>), w.next()) {
        (Some(Ok(v)), Some("us")) => Ok(v),
        _ => Err(format!("no `{key} X us` in {l:?}")),
    }
}

/// What `mpi_check lat SIZE ITERS` measured: the half round trip, µs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MpiLat {
    pub median: f64,
    pub mean: f64,
    pub p99: f64,
}

/// `mpi_check: lat 8 B x 10000: half round trip median 7.481 us mean 19.181 us p99 21.547 us`,
/// in a run whose checks all passed.
pub fn mpi_lat(out: &str) -> Result<MpiLat, String> {
    mpi_check_passed(out)?;
    let l = out
        .lines()
        .find(|l| l.starts_with("mpi_check: lat "))
        .ok_or("no `mpi_check: lat` line in mpi_check output")?;
    Ok(MpiLat {
        median: mpi_us(l, "median")?,
        mean: mpi_us(l, "mean")?,
        p99: mpi_us(l, "p99")?,
    })
}

/// `mpi_check: bw 65536 B x 2048 messages, 64 in flight: 191.0 MB/s` (10^6 B/s), in a run
/// whose checks all passed: GB/s.
pub fn mpi_bw(out: &str) -> Result<f64, String> {
    mpi_check_passed(out)?;
    let l = out
        .lines()
        .find(|l| l.starts_with("mpi_check: bw "))
        .ok_or("no `mpi_check: bw` line in mpi_check output")?;
    let mut w = l.rsplit(' ');
    match (w.next(), w.next().map(str::parse::<f64>)) {
        (Some("MB/s"), Some(Ok(v))) => Ok(v * 1e6 / GB),
        _ => Err(format!("no `X MB/s` at the end of {l:?}")),
    }
}

/// qperf's result for `test`: the `latency = X unit` line under `test:`, in µs.
pub fn qperf_lat(out: &str, test: &str) -> Result<f64, String> {
    let mut lines = out
        .lines()
        .skip_while(|l| l.trim_end() != format!("{test}:"));
    if lines.next().is_none() {
        return Err(format!("no `{test}:` in qperf output"));
    }
    // The test's own lines are indented; the next test's name is not.
    for l in lines.take_while(|l| l.starts_with(' ')) {
        let Some((k, v)) = l.split_once('=') else { continue };
        if k.trim() != "latency" {
            continue;
        }
        let mut w = v.split_whitespace();
        let x: f64 = w
            .next()
            .and_then(|x| x.parse().ok())
            .ok_or_else(|| format!("no number in qperf's {l:?}"))?;
        let scale = match w.next() {
            Some("ns") => 1e-3,
            Some("us") => 1.0,
            Some("ms") => 1e3,
            Some("sec") | Some("s") => 1e6,
            u => return Err(format!("unknown unit {u:?} in qperf's {l:?}")),
        };
        return Ok(x * scale);
    }
    Err(format!("no `latency =` line for {test} in qperf output (the test failed?)"))
}

/// tcpbench pp: median half round trip, µs.
pub fn tcpbench_pp(out: &str) -> Result<f64, String> {
    let l = result_line(out, "pp")?;
    kv(l, "median").ok_or_else(|| format!("no median= in {l:?}"))
}

/// The `Final:` line of ucx_perftest: (typical latency µs, overall bandwidth
/// GB/s).
fn ucx_final(out: &str) -> Result<(f64, f64), String> {
    let l = out
        .lines()
        .find(|l| l.trim_start().starts_with("Final:"))
        .ok_or("no `Final:` line in ucx_perftest output")?;
    let f: Vec<f64> = l
        .split_whitespace()
        .skip(1)
        .map(|w| w.parse::<f64>())
        .collect::<Result<_, _>>()
        .map_err(|_| format!("unparsable ucx_perftest Final line {l:?}"))?;
    // iterations, lat typical, lat average, lat overall, bw average,
    // bw overall, msgrate average, msgrate overall
    if f.len() < 8 {
        return Err(format!(
            "ucx_perftest Final line has {} numbers, want 8",
            f.len()
        ));
    }
    Ok((f[1], f[5] * MIB / GB))
}

/// ucx_perftest latency tests: the typical (50th percentile) latency, µs.
pub fn ucx_lat(out: &str) -> Result<f64, String> {
    ucx_final(out).map(|x| x.0)
}

/// ucx_perftest bandwidth tests: overall bandwidth (whole run), GB/s.
pub fn ucx_bw(out: &str) -> Result<f64, String> {
    ucx_final(out).map(|x| x.1)
}

/// The result line under the fabtests header
/// `bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec`.
fn fabtests_line(out: &str) -> Result<Vec<String>, String> {
    let mut lines = out.lines();
    let mut header: Option<Vec<String>> = None;
    for l in lines.by_ref() {
        if l.trim_start().starts_with("bytes") && l.contains("usec/xfer") {
            header = Some(l.split_whitespace().map(String::from).collect());
            break;
        }
    }
    let header = header.ok_or("no fabtests result header (bytes ... usec/xfer) in the output")?;
    let data = lines
        .map(str::trim)
        .find(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|w| w.parse::<u64>().is_ok())
        })
        .ok_or("fabtests header without a result line")?;
    let fields: Vec<String> = data.split_whitespace().map(String::from).collect();
    if fields.len() != header.len() {
        return Err(format!(
            "fabtests result line {data:?} does not match its header"
        ));
    }
    Ok(header
        .into_iter()
        .zip(fields)
        .map(|(h, f)| format!("{h}={f}"))
        .collect())
}

fn fabtests_field(out: &str, col: &str) -> Result<f64, String> {
    let kvs = fabtests_line(out)?;
    kvs.iter()
        .find_map(|kv| kv.strip_prefix(col)?.strip_prefix('=')?.parse().ok())
        .ok_or_else(|| format!("no numeric {col} column in the fabtests result"))
}

/// fi_pingpong: µs per transfer (= half round trip).
pub fn fabtests_lat(out: &str) -> Result<f64, String> {
    fabtests_field(out, "usec/xfer")
}

/// fabtests bandwidth tools (fi_rma_bw): MB/sec with MB = 10^6, as GB/s.
pub fn fabtests_bw(out: &str) -> Result<f64, String> {
    fabtests_field(out, "MB/sec").map(|mb| mb * 1e6 / GB)
}

/// iperf3 -J (client): the receiver's `sum_received.bits_per_second`, GB/s.
pub fn iperf3_json(out: &str) -> Result<f64, String> {
    let at = out
        .find("\"sum_received\"")
        .ok_or("no sum_received in iperf3 JSON")?;
    let rest = &out[at..];
    let end = rest.find('}').unwrap_or(rest.len());
    let obj = &rest[..end];
    let k = obj
        .find("\"bits_per_second\"")
        .ok_or("no bits_per_second in iperf3 sum_received")?;
    let v = obj[k + "\"bits_per_second\"".len()..]
        .trim_start_matches(|c: char| c == ':' || c.is_whitespace());
    let num: String = v
        .chars()
        .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'))
        .collect();
    let bits: f64 = num
        .parse()
        .map_err(|_| format!("unparsable bits_per_second {num:?}"))?;
    Ok(bits / 8.0 / GB)
}

/// The congestion controls `ss -tinpH` shows for sockets of process `pid`.
/// `known` lists the names to look for (the kernel's available ones).
pub fn ss_congestion(out: &str, pid: u32, known: &[String]) -> Vec<String> {
    let tag = format!("pid={pid},");
    let mut found: Vec<String> = Vec::new();
    let mut mine = false;
    for line in out.lines() {
        // Socket lines start at column 0, their detail lines are indented.
        if !line.starts_with(char::is_whitespace) {
            mine = line.contains(&tag);
            continue;
        }
        if !mine {
            continue;
        }
        for w in line.split_whitespace() {
            if known.iter().any(|k| k == w) && !found.iter().any(|f| f == w) {
                found.push(w.to_string());
            }
        }
    }
    found
}

/// A short reason for a failed run: the first line of stderr (then stdout)
/// that says what went wrong, else the last non-empty stderr line.
pub fn failure_reason(stderr: &str, stdout: &str) -> Option<String> {
    let bad = |l: &&str| {
        let l = l.to_ascii_lowercase();
        [
            "couldn't",
            "could not",
            "failed",
            "error",
            "unable",
            "not supported",
            "refused",
            "cannot",
        ]
        .iter()
        .any(|w| l.contains(w))
    };
    // Lines that name the cause outright, before the generic words: mpi_check's failed
    // check, Open MPI's component selection (its other lines say "ORTE_ERROR_LOG").
    let telling = |l: &&str| l.starts_with("not ok") || l.contains("cannot be selected");
    let lines = || stderr.lines().chain(stdout.lines()).map(str::trim);
    let pick = lines()
        .find(telling)
        .or_else(|| lines().find(bad))
        .or_else(|| stderr.lines().map(str::trim).rfind(|l| !l.is_empty()))?;
    let mut s: String = pick.chars().take(120).collect();
    if pick.chars().count() > 120 {
        s.push('…');
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn placement_lag_line() {
        let out = include_str!("../fixtures/placement_lag_8.txt");
        let l = placement_lag(out).unwrap();
        assert!(
            close(l.p50, 0.0)
                && close(l.p99, 11.5)
                && close(l.p999, 3290.69)
                && close(l.max, 5152.68),
            "{l:?}"
        );
        assert!(placement_lag(
            "FAILED: write 7: its data was not visible at the target 1000 ms after its completion"
        )
        .unwrap_err()
        .contains("no `lag_us:` line"));
        assert!(placement_lag("lag_us: p50=1.0 max=2.0")
            .unwrap_err()
            .contains("no p99="));
    }

    #[test]
    fn perftest_columns_glue_words() {
        let h = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]";
        assert_eq!(
            perftest_columns(h.trim()),
            [
                "#bytes",
                "#iterations",
                "BW peak[MB/sec]",
                "BW average[MB/sec]",
                "MsgRate[Mpps]"
            ]
        );
        let h = "#bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";
        let c = perftest_columns(h);
        assert_eq!(c.len(), 9);
        assert_eq!(c[4], "t_typical[usec]");
        assert_eq!(c[7], "99% percentile[usec]");
    }

    #[test]
    fn perftest_write_bw_mib_to_gbps() {
        let out = include_str!("../fixtures/perftest_write_bw_64k.txt");
        let rows = perftest(out).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].bytes, 65536);
        let mb = rows[0].bw_avg_gbps.unwrap() * GB / MIB;
        let want_mib = first_data_column(out, 3);
        assert!(close(mb, want_mib), "{mb} vs {want_mib}");
        assert!(close(
            perftest_bw(out).unwrap(),
            want_mib * 1_048_576.0 / 1e9
        ));
    }

    /// The `col`th number of the first data line after the `#bytes` header,
    /// read independently of the parser under test.
    fn first_data_column(out: &str, col: usize) -> f64 {
        let mut seen = false;
        for l in out.lines() {
            if l.trim_start().starts_with("#bytes") {
                seen = true;
            } else if seen {
                if let Some(v) = l.split_whitespace().nth(col).and_then(|w| w.parse().ok()) {
                    return v;
                }
            }
        }
        panic!("no data line")
    }

    #[test]
    fn perftest_gbits_header() {
        let out = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n 1048576    1000             80.00              40.00                0.004768\n";
        assert!(close(perftest_bw(out).unwrap(), 5.0));
    }

    #[test]
    fn perftest_failed_run() {
        let out = include_str!("../fixtures/perftest_write_bw_eopnotsupp.txt");
        assert_eq!(
            perftest_bw(out).unwrap_err(),
            "perftest printed its table header but no result line"
        );
        assert_eq!(
            perftest_bw("").unwrap_err(),
            "no perftest result table in the output"
        );
    }

    #[test]
    fn perftest_lat_typical() {
        let out = include_str!("../fixtures/perftest_write_lat_8.txt");
        let v = perftest_lat(out).unwrap();
        assert!(close(v, first_data_column(out, 4)));
        let out = include_str!("../fixtures/perftest_send_lat_8.txt");
        assert!(close(perftest_lat(out).unwrap(), first_data_column(out, 4)));
        let out = include_str!("../fixtures/perftest_read_lat_8.txt");
        assert!(close(perftest_lat(out).unwrap(), first_data_column(out, 4)));
        // duration mode (-D) prints only t_avg
        let out = " #bytes        #iterations       t_avg[usec]    tps average\n 8             1353210          1.10           904455.93\n";
        assert!(close(perftest_lat(out).unwrap(), 1.10));
    }

    #[test]
    fn perftest_sweep_rows() {
        let out = include_str!("../fixtures/perftest_write_bw_all.txt");
        let rows = perftest(out).unwrap();
        assert_eq!(rows.first().unwrap().bytes, 2);
        assert_eq!(rows.last().unwrap().bytes, 8 << 20);
        assert_eq!(rows.len(), 23);
        assert!(rows.iter().all(|r| r.bw_avg_gbps.is_some()));
        let out = include_str!("../fixtures/perftest_write_lat_all.txt");
        let rows = perftest(out).unwrap();
        assert_eq!(rows.len(), 23);
        assert!(rows.iter().all(|r| r.t_typical_us.is_some()));
    }

    #[test]
    fn tcpbench_lines() {
        let bw = include_str!("../fixtures/tcpbench_bw_1m.txt");
        assert_eq!(tcpbench_bw(bw).unwrap(), 9.182);
        let one = include_str!("../fixtures/tcpbench_bw_2streams_1thread.txt");
        assert_eq!(tcpbench_bw(one).unwrap(), 4.454);
        let pp = include_str!("../fixtures/tcpbench_pp_8_busy.txt");
        assert_eq!(tcpbench_pp(pp).unwrap(), 1.30);
        let pp = include_str!("../fixtures/tcpbench_pp_8_blocking.txt");
        assert_eq!(tcpbench_pp(pp).unwrap(), 1.89);
        assert!(tcpbench_bw(pp).is_err());
        assert!(tcpbench_pp("connect: Connection refused\n").is_err());
    }

    #[test]
    fn ucx_final_lines() {
        let put = include_str!("../fixtures/ucx_put_bw_1m.txt");
        // Final: 2000 8038.762 209.725 6044.682 4768.14 165.43 4778 166
        assert!(close(ucx_bw(put).unwrap(), 165.43 * MIB / GB));
        let am = include_str!("../fixtures/ucx_am_lat_8.txt");
        assert_eq!(ucx_lat(am).unwrap(), 4.629);
        let tag = include_str!("../fixtures/ucx_tag_lat_8.txt");
        assert_eq!(ucx_lat(tag).unwrap(), 4.702);
        assert!(ucx_lat("Waiting for connection...\n").is_err());
    }

    #[test]
    fn fabtests_pingpong() {
        let out = include_str!("../fixtures/fi_pingpong_8.txt");
        assert_eq!(fabtests_lat(out).unwrap(), first_fabtests(out, 6));
        assert!(close(
            fabtests_bw(out).unwrap(),
            first_fabtests(out, 5) * 1e6 / 1e9
        ));
        let err = include_str!("../fixtures/fi_pingpong_not_connected.txt");
        assert!(fabtests_lat(err).is_err());
        assert_eq!(
            failure_reason(err, "").unwrap(),
            "[error] util/pingpong.c:1119: cq_readerr: Transport endpoint is not connected"
        );
    }

    fn first_fabtests(out: &str, col: usize) -> f64 {
        let l = out.lines().nth(1).unwrap();
        l.split_whitespace().nth(col).unwrap().parse().unwrap()
    }

    #[test]
    fn iperf3_receiver() {
        let j = include_str!("../fixtures/iperf3_64k.json");
        assert!(close(
            iperf3_json(j).unwrap(),
            81_262_511_501.401_93 / 8.0 / 1e9
        ));
        assert!(iperf3_json("{}").is_err());
    }

    #[test]
    fn ss_congestion_by_pid() {
        let ss = "ESTAB 0 0 127.0.0.1:40111 127.0.0.1:5555 users:((\"tcpbench\",pid=123,fd=4))\n\t cubic wscale:7,7 rto:201 rtt:0.02/0.01\nESTAB 0 0 127.0.0.1:5555 127.0.0.1:40111 users:((\"other\",pid=1234,fd=5))\n\t ts sack bbr wscale:7,7\nESTAB 0 0 127.0.0.1:1 127.0.0.1:2 users:((\"tcpbench\",pid=123,fd=6))\n\t ts sack cubic wscale:7,7\n";
        let known = vec!["reno".to_string(), "cubic".to_string(), "bbr".to_string()];
        assert_eq!(ss_congestion(ss, 123, &known), ["cubic"]);
        assert_eq!(ss_congestion(ss, 1234, &known), ["bbr"]);
        assert!(ss_congestion(ss, 9, &known).is_empty());
    }

    #[test]
    fn mpi_check_figures() {
        let out = include_str!("../fixtures/mpi_check_lat_8.txt");
        assert_eq!(
            mpi_lat(out).unwrap(),
            MpiLat { median: 7.481, mean: 19.181, p99: 21.547 }
        );
        assert!(mpi_bw(out).is_err(), "a lat run has no bw line");
        let out = include_str!("../fixtures/mpi_check_bw_64k.txt");
        assert!(close(mpi_bw(out).unwrap(), 0.191));
        // A failed check makes the run's figure an error, whatever it printed.
        let bad = out
            .replace("ok - rank 0: bw", "not ok - rank 1: bw")
            .replace("2 passed, 0 failed", "1 passed, 1 failed");
        let e = mpi_bw(&bad).unwrap_err();
        assert!(e.contains("not ok - rank 1: bw 65536 B"), "{e}");
        let cut: String = out.lines().take(2).collect::<Vec<_>>().join("\n");
        assert!(mpi_bw(&cut).unwrap_err().contains("passed"), "no summary line");
        // Open MPI that could not select the cm PML (libfabric's tcp excluded by default).
        let err = include_str!("../fixtures/mpi_pml_cm_not_selected.txt");
        assert!(mpi_lat("").is_err());
        assert_eq!(
            failure_reason(err, "").unwrap(),
            "[vm:28506] PML cm cannot be selected"
        );
    }

    #[test]
    fn qperf_latency() {
        let rc = include_str!("../fixtures/qperf_rc_lat_8.txt");
        assert_eq!(qperf_lat(rc, "rc_lat").unwrap(), 31.7);
        assert!(qperf_lat(rc, "tcp_lat").is_err());
        let poll = include_str!("../fixtures/qperf_rc_rdma_write_poll_lat_8.txt");
        assert_eq!(qperf_lat(poll, "rc_rdma_write_poll_lat").unwrap(), 832.0);
        let tcp = include_str!("../fixtures/qperf_tcp_lat_8.txt");
        assert_eq!(qperf_lat(tcp, "tcp_lat").unwrap(), 20.0);
        assert_eq!(qperf_lat("rc_lat:\n    latency  =  1.2 ms\n", "rc_lat").unwrap(), 1200.0);
        assert!(close(qperf_lat("tcp_lat:\n    latency  =  950 ns\n", "tcp_lat").unwrap(), 0.95));
        // A client whose server had no RDMA device: the test's name, then nothing.
        let failed = include_str!("../fixtures/qperf_rc_lat_no_device.txt");
        let e = qperf_lat(failed, "rc_lat").unwrap_err();
        assert!(e.contains("no `latency =` line"), "{e}");
    }

    #[test]
    fn reasons() {
        assert_eq!(
            failure_reason(" Couldn't post send: qp 0 scnt=0 \n Failed to complete run_iter_bw function successfully\n", "").unwrap(),
            "Couldn't post send: qp 0 scnt=0"
        );
        assert_eq!(failure_reason("", "").as_deref(), None);
        assert_eq!(
            failure_reason("\nsomething odd\n\n", "").unwrap(),
            "something odd"
        );
    }
}
