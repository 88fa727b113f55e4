//! A process as `/proc` shows it: CPU time, start time, resident memory.

use super::*;

/// Fields `line_fields` of `/proc/<pid>/stat` (numbered as in proc(5), from 1), as clock
/// ticks — USER_HZ, 100 on Linux, so 10 ms each.
fn stat_ticks<const N: usize>(pid: u32, line_fields: [usize; N]) -> Result<[u64; N]> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (field 2, which may hold spaces) in parentheses.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow!("unreadable /proc/{pid}/stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let mut out = [0; N];
    for (o, f) in out.iter_mut().zip(line_fields) {
        *o = fields
            .get(f - 3)
            .ok_or_else(|| anyhow!("short stat"))?
            .parse()?;
    }
    Ok(out)
}

/// CPU time (user + system) a process has used, from `/proc/<pid>/stat`.
pub fn cpu_time(pid: u32) -> Result<Duration> {
    // utime and stime.
    let [user, system] = stat_ticks(pid, [14, 15])?;
    Ok(Duration::from_millis((user + system) * 10))
}

/// When a process started, by the wall clock: its start time in clock ticks since boot
/// (`/proc/<pid>/stat`) against the uptime now.
pub fn started_at(pid: u32) -> Result<k8s_openapi::jiff::Timestamp> {
    let [ticks] = stat_ticks(pid, [22])?;
    let uptime: f64 = std::fs::read_to_string("/proc/uptime")?
        .split_whitespace()
        .next()
        .and_then(|u| u.parse().ok())
        .ok_or_else(|| anyhow!("unreadable /proc/uptime"))?;
    Ok(k8s_openapi::jiff::Timestamp::now()
        - Duration::from_secs_f64((uptime - ticks as f64 / 100.0).max(0.0)))
}

/// Resident memory of a process (`VmRSS`), from `/proc/<pid>/status`.
pub fn rss_bytes(pid: u32) -> Result<u64> {
    status_bytes(pid, "VmRSS")
}

/// Peak resident memory of a process (`VmHWM`), from `/proc/<pid>/status`.
pub fn peak_rss_bytes(pid: u32) -> Result<u64> {
    status_bytes(pid, "VmHWM")
}

/// A `kB` field of `/proc/<pid>/status`, in bytes.
fn status_bytes(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next())
        .ok_or_else(|| anyhow!("no {field} for {pid}"))?
        .parse()?;
    Ok(kb * 1024)
}

#[cfg(test)]
mod proc_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn this_process_started_just_now_and_has_used_some_cpu() {
        let pid = std::process::id();
        let started = started_at(pid).unwrap();
        let ago = k8s_openapi::jiff::Timestamp::now().duration_since(started);
        // A wrong field (the boot time, a zero) would be hours off, or in the future.
        assert!(
            ago.as_secs_f64() > -0.05 && ago.as_secs() < 600,
            "started {ago:?} ago"
        );
        // Spin until 30 ms of CPU show, for at most 5 s of wall clock (a loaded machine
        // gives this thread less than its wall time): a wrong field (zero, another
        // process's) never shows them.
        let before = cpu_time(pid).unwrap();
        let spin = std::time::Instant::now();
        while cpu_time(pid).unwrap() < before + Duration::from_millis(30)
            && spin.elapsed() < Duration::from_secs(5)
        {}
        assert!(cpu_time(pid).unwrap() >= before + Duration::from_millis(30));
    }
}
