//! Acceptance test: the standard, unmodified rdma-core and perftest tools
//! move data over a published uiw device — `ibv_rc_pingpong` (RC Send/Recv,
//! with and without a completion channel, and with the `ibv_wr_*` API) and
//! perftest's `ib_{write,read,send}_{bw,lat}` and `ib_atomic_{bw,lat}` in
//! their default connection mode (`-x 0`: QPs connected by GID and QPN, no
//! rdma_cm).
//!
//! Each run is a pair of processes under `uiw run`: a server on a free TCP
//! port, then a client to 127.0.0.1. Both have a hard deadline; a hang kills
//! both and fails the test with both outputs. Runs are short (a few hundred
//! iterations) because these tests check behaviour, not performance: both
//! sides must exit 0, and the client's result table must show each size with
//! a nonzero bandwidth or a positive, finite latency.
//!
//! Needs `cargo build --workspace` first and root (see verbs_objects.rs);
//! without root, or without ibverbs-utils/perftest, the tests say why they
//! skip, and with `UIW_TEST_REQUIRE_ALL=1` (ci/test.sh as root) they fail.

use std::time::Duration;

use uiw_examples::pair::{free_port, run_pair, uiw_run, PairOutcome};
use uiw_examples::{
    device_lock, device_test_artifacts, have_program, out_dir, skip, Artifacts, Published,
};

/// The device every run uses and its GID index (127.0.0.1 as ::ffff:127.0.0.1).
const DEV: &str = "uiw_lo";
const GID_INDEX: &str = "0";

/// Hard deadline for one server/client pair. Generous (debug builds, a
/// loaded CI machine); runs normally take well under a second or two.
const PAIR_TIMEOUT: Duration = Duration::from_secs(60);

/// The checks every tool test shares; `None` means "skipped" (reason printed).
fn prepare(test: &str, tool: &str, package: &str) -> Option<Artifacts> {
    let artifacts = device_test_artifacts(test)?;
    if !have_program(tool) {
        skip(
            test,
            &format!("{tool} is not installed (apt-get install {package})"),
        );
        return None;
    }
    Some(artifacts)
}

/// Run `tool ARGS -p PORT` as a server and `tool ARGS -p PORT 127.0.0.1` as
/// its client, both under `uiw run`, and require both to exit 0.
fn run_tool(dev: &Published, tool: &str, args: &[&str]) -> PairOutcome {
    let port = free_port().to_string();
    let mut server_args: Vec<&str> = args.to_vec();
    server_args.extend(["-p", &port]);
    let mut client_args = server_args.clone();
    client_args.push("127.0.0.1");
    let what = format!("{tool} {}", server_args.join(" "));
    let o = run_pair(
        uiw_run(dev, tool, &server_args),
        uiw_run(dev, tool, &client_args),
        port.parse().expect("a port number"),
        PAIR_TIMEOUT,
    );
    // Shown with `cargo test -- --nocapture`, and with the failure below.
    println!("### uiw run -- {what} [127.0.0.1]: {:.2?}", o.elapsed);
    assert!(
        o.success(),
        "uiw run -- {what}: server and client must both exit 0\n{o}"
    );
    o
}

// ---------------------------------------------------------------------------
// ibv_rc_pingpong
// ---------------------------------------------------------------------------

/// `ibv_rc_pingpong`'s summary: "N bytes in S seconds = R Mbit/sec" and
/// "I iters in S seconds = U usec/iter".
#[derive(Debug, Clone, Copy, PartialEq)]
struct PingpongSummary {
    bytes: u64,
    iters: u64,
    seconds: f64,
    mbit_per_sec: f64,
}

