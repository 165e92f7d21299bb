//! `uiw stat`: the counters of the processes using this state directory's devices, read from
//! their statistics files (`<state>/stats/<ibdev>.<pid>`, layout in `uiw_kabi::stats`)
//! without involving the processes themselves.

use std::fs;
use std::path::Path;

use uiw_kabi::stats::{self, Snapshot, COUNTERS};

/// What to show.
#[derive(Debug, Default)]
pub struct Opts {
    /// One line per QP instead of per device and process.
    pub qp: bool,
    /// Include exited processes and destroyed QPs.
    pub all: bool,
    pub dev: Option<String>,
    pub pid: Option<u32>,
    /// Remove the files of exited processes (and show nothing).
    pub prune: bool,
    /// Only the named counters (all when empty).
    pub counters: Vec<String>,
    /// One JSON document instead of lines.
    pub json: bool,
}

/// One statistics file and what became of its process.
pub struct Proc {
    pub path: std::path::PathBuf,
    pub snap: Snapshot,
    pub live: bool,
    pub comm: String,
}

/// Every statistics file in `dir`, oldest process first. A file whose pid is gone, or now
/// belongs to a process started at another time, is an exited process's.
pub fn scan(dir: &Path) -> Vec<Proc> {
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir(dir) else { return out };
    for e in rd.flatten() {
        let Ok(Some(snap)) = stats::read(&e.path()) else { continue };
        let live = stats::process_start_time(snap.pid) == Some(snap.start_time);
        let comm = if live {
            fs::read_to_string(format!("/proc/{}/comm", snap.pid)).map(|s| s.trim_end().to_string()).unwrap_or_default()
        } else {
            String::new()
        };
        out.push(Proc { path: e.path(), snap, live, comm });
    }
    out.sort_by(|a, b| (a.snap.start_time, a.snap.pid, &a.snap.ibdev).cmp(&(b.snap.start_time, b.snap.pid, &b.snap.ibdev)));
    out
}

fn counters_text(c: &[u64; stats::NCOUNTERS], only: &[String]) -> String {
    let mut s = String::new();
    for (idx, name, _) in COUNTERS {
        if only.is_empty() || only.iter().any(|o| o == name) {
            s.push_str(&format!(" {name} {}", c[idx as usize]));
        }
    }
    s
}

fn who(p: &Proc) -> String {
    if p.live {
        format!("pid {} comm {}", p.snap.pid, if p.comm.is_empty() { "?" } else { &p.comm })
    } else {
        format!("pid {} exited", p.snap.pid)
    }
}

/// The lines `uiw stat` prints for `procs` (already filtered by device and pid).
pub fn render(procs: &[Proc], o: &Opts) -> Vec<String> {
    let shown: Vec<&Proc> = procs.iter().filter(|p| p.live || o.all).collect();
    let mut lines = Vec::new();
    let mut devs: Vec<&str> = shown.iter().map(|p| p.snap.ibdev.as_str()).collect();
    devs.sort();
    devs.dedup();
    for d in devs {
        let of_dev: Vec<&&Proc> = shown.iter().filter(|p| p.snap.ibdev == d).collect();
        if o.qp {
            for p in &of_dev {
                for (qpn, destroyed, c) in &p.snap.qps {
                    if *destroyed && !o.all {
                        continue;
                    }
                    lines.push(format!(
                        "link {d}/1 {} lqpn {qpn}{}{}",
                        who(p),
                        if *destroyed { " destroyed" } else { "" },
                        counters_text(c, &o.counters)
                    ));
                }
            }
            continue;
        }
        let mut sum = [0u64; stats::NCOUNTERS];
        for p in &of_dev {
            for (s, v) in sum.iter_mut().zip(p.snap.device.iter()) {
                *s += v;
            }
        }
        lines.push(format!("link {d}/1 processes {}{}", of_dev.len(), counters_text(&sum, &o.counters)));
        for p in &of_dev {
            let live_qps = p.snap.qps.iter().filter(|q| !q.1).count();
            lines.push(format!("link {d}/1 {} qps {live_qps}{}", who(p), counters_text(&p.snap.device, &o.counters)));
        }
    }
    lines
}

