//! `address-controller holders` (who held an address, and when: the abuse desk's question)
//! and `address-controller usage` (address-seconds per namespace and class over a period:
//! what to bill), both read from the addresses' own history and the records of what left
//! them (`api::history::Timeline`), so every run, replica and restart gives the same answer
//! for a period in the past — for an address deleted since, too.

use std::collections::BTreeMap;

use address_controller_api::history::{self, Timeline, Usage};
use address_controller_api::{IPAddress, IPAddressRecord};
use address_controller_runtime::client::ClientArgs;
use address_controller_runtime::report::table;
use anyhow::Context as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::ListParams;

#[derive(clap::Args)]
pub struct HoldersArgs {
    #[command(flatten)]
    kube: ClientArgs,
    /// The IP address (as written in the abuse report: 203.0.113.7, 2001:db8::7).
    address: String,
    /// Only the holding at this instant (RFC 3339, e.g. 2026-03-03T14:02:00Z).
    #[arg(long, env = "ADDRESS_CONTROLLER_HISTORY_AT")]
    at: Option<Timestamp>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Format {
    Table,
    Csv,
}

/// A period of the history, and a namespace (`usage`, `history export`).
#[derive(clap::Args)]
pub struct Period {
    /// Start of the period (RFC 3339, inclusive).
    #[arg(long, env = "ADDRESS_CONTROLLER_HISTORY_FROM")]
    from: Timestamp,
    /// End of the period (RFC 3339, exclusive; default and at most: now).
    #[arg(long, env = "ADDRESS_CONTROLLER_HISTORY_TO")]
    to: Option<Timestamp>,
    /// Only this namespace's claims (and, in an export, its Services).
    #[arg(long, short = 'n', env = "ADDRESS_CONTROLLER_HISTORY_NAMESPACE")]
    namespace: Option<String>,
}

impl Period {
    /// Its end: `--to`, at most now; refused unless `--from` comes before it.
    fn to(&self) -> anyhow::Result<Timestamp> {
        let now = Timestamp::now();
        let to = self.to.map_or(now, |t| t.min(now));
        anyhow::ensure!(
            self.from < to,
            "--from must be before --to (and before now)"
        );
        Ok(to)
    }

    fn keeps(&self, namespace: &str) -> bool {
        self.namespace.as_ref().is_none_or(|n| n == namespace)
    }
}

#[derive(clap::Args)]
pub struct UsageArgs {
    #[command(flatten)]
    kube: ClientArgs,
    #[command(flatten)]
    period: Period,
    /// Output format.
    #[arg(
        long,
        short = 'o',
        value_enum,
        env = "ADDRESS_CONTROLLER_HISTORY_OUTPUT",
        default_value = "table"
    )]
    output: Format,
}

/// The formats of an export.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum ExportFormat {
    /// One JSON object per line.
    Jsonl,
    /// A header line, then one row per record.
    Csv,
}

#[derive(clap::Args)]
pub struct ExportArgs {
    #[command(flatten)]
    kube: ClientArgs,
    #[command(flatten)]
    period: Period,
    /// Output format.
    #[arg(
        long,
        short = 'o',
        value_enum,
        env = "ADDRESS_CONTROLLER_HISTORY_EXPORT_OUTPUT",
        default_value = "jsonl"
    )]
    output: ExportFormat,
}

