//! Counting the requests a process made, from kube-apiserver's audit log.

use super::*;

/// One request kube-apiserver finished (`ResponseComplete`), from the cluster's audit log
/// (`deploy/local/cluster.sh` records writes to `local.sdn.cozystack.io` and Service
/// deletes).
#[derive(Debug, Clone)]
pub struct AuditedWrite {
    pub verb: String,
    pub resource: String,
    pub subresource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub code: u16,
    /// The impersonated user (the test processes impersonate their identities), or `""`.
    pub impersonated: String,
    /// The authenticated caller and its user agent.
    pub user: String,
    pub user_agent: String,
    pub received: Option<k8s_openapi::jiff::Timestamp>,
    /// When kube-apiserver finished answering it (the audit's `stageTimestamp`).
    pub completed: Option<k8s_openapi::jiff::Timestamp>,
}

/// Every finished request of the audit log, in order — the one reader of it.
pub fn audit_log() -> Result<Vec<AuditedWrite>> {
    let text = std::fs::read_to_string(Cluster::get().dir.join("logs/audit.log"))?;
    let text_of = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    let mut out = Vec::new();
    for line in text.lines() {
        // A line being written as the log is read is skipped, not an error.
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["stage"] != "ResponseComplete" {
            continue;
        }
        let o = &v["objectRef"];
        out.push(AuditedWrite {
            verb: text_of(&v["verb"]),
            resource: text_of(&o["resource"]),
            subresource: o["subresource"].as_str().map(str::to_string),
            namespace: o["namespace"].as_str().map(str::to_string),
            name: o["name"].as_str().map(str::to_string),
            code: v["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
            impersonated: text_of(&v["impersonatedUser"]["username"]),
            user: text_of(&v["user"]["username"]),
            user_agent: text_of(&v["userAgent"]),
            received: v["requestReceivedTimestamp"]
                .as_str()
                .and_then(|t| t.parse().ok()),
            completed: v["stageTimestamp"].as_str().and_then(|t| t.parse().ok()),
        });
    }
    Ok(out)
}

/// Writes to `local.sdn.cozystack.io` made by `user` (impersonated), from the cluster's
/// audit log, kept when `keep` says so.
pub fn audited_writes(
    user: &str,
    keep: impl Fn(&AuditedWrite) -> bool,
) -> Result<Vec<AuditedWrite>> {
    Ok(audit_log()?
        .into_iter()
        .filter(|w| w.impersonated == user && w.resource != "services" && keep(w))
        .collect())
}

/// Runs `cmd` with `stdin` written to its standard input, capturing stdout and stderr.
pub fn output_with_stdin(cmd: &mut Command, stdin: &[u8]) -> std::io::Result<std::process::Output> {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .ok_or_else(|| std::io::Error::other("no stdin"))?
        .write_all(stdin)?;
    child.wait_with_output()
}
