//! rdma-core's logging conventions: `VERBS_LOG_LEVEL` and `VERBS_LOG_FILE` select the
//! provider's diagnostics, beside uiw's own `UIW_DEBUG`.
//!
//! `examples/c/verbs_objects.c` makes calls the provider refuses (invalid QP transitions,
//! among others), which it explains at level 3 (information). Run under `uiw run`:
//! - with no setting, nothing is said;
//! - `VERBS_LOG_LEVEL=3 VERBS_LOG_FILE=F`: the explanations are appended to F, not stderr;
//! - `VERBS_LOG_LEVEL=2`: a warning level hides them;
//! - `UIW_DEBUG=1`: they go to stderr.
//!
//! Needs `cargo build --workspace` first and root (see verbs_objects.rs).

use std::fs;

use uiw_examples::{build_c_example, device_lock, device_test_artifacts, out_dir, show, Published};

const REFUSED: &str = "uiw: ibv_modify_qp refused: QP 0x";

#[test]
fn verbs_log_level_and_file_select_diagnostics() {
    let test = "verbs_log_level_and_file_select_diagnostics";
    let Some(artifacts) = device_test_artifacts(test) else { return };
    let out = out_dir(env!("CARGO_TARGET_TMPDIR"));
    let exe = build_c_example("verbs_objects", &out);
    let _lock = device_lock();
    let dev = Published::up(&artifacts, &out).unwrap_or_else(|e| panic!("{test}: {e}"));
    let log = dev.state_dir.join("verbs.log");
    let run = |envs: &[(&str, &str)]| {
        // The test's own environment must not decide the outcome.
        let mut c = dev.command();
        c.env_remove("UIW_DEBUG").env_remove("VERBS_LOG_LEVEL").env_remove("VERBS_LOG_FILE");
        c.arg("run").arg("--").arg(&exe).envs(envs.iter().copied());
        let o = c.output().expect("run verbs_objects");
        assert!(o.status.success(), "{envs:?}\n{}", show(&o));
        String::from_utf8_lossy(&o.stderr).into_owned()
    };

    let quiet = run(&[]);
    assert!(!quiet.contains(REFUSED), "nothing is logged by default:\n{quiet}");

    let logf = log.to_str().unwrap();
    let err = run(&[("VERBS_LOG_LEVEL", "3"), ("VERBS_LOG_FILE", logf)]);
    assert!(!err.contains(REFUSED), "with VERBS_LOG_FILE, stderr stays quiet:\n{err}");
    let first = fs::read_to_string(&log).expect("VERBS_LOG_FILE was created");
    assert!(first.contains(REFUSED), "the refusals are explained in the file:\n{first}");
    // Appended, not truncated.
    run(&[("VERBS_LOG_LEVEL", "0x3"), ("VERBS_LOG_FILE", logf)]);
    let second = fs::read_to_string(&log).unwrap();
    assert!(second.len() > first.len() && second.starts_with(&first), "the file is appended to");

    let warn = run(&[("VERBS_LOG_LEVEL", "2")]);
    assert!(!warn.contains(REFUSED), "level 2 hides information messages:\n{warn}");

    let dbg = run(&[("UIW_DEBUG", "1")]);
    assert!(dbg.contains(REFUSED), "UIW_DEBUG=1 explains on stderr:\n{dbg}");
}