/// A CSV cell (RFC 4180): quoted when it holds a comma, a quote or a line break.
fn csv_cell(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// Writes the records of every address touching the period to stdout, addresses in name
/// order; says on stderr how many entries the addresses' histories had dropped past their
/// bound before the export (they are not in it).
pub async fn export(args: &ExportArgs) -> anyhow::Result<()> {
    use std::io::Write as _;
    let (from, to) = (args.period.from, args.period.to()?);
    let all = timelines(&args.kube).await?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if let ExportFormat::Csv = args.output {
        writeln!(out, "{}", history::RECORD_COLUMNS.join(","))?;
    }
    let (mut written, mut dropped) = (0usize, 0i64);
    for a in &all {
        let (records, d) = history::records(a, from, to);
        dropped += d;
        for r in records.iter().filter(|r| args.period.keeps(&r.namespace)) {
            match args.output {
                ExportFormat::Jsonl => writeln!(out, "{}", serde_json::to_string(r)?)?,
                ExportFormat::Csv => {
                    let cells: Vec<String> = r.cells().iter().map(|c| csv_cell(c)).collect();
                    writeln!(out, "{}", cells.join(","))?;
                }
            }
            written += 1;
        }
    }
    out.flush()?;
    eprintln!(
        "exported {written} records of {} addresses from {} to {to}{}",
        all.len(),
        from,
        if dropped > 0 {
            format!(
                "; {dropped} older entries had been dropped from the addresses' histories past their bound and are not in it"
            )
        } else {
            String::new()
        }
    );
    Ok(())
}

/// Every object of a kind, in pages (the listing a one-shot makes; never a watch).
async fn list_all<K>(api: Api<K>, what: &str) -> anyhow::Result<Vec<K>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut out = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api
            .list(&params)
            .await
            .with_context(|| format!("listing {what}"))?;
        out.extend(page.items);
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => params = params.continue_token(&c),
            _ => break,
        }
    }
    Ok(out)
}

/// The whole history of every address, those deleted since included: the IPAddresses and
/// the IPAddressRecords, joined by the address's uid, in IPAddress name order.
async fn timelines(kube: &ClientArgs) -> anyhow::Result<Vec<Timeline>> {
    let client = kube.client().await?;
    let addresses: Vec<IPAddress> = list_all(Api::all(client.clone()), "IPAddresses").await?;
    let records: Vec<IPAddressRecord> = list_all(Api::all(client), "IPAddressRecords").await?;
    Ok(Timeline::gather(
        &addresses,
        records.iter().map(|r| &r.spec),
    ))
}

fn time(t: Option<&Time>) -> String {
    t.map_or_else(|| "-".to_string(), |t| t.0.to_string())
}

/// Prints the holdings of `address` (all of them, or the one at `--at`), each with the
/// Services it was on during it. False when the address is unknown or nobody held it then.
pub async fn holders(args: &HoldersArgs) -> anyhow::Result<bool> {
    let ip = address_controller_api::family::parse_address(&args.address)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let all = timelines(&args.kube).await?;
    let found: Vec<&Timeline> = all
        .iter()
        .filter(|t| address_controller_api::family::parse_address(&t.meta.address).ok() == Some(ip))
        .collect();
    if found.is_empty() {
        println!("no IPAddress for {ip}, and no record of one within the retention");
        return Ok(false);
    }
    let mut any = false;
    for t in found {
        any |= holders_of(t, args.at.map(Time));
    }
    Ok(any)
}

