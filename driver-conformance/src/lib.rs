//! The driver conformance suite of address-controller — what `csi-sanity` is for storage —
//! as a crate a driver's own repository can depend on, and the invariant checker it ends
//! every case with (the project's integration tests end with the same checker).
//!
//! Entry points: [`suite::run`] with [`suite::Options`] (in-process, from a driver's own
//! integration test), or the `driver-conformance` binary of this crate (against any
//! cluster). [`invariants::check`] is the checker by itself. Nothing here starts a cluster
//! or depends on this repository's test harness: give it a [`kube::Client`] for a cluster
//! where the core controller and the driver run. See docs/drivers.md.

#![allow(clippy::unwrap_used)] // test support: a failed step fails loudly

pub mod invariants;
pub mod suite;

use std::future::Future;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};

/// Polls `probe` until it returns `Some`, or fails after `timeout` naming what was awaited
/// and the last error the probe returned.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    wait_for_every(what, timeout, Duration::from_millis(200), probe).await
}

/// [`wait_for`], polling every `interval`.
pub async fn wait_for_every<T, F, Fut>(
    what: &str,
    timeout: Duration,
    interval: Duration,
    mut probe: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let start = std::time::Instant::now();
    let mut last = String::from("condition not met yet");
    loop {
        match probe().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = format!("{e:#}"),
        }
        if start.elapsed() > timeout {
            bail!("timed out after {timeout:?} waiting for {what}; last: {last}");
        }
        tokio::time::sleep(interval).await;
    }
}

/// A short random lowercase suffix for object names.
pub fn random_suffix() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    format!("{:08x}", h.finish() as u32)
}