fn counters_json(c: &[u64; stats::NCOUNTERS], only: &[String]) -> String {
    let v: Vec<String> = COUNTERS
        .iter()
        .filter(|(_, name, _)| only.is_empty() || only.iter().any(|o| o == name))
        .map(|(idx, name, _)| format!("\"{name}\":{}", c[*idx as usize]))
        .collect();
    format!("{{{}}}", v.join(","))
}

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for ch in s.chars() {
        match ch {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// `uiw stat -j`: one array with an object per process and device (like `rdma -j
/// statistic`): `{"ifname","port","pid","comm","exited","counters":{…},"qps":[{"lqpn",
/// "destroyed","counters":{…}}]}`, filtered as the lines are.
pub fn render_json(procs: &[Proc], o: &Opts) -> String {
    let mut objs = Vec::new();
    for p in procs.iter().filter(|p| p.live || o.all) {
        let qps: Vec<String> = p
            .snap
            .qps
            .iter()
            .filter(|q| o.all || !q.1)
            .map(|(qpn, destroyed, c)| format!("{{\"lqpn\":{qpn},\"destroyed\":{destroyed},\"counters\":{}}}", counters_json(c, &o.counters)))
            .collect();
        objs.push(format!(
            "{{\"ifname\":{},\"port\":1,\"pid\":{},\"comm\":{},\"exited\":{},\"counters\":{},\"qps\":[{}]}}",
            json_str(&p.snap.ibdev),
            p.snap.pid,
            json_str(&p.comm),
            !p.live,
            counters_json(&p.snap.device, &o.counters),
            qps.join(",")
        ));
    }
    format!("[{}]", objs.join(","))
}

/// Removes the files of exited processes; returns how many.
pub fn prune(procs: &[Proc]) -> usize {
    procs.iter().filter(|p| !p.live).filter(|p| fs::remove_file(&p.path).is_ok()).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc_(pid: u32, live: bool, dev: [u64; stats::NCOUNTERS], qps: Vec<(u32, bool, [u64; stats::NCOUNTERS])>) -> Proc {
        Proc {
            path: "x".into(),
            snap: Snapshot { pid, start_time: 1, ibdev: "uiw_lo".into(), device: dev, qps },
            live,
            comm: "ib_write_bw".into(),
        }
    }

    #[test]
    fn lines_sum_live_processes_and_list_qps() {
        let mut a = [0u64; stats::NCOUNTERS];
        a[0] = 100;
        a[2] = 2;
        let mut b = [0u64; stats::NCOUNTERS];
        b[0] = 1;
        let procs = vec![proc_(10, true, a, vec![(4097, false, a), (4098, true, b)]), proc_(11, false, b, vec![])];
        let l = render(&procs, &Opts::default());
        assert_eq!(l.len(), 2, "{l:?}");
        assert!(l[0].starts_with("link uiw_lo/1 processes 1 tx_bytes 100 rx_bytes 0 tx_msgs 2 "), "{}", l[0]);
        assert!(l[1].starts_with("link uiw_lo/1 pid 10 comm ib_write_bw qps 1 tx_bytes 100 "), "{}", l[1]);
        let l = render(&procs, &Opts { all: true, ..Default::default() });
        assert!(l[0].starts_with("link uiw_lo/1 processes 2 tx_bytes 101 "), "{}", l[0]);
        assert!(l[2].starts_with("link uiw_lo/1 pid 11 exited qps 0 tx_bytes 1 "), "{}", l[2]);
        let l = render(&procs, &Opts { qp: true, counters: vec!["tx_bytes".into()], ..Default::default() });
        assert_eq!(l, vec!["link uiw_lo/1 pid 10 comm ib_write_bw lqpn 4097 tx_bytes 100".to_string()]);
        let l = render(&procs, &Opts { qp: true, all: true, counters: vec!["tx_msgs".into()], ..Default::default() });
        assert_eq!(l[1], "link uiw_lo/1 pid 10 comm ib_write_bw lqpn 4098 destroyed tx_msgs 0");
        let j = render_json(&procs, &Opts { counters: vec!["tx_bytes".into(), "tx_msgs".into()], ..Default::default() });
        assert_eq!(
            j,
            "[{\"ifname\":\"uiw_lo\",\"port\":1,\"pid\":10,\"comm\":\"ib_write_bw\",\"exited\":false,\
             \"counters\":{\"tx_bytes\":100,\"tx_msgs\":2},\"qps\":[{\"lqpn\":4097,\"destroyed\":false,\
             \"counters\":{\"tx_bytes\":100,\"tx_msgs\":2}}]}]"
        );
        assert_eq!(json_str("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }
}