fn parse_pingpong(stdout: &str) -> Option<PingpongSummary> {
    let mut bytes = None;
    let mut iters = None;
    for line in stdout.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        // [N, "bytes", "in", S, "seconds", "=", R, "Mbit/sec"]
        if words.len() == 8 && words[1] == "bytes" && words[2] == "in" && words[7] == "Mbit/sec" {
            bytes = Some((
                words[0].parse::<u64>().ok()?,
                words[3].parse::<f64>().ok()?,
                words[6].parse::<f64>().ok()?,
            ));
        }
        // [I, "iters", "in", S, "seconds", "=", U, "usec/iter"]
        if words.len() == 8 && words[1] == "iters" && words[2] == "in" {
            iters = Some(words[0].parse::<u64>().ok()?);
        }
    }
    let (bytes, seconds, mbit_per_sec) = bytes?;
    Some(PingpongSummary {
        bytes,
        iters: iters?,
        seconds,
        mbit_per_sec,
    })
}

/// One ibv_rc_pingpong pair with `extra` options: both sides exit 0 and
/// report every byte of `iters` round trips of `size` bytes.
fn pingpong(test: &str, extra: &[&str]) {
    let Some(artifacts) = prepare(test, "ibv_rc_pingpong", "ibverbs-utils") else {
        return;
    };
    let _lock = device_lock();
    let dev = Published::up(&artifacts, &out_dir(env!("CARGO_TARGET_TMPDIR")))
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    let (iters, size) = (200u64, 4096u64);
    let (n, s) = (iters.to_string(), size.to_string());
    let mut args = vec!["-d", DEV, "-g", GID_INDEX, "-n", &n, "-s", &s];
    args.extend_from_slice(extra);
    let o = run_tool(&dev, "ibv_rc_pingpong", &args);
    for side in [&o.server, &o.client] {
        let sum = parse_pingpong(&side.stdout).unwrap_or_else(|| {
            panic!(
                "{test}: no \"bytes in ... seconds\" summary from the {}\n{o}",
                side.name
            )
        });
        assert_eq!(
            (sum.bytes, sum.iters),
            (2 * size * iters, iters),
            "{test}: the {} reports other totals than {iters} round trips of {size} bytes\n{o}",
            side.name
        );
        assert!(
            sum.seconds.is_finite() && sum.seconds >= 0.0 && sum.mbit_per_sec.is_finite(),
            "{test}: {} summary {sum:?}\n{o}",
            side.name
        );
    }
}

/// `UIW_DEBUG=1` explains a refused verb in one line, with the limit: ibv_rc_pingpong
/// asking for more receive WRs than the device allows says "Couldn't create QP" itself, and
/// uiw says why.
#[test]
fn uiw_debug_explains_a_refused_create_qp() {
    const TEST: &str = "uiw_debug_explains_a_refused_create_qp";
    let Some(artifacts) = prepare(TEST, "ibv_rc_pingpong", "ibverbs-utils") else {
        return;
    };
    let _lock = device_lock();
    let dev = Published::up(&artifacts, &out_dir(env!("CARGO_TARGET_TMPDIR")))
        .unwrap_or_else(|e| panic!("{TEST}: {e}"));
    let port = free_port().to_string();
    let args = ["ibv_rc_pingpong", "-d", DEV, "-g", GID_INDEX, "-r", "100000", "-p", &port];
    let prog: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    let o = dev.run(&prog, &[("UIW_DEBUG", "1")]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{TEST}: the QP was created\n{err}");
    assert!(
        err.lines().any(|l| l == "uiw: ibv_create_qp refused: max_recv_wr = 100000 exceeds max_qp_wr = 16384"),
        "{TEST}: no explanation\n{err}"
    );
    // Without UIW_DEBUG the provider is silent.
    let o = dev.run(&prog, &[]);
    assert!(!String::from_utf8_lossy(&o.stderr).contains("uiw:"), "{TEST}: uiw spoke without UIW_DEBUG");
}

/// Busy-polling RC Send/Recv; `-c` makes the receiver check the data.
#[test]
fn ibv_rc_pingpong_polling() {
    pingpong("ibv_rc_pingpong_polling", &["-c"]);
}

/// With a completion channel (`-e`: ibv_req_notify_cq + ibv_get_cq_event).
#[test]
fn ibv_rc_pingpong_events() {
    pingpong("ibv_rc_pingpong_events", &["-e"]);
}

/// With the new post-send API (`-N`: ibv_wr_start / ibv_wr_send / ibv_wr_complete).
#[test]
fn ibv_rc_pingpong_new_send() {
    pingpong("ibv_rc_pingpong_new_send", &["-N"]);
}

// ---------------------------------------------------------------------------
// perftest
// ---------------------------------------------------------------------------

/// perftest's result table: the column names of its " #bytes ..." header and
/// one row of numbers per message size.
#[derive(Debug, Clone, PartialEq)]
struct Table {
    columns: Vec<String>,
    rows: Vec<Vec<f64>>,
}

impl Table {
    fn column(&self, prefix: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.starts_with(prefix))
    }
}