/// An HTTPS GET on loopback with curl (the server's certificate is not checked: tests
/// that care about it check it themselves): (status, body).
pub fn https_get(url: &str, token: Option<&str>) -> Result<(u16, String)> {
    let mut cmd = Command::new("curl");
    cmd.args(["-sSk", "--max-time", "10", "-w", "\n%{http_code}"]);
    if let Some(t) = token {
        cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
    }
    let out = cmd.arg(url).output().context("running curl")?;
    if !out.status.success() {
        // Refused (7), timed out (28), TLS (35) ...: say which, it tells a dead process
        // from a frozen one.
        bail!(
            "curl {url}: {} ({})",
            String::from_utf8_lossy(&out.stderr).trim(),
            out.status
        );
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text
        .rsplit_once('\n')
        .ok_or_else(|| anyhow!("curl {url}: no status"))?;
    Ok((code.trim().parse().unwrap_or(0), body.to_string()))
}

/// What a local process is doing: gone, or its state, every thread's state and kernel wait
/// channel, and (when gdb is installed) every thread's stack. For a replica that stopped
/// answering: a dead process and a frozen one look alike from outside.
pub fn process_state(pid: u32) -> String {
    let dir = PathBuf::from(format!("/proc/{pid}"));
    let Ok(status) = std::fs::read_to_string(dir.join("status")) else {
        return format!("process {pid} is gone");
    };
    let mut out = String::new();
    for l in status.lines().filter(|l| {
        [
            "Name:",
            "State:",
            "Threads:",
            "VmRSS:",
            "voluntary_ctxt_switches:",
        ]
        .iter()
        .any(|p| l.starts_with(p))
    }) {
        out.push_str(&format!("  {l}\n"));
    }
    for line in address_controller_runtime::supervise::thread_states_of(&pid.to_string()).lines() {
        out.push_str(&format!("  {line}\n"));
    }
    if let Ok(gdb) = Command::new("timeout")
        .args(["60", "gdb", "-batch", "-nx", "-p", &pid.to_string()])
        .args(["-ex", "thread apply all bt 40"])
        .output()
    {
        let full = String::from_utf8_lossy(&gdb.stdout).into_owned();
        // Every thread, short enough to survive a CI log's truncation: its first frames
        // and the project's own frames; the whole backtrace goes to a file.
        out.push_str(&condense_backtraces(&full));
        let dir = std::env::temp_dir().join("address-controller-stuck-processes");
        let file = dir.join(format!("{pid}-{}.txt", random_suffix()));
        if std::fs::create_dir_all(&dir).is_ok() && std::fs::write(&file, &full).is_ok() {
            out.push_str(&format!("  (whole backtraces: {})\n", file.display()));
        }
    }
    out
}

/// gdb's `thread apply all bt` cut to each thread's header, its first three frames and up
/// to eight frames of this project's code (function and file:line, generics dropped).
pub fn condense_backtraces(gdb: &str) -> String {
    let mut out = String::new();
    let mut own = 0;
    for line in gdb.lines() {
        if line.starts_with("Thread ") {
            own = 0;
            out.push_str(&format!("  {line}\n"));
            continue;
        }
        let Some(rest) = line.strip_prefix('#') else {
            continue;
        };
        let frame: usize = rest
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(usize::MAX);
        let ours = line.contains("address_controller");
        if frame < 3 || (ours && own < 8) {
            own += usize::from(ours);
            // "#5 0x... in a::b::<T>::c () at x.rs:12" → "#5 a::b::c at x.rs:12"
            let text = rest
                .trim_start_matches(|c: char| c.is_ascii_digit())
                .trim_start();
            let text = match text.split_once(' ') {
                Some((addr, t)) if addr.starts_with("0x") => t.strip_prefix("in ").unwrap_or(t),
                _ => text,
            };
            let (func, at) = text.split_once(" at ").unwrap_or((text, ""));
            let mut name = String::new();
            let mut depth = 0usize;
            for ch in func.chars() {
                match ch {
                    '<' => depth += 1,
                    '>' => depth = depth.saturating_sub(1),
                    _ if depth == 0 => name.push(ch),
                    _ => {}
                }
            }
            let at = at.rsplit('/').next().unwrap_or(at);
            out.push_str(&format!("    #{frame} {} {at}\n", name.trim()));
        }
    }
    out
}

#[cfg(test)]
mod condense_tests {
    use super::condense_backtraces;

    #[test]
    fn condensed_backtraces_keep_every_thread_its_top_and_the_projects_frames() {
        let gdb = "\
[New LWP 19255]
Thread 3 (Thread 0x7f6c (LWP 19256) \"tokio-rt-worker\"):
#0  syscall () at ../sysdeps/unix/sysv/linux/x86_64/syscall.S:38
#1  0x000055f4e4159a86 in std::sys::pal::unix::futex::futex_wait () at library/std/src/sys/pal/unix/futex.rs:73
#2  std::sys::sync::mutex::futex::Mutex::lock_contended () at library/std/src/sys/sync/mutex/futex.rs:61
#3  0x000055f4e2abfc7a in lock () at /rustc/x/library/std/src/sys/sync/mutex/futex.rs:33
#4  lock<address_controller_controller::index::Inner> () at /rustc/x/library/std/src/sync/poison/mutex.rs:492
#5  0x000055f4e2aa527a in address_controller_controller::index::Index::lock::h3b9018ffe2e18672 () at controller/src/index.rs:118
#6  0x000055f4e2aa5749 in address_controller_controller::index::Index::pass_done::h9b7e96664f164f4b () at controller/src/index.rs:292
#7  0x000055f4e2a3a55e in tokio::runtime::task::core::Core<T,S>::poll::{{closure}}::h6ae () at /root/.cargo/tokio-1.54.1/src/runtime/task/core.rs:380

Thread 2 (Thread 0x7f6d (LWP 19255) \"tokio-rt-worker\"):
#0  0x0000 in address_controller_controller::index::Index::candidate::h1 () at controller/src/index.rs:355
";
        let got = condense_backtraces(gdb);
        let want = "  Thread 3 (Thread 0x7f6c (LWP 19256) \"tokio-rt-worker\"):
    #0 syscall () syscall.S:38
    #1 std::sys::pal::unix::futex::futex_wait () futex.rs:73
    #2 std::sys::sync::mutex::futex::Mutex::lock_contended () futex.rs:61
    #4 lock () mutex.rs:492
    #5 address_controller_controller::index::Index::lock::h3b9018ffe2e18672 () index.rs:118
    #6 address_controller_controller::index::Index::pass_done::h9b7e96664f164f4b () index.rs:292
  Thread 2 (Thread 0x7f6d (LWP 19255) \"tokio-rt-worker\"):
    #0 address_controller_controller::index::Index::candidate::h1 () index.rs:355
";
        assert_eq!(got, want);
    }
}
