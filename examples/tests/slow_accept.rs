//! A passive application that takes its time between CONNECT_REQUEST and `rdma_accept`
//! (`examples/c/slow_accept.c`), as fabtests' MSG servers do: the active side waits for the
//! MPA Reply as long as `UIW_MPA_REPLY_TIMEOUT` allows, not the stack's `UIW_MPA_TIMEOUT`,
//! and still gives up once the Reply timeout has passed.
//!
//! Issue 13: fabtests' `fi_msg_pingpong -I 5` and `fi_shared_ctx -e msg` servers clear a
//! 1 GiB buffer before accepting; on a loaded host that outlasted the 10 s MPA timeout and the
//! tests failed with their receives flushed.

use std::path::Path;

use uiw_examples::{compile_c, device_lock, device_test_artifacts, failures, out_dir, parse_summary, show, Published};

fn run(test: &str, port: &str, sleep_ms: &str, expect: &str, envs: &[(&str, &str)], checks: u32) {
    let Some(artifacts) = device_test_artifacts(test) else { return };
    let dir = out_dir(env!("CARGO_TARGET_TMPDIR"));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("c").join("slow_accept.c");
    let exe = compile_c(&src, &dir.join("slow_accept"), &["-lrdmacm", "-libverbs", "-lpthread"], "librdmacm-dev");
    let _l = device_lock();
    let dev = Published::up(&artifacts, &dir).unwrap_or_else(|e| panic!("{e}"));
    let out = dev.run(&[exe.as_os_str(), "-p".as_ref(), port.as_ref(), "-s".as_ref(), sleep_ms.as_ref(), "-e".as_ref(), expect.as_ref()], envs);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let sum = parse_summary(&stdout).unwrap_or_else(|| panic!("{test}: no summary\n{}", show(&out)));
    assert!(
        out.status.success() && sum.failed == 0 && sum.passed == checks,
        "{test}: {sum:?}: {:?}\n{}",
        failures(&stdout),
        show(&out)
    );
}

/// The server sleeps 1.5 s before accepting; the stack's MPA timeout is 0.3 s. The client's
/// connect must still end ESTABLISHED (before the fix it failed after 0.3 s).
#[test]
fn an_accept_slower_than_the_mpa_timeout_still_connects() {
    run(
        "an_accept_slower_than_the_mpa_timeout_still_connects",
        "7791",
        "1500",
        "established",
        &[("UIW_MPA_TIMEOUT", "0.3")],
        5,
    );
}

/// The same slow server, with the Reply timeout cut to 0.3 s: the client's connect fails
/// (the wait for the Reply is bounded, and this program sees the difference).
#[test]
fn an_accept_slower_than_the_reply_timeout_fails_the_connect() {
    run(
        "an_accept_slower_than_the_reply_timeout_fails_the_connect",
        "7792",
        "1500",
        "failed",
        &[("UIW_MPA_TIMEOUT", "0.3"), ("UIW_MPA_REPLY_TIMEOUT", "0.3")],
        3,
    );
}
