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

/// One pass: deletes up to [`PRUNE_BATCH`] records older than the retention, then — when
/// more records remain than `--history-max-records` — the oldest past that cap (etcd is
/// the cluster's, and a history that fills it harms everything); again at once when a batch
/// was full, else after the interval.
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
    let aged = pages(&api, &older_than(cutoff, now), PRUNE_BATCH, |r| {
        r.spec.until.as_ref().is_some_and(|u| u.0 < cutoff)
    })
    .await?;
    let pruned = delete_all(&ctx, &api, aged).await?;
    ctx.metrics.records_pruned(pruned);
    if pruned > 0 {
        tracing::info!(pruned, retention = ?retention, "pruned history records past the retention");
    }
    let total = count(&api).await?;
    ctx.metrics.records_total(total);
    let capped = match total.checked_sub(ctx.history.max_records) {
        Some(over) if over > 0 && pruned < PRUNE_BATCH => {
            let n = usize::try_from(over)
                .unwrap_or(usize::MAX)
                .min(PRUNE_BATCH - pruned);
            let all = pages(&api, "", usize::MAX, |r| r.spec.until.is_some()).await?;
            let capped = delete_all(&ctx, &api, fairest_cut(all, n)).await?;
            ctx.metrics.records_capped(capped);
            tracing::warn!(
                capped,
                total,
                max = ctx.history.max_records,
                "history records past --history-max-records: the oldest pruned before the retention; lower the retention or raise the cap (and etcd's quota)"
            );
            capped
        }
        _ => 0,
    };
    Ok(Outcome::RequeueAfter(if pruned + capped >= PRUNE_BATCH {
        std::time::Duration::ZERO
    } else {
        ctx.history.prune_interval
    }))
}

/// The `n` records the cap takes: one at a time from the namespace that holds the most,
/// its oldest first — a tenant that churns claims to fill the cap prunes its own history,
/// not the other tenants' (a cap a stranger can fill must not lock the others out).
pub fn fairest_cut(records: Vec<IPAddressRecord>, n: usize) -> Vec<IPAddressRecord> {
    use std::collections::{BTreeMap, BinaryHeap, VecDeque};
    let mut by: BTreeMap<String, Vec<IPAddressRecord>> = BTreeMap::new();
    for r in records {
        by.entry(r.spec.namespace.clone()).or_default().push(r);
    }
    let mut queues: Vec<VecDeque<IPAddressRecord>> = by
        .into_values()
        .map(|mut v| {
            v.sort_by_key(|r| r.spec.until.as_ref().map(|u| u.0));
            v.into()
        })
        .collect();
    // (how many it holds, its oldest end reversed: the older first among equals, index).
    let key = |q: &VecDeque<IPAddressRecord>, i: usize| {
        let oldest = q.front().and_then(|r| r.spec.until.as_ref()).map(|u| u.0);
        (q.len(), std::cmp::Reverse(oldest), i)
    };
    let mut heap: BinaryHeap<_> = queues.iter().enumerate().map(|(i, q)| key(q, i)).collect();
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let Some((_, _, i)) = heap.pop() else { break };
        let Some(r) = queues[i].pop_front() else {
            continue;
        };
        out.push(r);
        if !queues[i].is_empty() {
            heap.push(key(&queues[i], i));
        }
    }
    out
}

/// How many records there are: one list of one item, and the server's count of the rest.
async fn count(api: &Api<IPAddressRecord>) -> Result<i64> {
    let page = api
        .list_metadata(&ListParams::default().limit(1))
        .await
        .map_err(Error::kube_other(
            "counting history records",
            KEY.to_string(),
        ))?;
    let n = i64::try_from(page.items.len()).unwrap_or(0);
    Ok(n + page.metadata.remaining_item_count.unwrap_or(0))
}

/// The records `labels` selects that `keep` keeps, read in pages until there are `at_most`.
async fn pages(
    api: &Api<IPAddressRecord>,
    labels: &str,
    at_most: usize,
    keep: impl Fn(&IPAddressRecord) -> bool,
) -> Result<Vec<IPAddressRecord>> {
    let mut params = ListParams::default().labels(labels).limit(500);
    let mut out = Vec::new();
    loop {
        let page = api.list(&params).await.map_err(Error::kube_other(
            "listing history records",
            KEY.to_string(),
        ))?;
        out.extend(page.items.into_iter().filter(&keep));
        if out.len() >= at_most {
            out.truncate(at_most);
            return Ok(out);
        }
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => params = params.continue_token(&c),
            _ => return Ok(out),
        }
    }
}

/// Deletes `records` (each by its uid), at the retention's pace. Returns how many went.
async fn delete_all(
    ctx: &Context,
    api: &Api<IPAddressRecord>,
    records: Vec<IPAddressRecord>,
) -> Result<usize> {
    let mut n = 0;
    for r in records {
        ctx.history.prunes.turn().await;
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: r.uid(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&r.name_any(), &dp).await {
            Ok(_) => n += 1,
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => return Err(Error::kube_other("pruning history record", r.name_any())(e)),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(ns: &str, ordinal: i64, until: i64) -> IPAddressRecord {
        use address_controller_api::history::{Holding, HoldingState};
        let a: address_controller_api::IPAddress = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "ipv4-192-0-2-1", "uid": "u"},
            "spec": {"address": "192.0.2.1", "className": "pub", "source": {"fromClass": {}}}}))
        .expect("address");
        let t = |s: i64| {
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Timestamp::from_second(1_800_000_000 + s).expect("time"),
            )
        };
        let h = Holding {
            namespace: ns.into(),
            name: format!("c{ordinal}"),
            uid: None,
            state: HoldingState::Bound,
            from: Some(t(until - 1)),
            until: Some(t(until)),
            ended: None,
            found: false,
        };
        address_controller_api::history::AddressMeta::of(&a)
            .holding(ordinal, &h)
            .to_object()
    }

    #[test]
    fn the_cap_takes_from_the_namespace_that_holds_the_most() {
        // A churner with 6 recent records; two quiet tenants with old ones.
        let mut all: Vec<IPAddressRecord> = (0..6).map(|i| record("churn", i, 100 + i)).collect();
        all.push(record("quiet-a", 10, 1));
        all.push(record("quiet-b", 11, 2));
        all.push(record("quiet-b", 12, 3));
        let cut = |n: usize| -> Vec<(String, i64)> {
            fairest_cut(all.clone(), n)
                .iter()
                .map(|r| (r.spec.namespace.clone(), r.spec.ordinal))
                .collect()
        };
        // Oldest first would take the quiet tenants' records; fairness takes the churner's.
        assert_eq!(
            cut(3),
            [
                ("churn".into(), 0),
                ("churn".into(), 1),
                ("churn".into(), 2)
            ]
        );
        // Down to two each, then the older namespace among equals, each its oldest.
        assert_eq!(cut(5)[3..], [("churn".into(), 3), ("quiet-b".into(), 11)]);
        assert_eq!(cut(100).len(), 9, "never more than there are");
    }

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
