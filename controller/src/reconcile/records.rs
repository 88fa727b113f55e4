//! The retention of the history's records: the leader deletes the `IPAddressRecord`s whose
//! entry ended longer ago than `--history-retention`, a bounded batch per pass. The lookup
//! is by the records' `until-month` label (every month older than the retention's first
//! whole month), so a pass reads the months at the edge, not the whole archive; the exact
//! `until` decides.

use std::sync::Arc;

use address_controller_api::IPAddressRecord;
use address_controller_api::record_labels::UNTIL_MONTH;
use address_controller_runtime::workers::Outcome;
use k8s_openapi::jiff::{Timestamp, ToSpan, tz::TimeZone};
use kube::api::{DeleteParams, ListParams, Preconditions};
use kube::{Api, ResourceExt};

use crate::context::Context;
use crate::error::{Error, Result};

/// The one key of the retention's queue.
pub const KEY: &str = "history-records";
/// At most this many records are deleted in one pass.
pub const PRUNE_BATCH: usize = 500;

/// The label selector of the records that may have ended before `cutoff`: those of any
/// month but the months from `cutoff`'s next one to `now`'s next one (a clock ahead).
pub fn older_than(cutoff: Timestamp, now: Timestamp) -> String {
    let month = |t: Timestamp| {
        let d = t.to_zoned(TimeZone::UTC).date();
        (d.year(), d.month())
    };
    let (mut y, mut m) = month(cutoff);
    let end = {
        let (ny, nm) = month(now);
        if nm == 12 { (ny + 1, 1) } else { (ny, nm + 1) }
    };
    let mut newer = Vec::new();
    while (y, m) < end {
        (y, m) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
        newer.push(format!("{y:04}-{m:02}"));
    }
    format!("{UNTIL_MONTH},{UNTIL_MONTH} notin ({})", newer.join(","))
}

/// One pass: deletes up to [`PRUNE_BATCH`] records older than the retention; again at once
/// when the batch was full, else after `interval`.
pub async fn reconcile(ctx: Arc<Context>, _key: String) -> Result<Outcome> {
    let now = Timestamp::now();
    let retention = ctx.history.retention;
    let cutoff = now
        .checked_sub(
            i64::try_from(retention.as_secs())
                .unwrap_or(i64::MAX)
                .seconds(),
        )
        .unwrap_or(Timestamp::MIN);
    let api: Api<IPAddressRecord> = Api::all(ctx.client.clone());
    let mut params = ListParams::default()
        .labels(&older_than(cutoff, now))
        .limit(500);
    let mut pruned = 0;
    'pages: loop {
        let page = api.list(&params).await.map_err(Error::kube_other(
            "listing history records",
            KEY.to_string(),
        ))?;
        for r in &page.items {
            if pruned >= PRUNE_BATCH {
                break 'pages;
            }
            if r.spec.until.as_ref().is_none_or(|u| u.0 >= cutoff) {
                continue;
            }
            ctx.history.prunes.turn().await;
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: r.uid(),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match api.delete(&r.name_any(), &dp).await {
                Ok(_) => pruned += 1,
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => return Err(Error::kube_other("pruning history record", r.name_any())(e)),
            }
        }
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => params = params.continue_token(&c),
            _ => break,
        }
    }
    ctx.metrics.records_pruned(pruned);
    if pruned > 0 {
        tracing::info!(pruned, retention = ?retention, "pruned history records past the retention");
    }
    Ok(Outcome::RequeueAfter(if pruned >= PRUNE_BATCH {
        std::time::Duration::ZERO
    } else {
        ctx.history.prune_interval
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lookup_leaves_out_every_month_inside_the_retention() {
        let t = |s: &str| s.parse::<Timestamp>().expect("time");
        assert_eq!(
            older_than(t("2026-10-15T00:00:00Z"), t("2026-12-06T00:00:00Z")),
            "local.sdn.cozystack.io/until-month,local.sdn.cozystack.io/until-month notin (2026-11,2026-12,2027-01)"
        );
        // The cutoff's own month is read (its records are judged by their exact end).
        assert!(
            !older_than(t("2025-12-31T23:00:00Z"), t("2026-01-01T00:00:00Z")).contains("2025-12")
        );
        assert!(
            older_than(t("2025-12-31T23:00:00Z"), t("2026-01-01T00:00:00Z"))
                .contains("2026-01,2026-02")
        );
    }
}