/// Column names end with `]` ("BW peak[MB/sec]", "99% percentile[usec]") or
/// start with `#` ("#bytes", "#iterations").
fn header_columns(line: &str) -> Vec<String> {
    let mut cols = Vec::new();
    let mut cur: Vec<&str> = Vec::new();
    for w in line.split_whitespace() {
        if w.starts_with('#') && cur.is_empty() {
            cols.push(w.to_string());
            continue;
        }
        cur.push(w);
        if w.ends_with(']') {
            cols.push(cur.join(" "));
            cur.clear();
        }
    }
    if !cur.is_empty() {
        cols.push(cur.join(" "));
    }
    cols
}

/// The result table in a perftest output (the last header wins; rows are the
/// lines after it that start with a number).
fn parse_perftest(stdout: &str) -> Option<Table> {
    let mut table: Option<Table> = None;
    for line in stdout.lines() {
        let t = line.trim();
        if t.starts_with("#bytes") {
            table = Some(Table {
                columns: header_columns(t),
                rows: Vec::new(),
            });
            continue;
        }
        let Some(tab) = table.as_mut() else { continue };
        let words: Vec<&str> = t.split_whitespace().collect();
        if words.is_empty() || words[0].parse::<u64>().is_err() {
            continue;
        }
        let nums: Option<Vec<f64>> = words.iter().map(|w| w.parse::<f64>().ok()).collect();
        if let Some(nums) = nums {
            if nums.len() == tab.columns.len() {
                tab.rows.push(nums);
            }
        }
    }
    table
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Bw,
    Lat,
}

/// Check a client's result table: the expected sizes in order (all of them
/// for `-a`), at least `min_iters` iterations each, and evidence that each
/// size moved data. Returns the table.
///
/// Bandwidth rows need a positive message rate (Mpps, six decimals); their
/// peak and average bandwidth (MB/s, two decimals) must be positive once a
/// row moved at least 1 MiB — for less, a loaded 2-vCPU CI machine can
/// legitimately print 0.00 (5 x 2 bytes in a millisecond is 0.01 MB/s). Latency rows need a positive, finite
/// average latency.
fn check_table(what: &str, kind: Kind, sizes: &[u64], min_iters: u64, o: &PairOutcome) -> Table {
    let table = parse_perftest(&o.client.stdout)
        .unwrap_or_else(|| panic!("{what}: no \"#bytes ...\" result table from the client\n{o}"));
    let col = |name: &str| {
        table
            .column(name)
            .unwrap_or_else(|| panic!("{what}: no {name} column in {:?}\n{o}", table.columns))
    };
    let (bytes, iters) = (col("#bytes"), col("#iterations"));
    let got: Vec<u64> = table.rows.iter().map(|r| r[bytes] as u64).collect();
    assert_eq!(
        got, sizes,
        "{what}: result rows for other message sizes than asked\n{o}"
    );
    let positive = |v: f64| v.is_finite() && v > 0.0;
    for row in &table.rows {
        let size = row[bytes];
        assert!(
            row[iters] as u64 >= min_iters,
            "{what}: {size} bytes: {} iterations, asked for {min_iters}\n{o}",
            row[iters]
        );
        match kind {
            Kind::Bw => {
                let (peak, avg, rate) = (
                    row[col("BW peak")],
                    row[col("BW average")],
                    row[col("MsgRate")],
                );
                assert!(
                    positive(rate)
                        && peak.is_finite()
                        && peak >= 0.0
                        && avg.is_finite()
                        && avg >= 0.0,
                    "{what}: {size} bytes: peak {peak} MB/s, average {avg} MB/s, {rate} Mpps: \
                     no data moved?\n{o}"
                );
                if size * row[iters] >= (1 << 20) as f64 {
                    assert!(
                        positive(avg) && positive(peak),
                        "{what}: {size} bytes: peak {peak} MB/s, average {avg} MB/s\n{o}"
                    );
                }
            }
            Kind::Lat => {
                let avg = row[col("t_avg")];
                assert!(
                    positive(avg),
                    "{what}: {size} bytes: average latency {avg} us is not a positive, finite number\n{o}"
                );
            }
        }
    }
    table
}