/// Prints one address's holdings (all, or the one at `at`). False when none is printed.
fn holders_of(t: &Timeline, at: Option<Time>) -> bool {
    let list: Vec<&address_controller_api::history::Holding> =
        t.holdings.iter().map(|(_, h)| h).collect();
    let spans: Vec<address_controller_api::history::AttachmentSpan> =
        t.spans.iter().map(|(_, s)| s.clone()).collect();
    let spans = &spans[..];
    let missing = t.holdings.first().map_or(t.dropped.0, |(o, _)| *o);
    let mut rows = Vec::new();
    for h in list.iter().copied() {
        if at.as_ref().is_some_and(|t| !h.covers(t)) {
            continue;
        }
        let services: Vec<String> = spans
            .iter()
            .filter(|s| s.during(h))
            .filter(|s| {
                at.as_ref()
                    .is_none_or(|t| history::attached_at(std::slice::from_ref(s), t).len() == 1)
            })
            .map(|s| {
                let node = at.as_ref().and_then(|t| s.node_at(t));
                format!(
                    "{}/{}{}{}",
                    s.namespace.as_deref().unwrap_or(""),
                    s.name,
                    if s.egress { " (egress)" } else { "" },
                    node.map(|n| format!(" (on {n})")).unwrap_or_default()
                )
            })
            .collect();
        rows.push(vec![
            h.namespace.clone(),
            h.name.clone(),
            h.uid.clone().unwrap_or_else(|| "-".into()),
            format!("{:?}", h.state),
            match &h.from {
                Some(f) => f.0.to_string(),
                None => "(before the history)".into(),
            },
            time(h.until.as_ref()),
            h.ended.clone().unwrap_or_else(|| "-".into()),
            if services.is_empty() {
                "-".into()
            } else {
                services.join(",")
            },
        ]);
    }
    println!(
        "IPAddress {} ({}), class {}, uid {}",
        t.meta.ip_address, t.meta.address, t.meta.class_name, t.meta.address_uid
    );
    if missing > 0 {
        println!(
            "{missing} older holding(s) not kept (past the retention, or dropped by an older version); the first kept begins {}",
            time(list.first().and_then(|h| h.from.as_ref()))
        );
    }
    if rows.is_empty() {
        match &at {
            Some(t) => println!("nobody held it at {}", t.0),
            None => println!("nobody has held it since its history began"),
        }
        return false;
    }
    print!(
        "{}",
        table(
            &[
                "NAMESPACE",
                "CLAIM",
                "UID",
                "STATE",
                "FROM",
                "UNTIL",
                "ENDED",
                "SERVICES"
            ],
            &rows
        )
    );
    true
}

/// Prints address-seconds held and attached per namespace and class over the period.
pub async fn usage(args: &UsageArgs) -> anyhow::Result<()> {
    let (from, to) = (args.period.from, args.period.to()?);
    let all = timelines(&args.kube).await?;
    let mut by: BTreeMap<(String, String), Usage> = BTreeMap::new();
    for a in &all {
        for (ns, u) in history::usage_of(a, from.as_second(), to.as_second()) {
            if !args.period.keeps(&ns) {
                continue;
            }
            let acc = by.entry((ns, a.meta.class_name.clone())).or_default();
            acc.addresses += u.addresses;
            acc.held_seconds += u.held_seconds;
            acc.attached_seconds += u.attached_seconds;
            acc.egress_seconds += u.egress_seconds;
            acc.partial |= u.partial;
        }
    }
    let rows: Vec<Vec<String>> = by
        .iter()
        .map(|((ns, class), u)| {
            vec![
                if ns.is_empty() {
                    "?".into()
                } else {
                    ns.clone()
                },
                class.clone(),
                u.addresses.to_string(),
                u.held_seconds.to_string(),
                u.attached_seconds.to_string(),
                u.egress_seconds.to_string(),
                if u.partial { "partial" } else { "complete" }.into(),
            ]
        })
        .collect();
    let header = [
        "NAMESPACE",
        "CLASS",
        "ADDRESSES",
        "HELD_SECONDS",
        "ATTACHED_SECONDS",
        "EGRESS_SECONDS",
        "HISTORY",
    ];
    match args.output {
        Format::Table => {
            println!("from {from} to {to}");
            print!("{}", table(&header, &rows));
        }
        Format::Csv => {
            println!("from,to,{}", header.join(",").to_lowercase());
            for r in rows {
                println!("{from},{to},{}", r.join(","));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::csv_cell;

    #[test]
    fn a_csv_cell_is_quoted_only_when_it_must_be() {
        assert_eq!(csv_cell("tenant-a"), "tenant-a");
        assert_eq!(csv_cell(""), "");
        assert_eq!(csv_cell("a,b"), "\"a,b\"");
        assert_eq!(csv_cell("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_cell("two\nlines"), "\"two\nlines\"");
    }
}