/// perftest's `-a`: every power of two from 2 bytes to 8 MiB.
fn all_sizes() -> Vec<u64> {
    (1..=23).map(|i| 1u64 << i).collect()
}

/// The options every perftest run gets: the device, GID index 0 (which makes
/// perftest connect QPs by GID and QPN, without rdma_cm) and no warning about
/// CPU frequency scaling.
fn perftest_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["-d", DEV, "-x", GID_INDEX, "-F"];
    v.extend_from_slice(extra);
    v
}

/// A bandwidth tool: 64 KiB x 200 over 4 QPs, 1 byte x 200, then `-a` (2 B to
/// 8 MiB) with perftest's minimum of 5 iterations per size, which keeps it
/// to a few seconds even on a debug build.
fn bw_tool(test: &str, tool: &str) {
    let Some(artifacts) = prepare(test, tool, "perftest") else {
        return;
    };
    let _lock = device_lock();
    let dev = Published::up(&artifacts, &out_dir(env!("CARGO_TARGET_TMPDIR")))
        .unwrap_or_else(|e| panic!("{test}: {e}"));

    let o = run_tool(
        &dev,
        tool,
        &perftest_args(&["-s", "65536", "-n", "200", "-q", "4"]),
    );
    check_table(
        &format!("{tool} -s 65536 -n 200 -q 4"),
        Kind::Bw,
        &[65536],
        200,
        &o,
    );

    let o = run_tool(&dev, tool, &perftest_args(&["-s", "1", "-n", "200"]));
    check_table(&format!("{tool} -s 1 -n 200"), Kind::Bw, &[1], 200, &o);

    let o = run_tool(&dev, tool, &perftest_args(&["-a", "-n", "5"]));
    check_table(&format!("{tool} -a -n 5"), Kind::Bw, &all_sizes(), 5, &o);
}

/// A latency tool: small and 64 KiB messages, 200 iterations each.
fn lat_tool(test: &str, tool: &str) {
    let Some(artifacts) = prepare(test, tool, "perftest") else {
        return;
    };
    let _lock = device_lock();
    let dev = Published::up(&artifacts, &out_dir(env!("CARGO_TARGET_TMPDIR")))
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    for size in ["2", "65536"] {
        let o = run_tool(&dev, tool, &perftest_args(&["-s", size, "-n", "200"]));
        check_table(
            &format!("{tool} -s {size} -n 200"),
            Kind::Lat,
            &[size.parse().unwrap()],
            200,
            &o,
        );
    }
}

#[test]
fn ib_write_bw() {
    bw_tool("ib_write_bw", "ib_write_bw");
}

#[test]
fn ib_read_bw() {
    bw_tool("ib_read_bw", "ib_read_bw");
}

#[test]
fn ib_send_bw() {
    bw_tool("ib_send_bw", "ib_send_bw");
}

#[test]
fn ib_write_lat() {
    lat_tool("ib_write_lat", "ib_write_lat");
}

#[test]
fn ib_read_lat() {
    lat_tool("ib_read_lat", "ib_read_lat");
}

#[test]
fn ib_send_lat() {
    lat_tool("ib_send_lat", "ib_send_lat");
}

/// RFC 7306 atomics between two uiw peers: compare-and-swap and fetch-and-add
/// (perftest's atomics are 8 bytes).
#[test]
fn ib_atomic_bw() {
    const TEST: &str = "ib_atomic_bw";
    let Some(artifacts) = prepare(TEST, "ib_atomic_bw", "perftest") else {
        return;
    };
    let _lock = device_lock();
    let dev = Published::up(&artifacts, &out_dir(env!("CARGO_TARGET_TMPDIR")))
        .unwrap_or_else(|e| panic!("{TEST}: {e}"));
    for (atomic, qps) in [("CMP_AND_SWAP", "1"), ("FETCH_AND_ADD", "4")] {
        let o = run_tool(
            &dev,
            "ib_atomic_bw",
            &perftest_args(&["-A", atomic, "-n", "200", "-q", qps]),
        );
        check_table(
            &format!("ib_atomic_bw -A {atomic} -q {qps}"),
            Kind::Bw,
            &[8],
            200,
            &o,
        );
    }
}

#[test]
fn ib_atomic_lat() {
    const TEST: &str = "ib_atomic_lat";
    let Some(artifacts) = prepare(TEST, "ib_atomic_lat", "perftest") else {
        return;
    };
    let _lock = device_lock();
    let dev = Published::up(&artifacts, &out_dir(env!("CARGO_TARGET_TMPDIR")))
        .unwrap_or_else(|e| panic!("{TEST}: {e}"));
    for atomic in ["CMP_AND_SWAP", "FETCH_AND_ADD"] {
        let o = run_tool(
            &dev,
            "ib_atomic_lat",
            &perftest_args(&["-A", atomic, "-n", "200"]),
        );
        check_table(
            &format!("ib_atomic_lat -A {atomic}"),
            Kind::Lat,
            &[8],
            200,
            &o,
        );
    }
}

// ---------------------------------------------------------------------------
// The parsers themselves (no device needed)
// ---------------------------------------------------------------------------

#[test]
fn pingpong_summary_is_parsed() {
    let out = "  local address:  LID 0x0000, QPN 0x000011, PSN 0x1, GID ::ffff:127.0.0.1\n\
               1638400 bytes in 0.02 seconds = 655.36 Mbit/sec\n\
               200 iters in 0.02 seconds = 100.00 usec/iter\n";
    assert_eq!(
        parse_pingpong(out),
        Some(PingpongSummary {
            bytes: 1638400,
            iters: 200,
            seconds: 0.02,
            mbit_per_sec: 655.36
        })
    );
    assert_eq!(parse_pingpong("Failed to modify QP to RTR\n"), None);
    assert_eq!(
        parse_pingpong("1638400 bytes in 0.02 seconds = 655.36 Mbit/sec\n"),
        None
    );
}

#[test]
fn perftest_tables_are_parsed() {
    let bw = "\
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 2          20               0.05               0.05   \t\t   0.025031
 65536      200              1234.56            1200.00\t\t   0.019200
---------------------------------------------------------------------------------------
";
    let t = parse_perftest(bw).unwrap();
    assert_eq!(
        t.columns,
        [
            "#bytes",
            "#iterations",
            "BW peak[MB/sec]",
            "BW average[MB/sec]",
            "MsgRate[Mpps]"
        ]
    );
    assert_eq!(t.rows.len(), 2);
    assert_eq!(t.rows[1][t.column("BW average").unwrap()], 1200.0);

    let lat = "\
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 2       200          10.01          50.20        12.00    \t       12.50     \t2.00\t\t30.00 \t\t50.20  
";
    let t = parse_perftest(lat).unwrap();
    assert_eq!(t.columns.len(), 9, "{:?}", t.columns);
    assert_eq!(t.columns[7], "99% percentile[usec]");
    assert_eq!(
        t.rows,
        vec![vec![2.0, 200.0, 10.01, 50.2, 12.0, 12.5, 2.0, 30.0, 50.2]]
    );
    assert_eq!(t.rows[0][t.column("t_avg").unwrap()], 12.5);

    // A server that only prints the header has a table without rows; a
    // failed run has none at all.
    assert_eq!(
        parse_perftest(" #bytes     #iterations    BW peak[MB/sec]\n")
            .unwrap()
            .rows
            .len(),
        0
    );
    assert!(parse_perftest("Couldn't connect to 127.0.0.1:18515\n").is_none());
}
