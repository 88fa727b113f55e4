//! Association (SPEC §8), one pass over a Service: which Services hold a claim's addresses,
//! the ledger, the kit's record and the pins, and the Service's condition. (What a pass over
//! an address does about who shows it — Conflict, Lost — is [`super::health`].)
//!
//! * **Who may hold.** A `type: LoadBalancer` Service the backend serves, not being deleted,
//!   whose `local.sdn.cozystack.io/ip-address-claim` names a claim — `<name>` in its own
//!   namespace, or `<namespace>/<name>` of a claim that shares with its namespace; the claim
//!   `Bound`; each of its listed addresses of this driver's classes `Bound` (or `Conflict`:
//!   the rightful Service keeps it), naming the claim with its uid. Ownership is by the
//!   **address's class**, never by the claim's stamp: a claim bound to a static or recycled
//!   address carries none.
//! * **Holders.** [`address_controller_api::sharing::admit`] judges the Services naming a
//!   claim — the holders the ledger records first, then the others oldest first: without
//!   sharing one holds, with sharing every compatible one (no common port on a common family,
//!   one backend); a gone holder is taken over. Every Service naming a claim gets the
//!   condition `local.sdn.cozystack.io/AddressAttached` saying whether it holds and why not.
//! * **Order.** Ledger first: the Service is added to the addresses' `status.attachments`
//!   (`associatedTo` names the first holder), then the kit's record of its pins on the
//!   Service (an annotation), then the backend pins. Withdrawing: the backend unpins, and the
//!   Service leaves the ledger only once the backend shows the address gone from it — left
//!   first, the Service would look like a thief. A new holder waits while a Service that is
//!   not a co-holder still shows the address (the handoff of an unshared claim).
//! * **Conflict.** A Service that shows a claimed address of this driver's classes, which
//!   the ledger does not list as a holder, makes the address `Conflict`; nothing is
//!   re-pinned. The ledger alone judges: the kit's record on a Service (its annotation) says
//!   what to unpin, never who may show an address — a tenant can write its own Service's
//!   annotations where no admission policy fences them. When no such Service remains, the
//!   address gets the phase the core would compute ([`IPAddress::resting_phase`]).
//! * **Lost.** The backend says an address is missing: `Lost`; present again: its resting
//!   phase.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use address_controller_api::family::parse_address;
use address_controller_api::kubevirt::{Backends, MULTIPLE_WORKLOADS_HOLD_DOWN};
use address_controller_api::names::driver as reason;
use address_controller_api::sharing::{self, Candidate, Refusal};
use address_controller_api::{
    AddressPhase, Attachment, AttachmentMethod, ClaimPhase, IPAddress, IPAddressClaim,
};
use address_controller_runtime::events::PlannedEvent;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use serde_json::json;

pub use address_controller_api::service::service_families;

/// `namespace/name` of a Service.
pub fn service_key(s: &Service) -> String {
    address_controller_runtime::cache::key_of(s)
}

/// The claim a Service names, if any (the raw annotation value).
pub use address_controller_api::service::named_claim as claim_annotation;

/// A LoadBalancer Service that is not being deleted (the kit's half of "served").
pub fn is_load_balancer(s: &Service) -> bool {
    s.metadata.deletion_timestamp.is_none()
        && address_controller_api::service::is_load_balancer_type(s)
}

/// The kit's record of its pins on a Service (its annotation).
pub fn parse_marker(value: Option<&str>) -> Vec<IpAddr> {
    value
        .unwrap_or_default()
        .split(',')
        .filter_map(|s| parse_address(s.trim()).ok())
        .collect()
}

pub fn render_marker(ips: &[IpAddr]) -> Option<String> {
    (!ips.is_empty()).then(|| {
        ips.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    })
}

/// IPv4 first, then by address; no duplicates.
fn sorted(mut ips: Vec<IpAddr>) -> Vec<IpAddr> {
    address_controller_api::family::sort_ipv4_first(&mut ips);
    ips
}

use address_controller_api::Family;

/// Whether a claimed address may be put on a Service for `claim`: it names the claim with
/// the claim's uid and is `Bound` (or `Conflict`, which the rightful Service keeps).
fn holdable(a: &IPAddress, claim: &IPAddressClaim) -> bool {
    let uid_equal = a
        .spec
        .claim_ref
        .as_ref()
        .is_some_and(|r| r.uid.is_some() && r.uid == claim.metadata.uid);
    a.belongs_to(claim)
        && uid_equal
        && !a.is_deleting()
        && matches!(
            a.phase(),
            Some(AddressPhase::Bound | AddressPhase::Conflict)
        )
}

/// Judges the Services that may hold a claim (`rivals`): the ledger's holders of
/// `addresses` first, then the others oldest first. Returns each Service's key with its
/// verdict, in that order.
pub fn verdicts(
    claim: &IPAddressClaim,
    rivals: &[Arc<Service>],
    addresses: &[Arc<IPAddress>],
) -> Vec<(String, Result<(), Refusal>)> {
    let mut recorded: Vec<String> = Vec::new();
    for k in addresses.iter().flat_map(|a| a.holder_services()) {
        if !recorded.contains(&k) {
            recorded.push(k);
        }
    }
    let keyed: Vec<(String, &Service)> = rivals
        .iter()
        .map(|s| (service_key(s), s.as_ref()))
        .collect();
    let ordered = sharing::order(
        keyed.iter().collect(),
        &recorded,
        |x| x.0.as_str(),
        |x| {
            x.1.metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_second())
        },
    );
    let candidates: Vec<Candidate<'_>> = ordered
        .iter()
        .map(|(k, s)| Candidate {
            key: k,
            namespace: k.split_once('/').map_or("", |(ns, _)| ns),
            service: s,
        })
        .collect();
    let judged = sharing::admit(claim, &candidates);
    ordered.iter().map(|(k, _)| k.clone()).zip(judged).collect()
}

/// What a pass over one Service sees.
pub struct ServiceSnapshot<'a> {
    /// `namespace/name` of the Service.
    pub key: &'a str,
    /// `None`: the Service is gone.
    pub service: Option<&'a Service>,
    /// A LoadBalancer, not being deleted, that the backend serves.
    pub served: bool,
    /// The claim its annotation names, when it exists.
    pub claim: Option<&'a IPAddressClaim>,
    /// The addresses of this driver's classes the claim lists, as cached.
    pub addresses: &'a [Arc<IPAddress>],
    /// The addresses the claim lists that belong to other drivers' classes (another driver
    /// associates those).
    pub foreign: usize,
    /// The served Services naming the same claim, this one included.
    pub rivals: &'a [Arc<Service>],
    /// This driver's addresses whose ledger lists this Service as a holder.
    pub associated_here: &'a [Arc<IPAddress>],
    /// The kit's record of its pins here, and what the backend shows.
    pub marked: &'a [IpAddr],
    pub shown: &'a [IpAddr],
    /// The other Services whose backend still shows `ip`.
    pub shown_elsewhere: &'a dyn Fn(IpAddr) -> Vec<String>,
    /// Why the backend cannot put an address on a Service ([`crate::Driver::servable`]).
    pub unservable: &'a dyn Fn(&IPAddress) -> Option<String>,
    /// For a Service cozy-proxy serves: who is behind it (its EndpointSlices and the VMIs
    /// their pods run; `None`: not known yet — such a Service waits — or not such a
    /// Service).
    pub backends: Option<Backends>,
    /// How long more than one workload has been behind it, by the driver's clock (`None`:
    /// not now).
    pub multiple_for: Option<Duration>,
    /// The backend shows what it pins at once (it is the load balancer: the range driver);
    /// otherwise the condition waits until the Service shows the address.
    pub pin_shows: bool,
}

/// The `AddressAttached` condition a Service should carry: `(status, reason, message)`.
pub type ServiceCondition = (bool, &'static str, String);

/// What one pass over a Service does, in this order.
#[derive(Debug, Default)]
pub struct ServicePlan {
    /// Add this Service (with its ports) to these addresses' holders, or bring its ports up
    /// to date (ledger first).
    pub associate: Vec<Arc<IPAddress>>,
    /// The Service as the ledger records a holder: its ports and how cozy-proxy serves it
    /// ([`sharing::attachment`]).
    pub attachment: Option<Attachment>,

    /// The kit's record of its pins, when it changes (written before the backend).
    pub marker: Option<Vec<IpAddr>>,
    /// Ask the backend to pin exactly `want` of `ours` (the Service exists).
    pub pin: Option<(Vec<IpAddr>, Vec<IpAddr>)>,
    /// Take this Service off these addresses' holders: the backend shows them gone from it.
    pub disassociate: Vec<Arc<IPAddress>>,
    /// The condition the Service should carry (`None`: none of ours — it names no claim or
    /// the backend does not serve it).
    pub condition: Option<ServiceCondition>,
    /// Not this driver's Service — it does not serve it and has neither pinned it nor
    /// recorded it as a holder: its `AddressAttached` condition is the serving driver's,
    /// left as it is. (Removing it here fought the serving driver: on the node tier the
    /// MetalLB driver deleted what the range driver wrote, about 90 Service writes a second
    /// for as long as a range Service held its address.)
    pub not_ours: bool,
    pub events: Vec<PlannedEvent>,
    /// Why the Service gets nothing, once per episode (`None`: nothing wrong).
    pub problem: Option<PlannedEvent>,
    /// For the owner of another namespace's claim the Service was refused: an event on the
    /// claim, in the owner's namespace.
    pub owner_notice: Option<PlannedEvent>,
    /// Look at the Service again after this long (the hold-down ends then).
    pub recheck: Option<Duration>,
}

fn refused(plan: &mut ServicePlan, event: &'static str, condition: &'static str, why: String) {
    plan.problem = Some(PlannedEvent::warning(event, why.clone()));
    plan.condition = Some((false, condition, why));
}

impl ServicePlan {
    /// The events the ledger write alone makes true (`Associated`: the address is the
    /// Service's from then on): published right after it, before anything on the Service
    /// can fail — a pass that failed after the ledger write (a load balancer's status write
    /// in between makes the kit's Service patch a 409) was retried with the Service already
    /// in the ledger, had nothing fresh to say, and the event was never published.
    pub fn ledger_events(&self) -> impl Iterator<Item = &PlannedEvent> {
        self.events
            .iter()
            .filter(|e| e.reason == reason::ASSOCIATED)
    }

    /// The other events: published once the pass has done everything else.
    pub fn closing_events(&self) -> impl Iterator<Item = &PlannedEvent> {
        self.events
            .iter()
            .filter(|e| e.reason != reason::ASSOCIATED)
    }
}

/// Plans one pass over a Service.
pub fn plan_service(s: &ServiceSnapshot<'_>) -> ServicePlan {
    let mut plan = ServicePlan::default();
    let (wanted, co_holders) = judge(s, &mut plan);
    plan.attachment = s.service.map(|svc| {
        let mut a = sharing::attachment(s.key, Some(svc));
        a.node = node_now(s);
        a
    });
    let pinnable = ledger_first(s, &mut plan, &wanted, &co_holders);
    say_associated(s, &mut plan, &wanted, &pinnable);
    if s.service.is_some() {
        record_and_pin(s, &mut plan, &pinnable);
    }
    withdraw(s, &mut plan, &wanted, &pinnable);
    until_shown(s, &mut plan, &pinnable);
    if let Some(svc) = s
        .service
        .filter(|svc| address_controller_api::service::cozy_proxy(svc).is_some())
    {
        say_moving(&mut plan, s, svc);
    }
    plan.not_ours = !s.served && s.marked.is_empty() && s.associated_here.is_empty();
    plan
}

/// The condition tells the truth: `True` only once the load balancer shows every address
/// pinned on the Service; until then it waits (and the runner asks the backend why, when
/// it refused).
fn until_shown(s: &ServiceSnapshot<'_>, plan: &mut ServicePlan, pinnable: &[IpAddr]) {
    if s.pin_shows || !matches!(plan.condition, Some((true, ..))) {
        return;
    }
    let missing: Vec<String> = pinnable
        .iter()
        .filter(|ip| !s.shown.contains(ip))
        .map(ToString::to_string)
        .collect();
    if missing.is_empty() {
        return;
    }
    plan.condition = Some((
        false,
        sharing::reason::WAITING_FOR_LOAD_BALANCER,
        format!(
            "{} pinned on the Service; the load balancer does not show it yet",
            missing.join(", ")
        ),
    ));
}

/// The Service's name (its key without the namespace).
fn name_of<'a>(s: &ServiceSnapshot<'a>) -> &'a str {
    s.key.split_once('/').map_or(s.key, |(_, n)| n)
}

/// Whether the Service may hold its claim's addresses, said in the plan's condition: the
/// addresses it should hold now (possibly after a handoff), and the Services admitted with
/// it (judged once, with its own verdict).
fn judge(s: &ServiceSnapshot<'_>, plan: &mut ServicePlan) -> (Vec<Arc<IPAddress>>, Vec<String>) {
    let mut wanted: Vec<Arc<IPAddress>> = Vec::new();
    let mut co_holders: Vec<String> = Vec::new();
    let reference = s
        .service
        .filter(|_| s.served)
        .and_then(address_controller_api::service::claim_reference);
    match (reference, s.service) {
        (Some(Err(why)), _) => refused(
            plan,
            reason::CLAIM_NOT_FOUND,
            sharing::reason::INVALID_CLAIM_REFERENCE,
            why,
        ),
        (Some(Ok((ns, claim_name))), Some(svc)) => {
            let claim_ref = format!("{ns}/{claim_name}");
            let own = s.key.split_once('/').map_or("", |(n, _)| n);
            let theirs = ns != own;
            match s.claim {
                // Not ours to know: another namespace's claim that is missing and one that
                // does not share read alike; its owner hears of the refusal on the claim.
                _ if theirs && !s.claim.is_some_and(|c| c.admits_namespace(own)) => {
                    refused(
                        plan,
                        reason::ASSOCIATION_REJECTED,
                        sharing::reason::NOT_SHARED,
                        sharing::not_shared_message(&claim_ref),
                    );
                    if s.claim.is_some() {
                        plan.owner_notice = Some(PlannedEvent::warning(
                            reason::SERVICE_REFUSED,
                            format!(
                                "a Service of namespace {own} names this claim and was refused: the claim does not share its address with that namespace"
                            ),
                        ));
                    }
                }
                None => refused(
                    plan,
                    reason::CLAIM_NOT_FOUND,
                    sharing::reason::CLAIM_NOT_FOUND,
                    format!(
                        "IPAddressClaim {claim_ref} does not exist; nothing is put on the Service"
                    ),
                ),
                Some(c) if c.phase() != Some(ClaimPhase::Bound) => refused(
                    plan,
                    reason::CLAIM_NOT_BOUND,
                    sharing::reason::CLAIM_NOT_BOUND,
                    format!(
                        "IPAddressClaim {claim_ref} is {}; its addresses are put on the Service once it is Bound",
                        c.phase().map_or("Pending", |p| p.as_str())
                    ),
                ),
                Some(c) => {
                    let judged = verdicts(c, s.rivals, s.addresses);
                    co_holders = judged
                        .iter()
                        .filter(|(_, v)| v.is_ok())
                        .map(|(k, _)| k.clone())
                        .collect();
                    let verdict = judged
                        .into_iter()
                        .find(|(k, _)| k == s.key)
                        .map_or(Err(Refusal::NotShared), |(_, v)| v);
                    match verdict {
                        Err(r) => refused(
                            plan,
                            reason::ASSOCIATION_REJECTED,
                            r.reason(),
                            r.message(&claim_ref),
                        ),
                        Ok(()) => admitted(plan, s, svc, c, &claim_ref, &mut wanted),
                    }
                }
            }
        }
        _ => {}
    }
    (wanted, co_holders)
}

/// The node the Service's one workload runs on, for its ledger record: what its backends
/// say now, else what the ledger recorded (not known for a moment is not a move).
fn node_now(s: &ServiceSnapshot<'_>) -> Option<String> {
    s.backends
        .as_ref()
        .and_then(|b| b.node().map(str::to_string))
        .or_else(|| {
            s.addresses
                .iter()
                .filter_map(|a| a.status.as_ref())
                .flat_map(|st| &st.attachments)
                .find(|h| h.association().service_key().as_deref() == Some(s.key))
                .and_then(|h| h.node.clone())
        })
}

/// Ledger first: this Service joins the holders of what it should hold, unless a Service
/// that is not a co-holder still shows it (the handoff waits for it to let go). What it
/// may be pinned, IPv4 first.
fn ledger_first(
    s: &ServiceSnapshot<'_>,
    plan: &mut ServicePlan,
    wanted: &[Arc<IPAddress>],
    co_holders: &[String],
) -> Vec<IpAddr> {
    let mut pinnable: Vec<IpAddr> = Vec::new();
    for a in wanted {
        let Some(ip) = a.ip() else { continue };
        let recorded = a
            .status
            .as_ref()
            .and_then(|st| {
                st.attachments
                    .iter()
                    .find(|h| h.association().service_key().as_deref() == Some(s.key))
            })
            .map(|h| (&h.ports, h.method, h.allow_icmp, &h.node));
        let want = plan
            .attachment
            .as_ref()
            .map(|h| (&h.ports, h.method, h.allow_icmp, &h.node));
        if recorded.is_some() && recorded == want {
            pinnable.push(ip);
            continue;
        }
        if recorded.is_none() && a.holder_services().iter().any(|k| k == s.key) {
            // Recorded by the older `associatedTo` alone: add it to the attachments.
            plan.associate.push(a.clone());
            pinnable.push(ip);
            continue;
        }
        // A Service that is not a co-holder and still shows the address, or is still in the
        // ledger, is let go of first (its own pass withdraws it, and says so on it).
        let blocked = (s.shown_elsewhere)(ip)
            .into_iter()
            .chain(a.holder_services())
            .any(|k| k != s.key && !co_holders.contains(&k));
        if recorded.is_some() || !blocked {
            plan.associate.push(a.clone());
            pinnable.push(ip);
        }
    }
    sorted(pinnable)
}

/// The event for addresses newly put on the Service; the condition says it waits while
/// another Service still holds what it should hold.
fn say_associated(
    s: &ServiceSnapshot<'_>,
    plan: &mut ServicePlan,
    wanted: &[Arc<IPAddress>],
    pinnable: &[IpAddr],
) {
    let fresh: Vec<&str> = plan
        .associate
        .iter()
        .filter(|a| !a.holder_services().iter().any(|k| k == s.key))
        .map(|a| a.spec.address.as_str())
        .collect();
    if !fresh.is_empty() {
        plan.events.push(PlannedEvent::normal(
            reason::ASSOCIATED,
            format!(
                "{} of IPAddressClaim {} put on Service {}",
                fresh.join(", "),
                s.claim.map(|c| c.key()).unwrap_or_default(),
                name_of(s)
            ),
        ));
    }
    if let (Some(c), Some((true, ..))) = (s.claim, plan.condition.as_ref())
        && pinnable.is_empty()
        && !wanted.is_empty()
    {
        plan.condition = Some((
            false,
            sharing::reason::ATTACHED_ELSEWHERE,
            format!(
                "waiting for the Service that held the address of IPAddressClaim {} to let go of it",
                c.key()
            ),
        ));
    }
}

/// The record (what is pinned now, plus what is still shown of earlier pins) and what the
/// backend pins.
fn record_and_pin(s: &ServiceSnapshot<'_>, plan: &mut ServicePlan, pinnable: &[IpAddr]) {
    let still: Vec<IpAddr> = s
        .marked
        .iter()
        .copied()
        .filter(|ip| s.shown.contains(ip))
        .collect();
    let marker = sorted(pinnable.iter().copied().chain(still).collect());
    if marker != sorted(s.marked.to_vec()) {
        plan.marker = Some(marker);
    }
    if s.served || !s.marked.is_empty() || !pinnable.is_empty() {
        let ours = sorted(
            s.marked
                .iter()
                .copied()
                .chain(pinnable.iter().copied())
                .collect(),
        );
        plan.pin = Some((ours, pinnable.to_vec()));
    }
}

/// Withdrawn: the Service leaves the ledger once the backend shows the address gone (or
/// the Service is gone).
fn withdraw(
    s: &ServiceSnapshot<'_>,
    plan: &mut ServicePlan,
    wanted: &[Arc<IPAddress>],
    pinnable: &[IpAddr],
) {
    for a in s.associated_here {
        let Some(ip) = a.ip() else { continue };
        let gone = s.service.is_none() || !s.shown.contains(&ip);
        if !pinnable.contains(&ip) && gone && !wanted.iter().any(|w| w.name_any() == a.name_any()) {
            plan.disassociate.push(a.clone());
        }
    }
    if !plan.disassociate.is_empty() && s.service.is_some() {
        let list: Vec<&str> = plan
            .disassociate
            .iter()
            .map(|a| a.spec.address.as_str())
            .collect();
        plan.events.push(PlannedEvent::normal(
            reason::DISASSOCIATED,
            format!("{} taken off Service {}", list.join(", "), name_of(s)),
        ));
    }
}

/// A Service the claim's sharing admits: the addresses of its families it should hold —
/// for a Service cozy-proxy serves, its IPv4 address only (cozy-proxy is IPv4 only), and
/// only while it selects one ready pod (cozy-proxy forwards the address to one).
fn admitted(
    plan: &mut ServicePlan,
    s: &ServiceSnapshot<'_>,
    svc: &Service,
    c: &IPAddressClaim,
    claim_ref: &str,
    wanted: &mut Vec<Arc<IPAddress>>,
) {
    let proxied = address_controller_api::service::cozy_proxy(svc);
    if proxied.is_some() && !one_backend(plan, s, claim_ref) {
        return;
    }
    let mut families = service_families(svc);
    if proxied.is_some() {
        families.retain(|f| *f == Family::IPv4);
    }
    let mut mismatched = Vec::new();
    let mut not_served = Vec::new();
    for a in s.addresses.iter().filter(|a| holdable(a, c)) {
        match a.family() {
            Some(f) if families.contains(&f) => match (s.unservable)(a) {
                None => wanted.push(a.clone()),
                Some(why) => not_served.push(why),
            },
            _ => mismatched.push(format!(
                "{} ({})",
                a.spec.address,
                a.family().map_or("invalid", |f| f.as_str())
            )),
        }
    }
    let list: Vec<&str> = wanted.iter().map(|a| a.spec.address.as_str()).collect();
    let how = attached_how(proxied, c);
    plan.condition = Some((
        true,
        sharing::reason::ATTACHED,
        format!("{} of IPAddressClaim {claim_ref} {how}", list.join(", ")),
    ));
    if !mismatched.is_empty() {
        let why = if proxied.is_some() {
            format!(
                "cozy-proxy serves IPv4 only; {} of IPAddressClaim {claim_ref} not put on the Service",
                mismatched.join(", ")
            )
        } else {
            format!(
                "the Service's families are {}; {} of IPAddressClaim {claim_ref} not put on it",
                families
                    .iter()
                    .map(|f| f.as_str())
                    .collect::<Vec<_>>()
                    .join(","),
                mismatched.join(", ")
            )
        };
        plan.problem = Some(PlannedEvent::warning(reason::FAMILY_MISMATCH, why.clone()));
        if wanted.is_empty() {
            plan.condition = Some((false, sharing::reason::FAMILY_MISMATCH, why));
        } else if let Some((true, _, message)) = plan.condition.as_mut() {
            message.push_str(&format!("; {why}"));
        }
    }
    if !not_served.is_empty() {
        let why = format!(
            "{} (IPAddressClaim {claim_ref}); not put on the Service",
            not_served.join("; ")
        );
        plan.problem = Some(PlannedEvent::warning(
            reason::ADDRESS_NOT_SERVED,
            why.clone(),
        ));
        if wanted.is_empty() {
            plan.condition = Some((false, sharing::reason::ADDRESS_NOT_SERVED, why));
        }
    }
    if wanted.is_empty() && s.addresses.is_empty() && s.foreign == 0 {
        refused(
            plan,
            reason::CLAIM_NOT_BOUND,
            sharing::reason::CLAIM_NOT_BOUND,
            format!("IPAddressClaim {claim_ref} lists no address yet"),
        );
    }
}

/// A Service cozy-proxy serves gets its address while one workload is behind it — a VM
/// moving between nodes is one ([`Backends::Migrating`]) — and keeps it: an address on the
/// Service is never taken off because its endpoints went to zero, are not known for a
/// moment, or are more than one for less than the hold-down. Whether it may hold it; else
/// the plan says why not.
fn one_backend(plan: &mut ServicePlan, s: &ServiceSnapshot<'_>, claim_ref: &str) -> bool {
    let holds = !s.associated_here.is_empty();
    match &s.backends {
        None if holds => true,
        None => {
            // Pinned before the pods are counted, the address could be forwarded to the
            // first of two pods for as long as the count takes (seen on the node tier): it
            // waits.
            plan.condition = Some((
                false,
                sharing::reason::WAITING_FOR_ENDPOINTS,
                format!(
                    "cozy-proxy forwards the address of IPAddressClaim {claim_ref} to one pod; how many this Service selects is not known yet, nothing is put on it until it is"
                ),
            ));
            false
        }
        Some(Backends::Many(n)) => {
            let held = s.multiple_for.unwrap_or_default();
            if holds && held < MULTIPLE_WORKLOADS_HOLD_DOWN {
                plan.recheck = Some(MULTIPLE_WORKLOADS_HOLD_DOWN - held);
                return true;
            }
            refused(
                plan,
                reason::ASSOCIATION_REJECTED,
                sharing::reason::MULTIPLE_ENDPOINTS,
                format!(
                    "cozy-proxy forwards the address of IPAddressClaim {claim_ref} to one pod and sends that pod's traffic from it; {n} workloads are behind this Service (ready pods not of one VirtualMachineInstance), nothing is put on it until one is"
                ),
            );
            false
        }
        Some(Backends::None | Backends::One { .. } | Backends::Migrating { .. }) => true,
    }
}

/// While the address is on the Service, the condition says what it holds through: a VM
/// moving (`Migrating`, and an event when the move is first seen) or more than one
/// workload within the hold-down (`HeldDown`).
fn say_moving(plan: &mut ServicePlan, s: &ServiceSnapshot<'_>, svc: &Service) {
    let Some((true, why, message)) = plan.condition.as_mut() else {
        return;
    };
    let was = sharing::condition(svc).map(|c| c.reason.as_str());
    match &s.backends {
        Some(Backends::Migrating { vmi, nodes, node }) => {
            let on = node.as_deref().unwrap_or("(not said yet)");
            let note = format!(
                "VirtualMachineInstance {vmi} is moving: ready on {}, running on {on} by its word; one backend, the address stays on the Service",
                nodes.join(" and ")
            );
            message.push_str(&format!("; {note}"));
            *why = sharing::reason::MIGRATING;
            if was != Some(sharing::reason::MIGRATING) {
                plan.events
                    .push(PlannedEvent::normal(reason::MIGRATING, note));
            }
        }
        Some(Backends::Many(n)) if plan.recheck.is_some() => {
            let left = plan.recheck.unwrap_or_default().as_secs();
            let note = format!(
                "{n} workloads are behind the Service (ready pods not of one VirtualMachineInstance); cozy-proxy forwards the address to one; it stays on the Service for the hold-down of {} s ({left} s left), then it is taken off unless one workload remains",
                MULTIPLE_WORKLOADS_HOLD_DOWN.as_secs()
            );
            message.push_str(&format!("; {note}"));
            *why = sharing::reason::HELD_DOWN;
            if was != Some(sharing::reason::HELD_DOWN) {
                plan.events
                    .push(PlannedEvent::warning(reason::HELD_DOWN, note));
            }
        }
        _ => {}
    }
}

/// How the address is attached, as the condition says it.
fn attached_how(
    proxied: Option<address_controller_api::service::Proxied>,
    c: &IPAddressClaim,
) -> String {
    match proxied {
        Some(p) if p.method == AttachmentMethod::WholeIP => {
            "(whole, by cozy-proxy: every port and ICMP to the Service's pod, its outbound traffic from the address)".to_string()
        }
        Some(p) => format!(
            "(by cozy-proxy, the listed ports only, ICMP {}; the pod's outbound traffic from the address)",
            if p.allow_icmp { "allowed" } else { "dropped" }
        ),
        None if c.is_shared() => "(shared by port)".to_string(),
        None => "(not shared)".to_string(),
    }
}

/// The strategic merge patch of a Service's status that brings its `AddressAttached`
/// condition to `want` (removes it for `None`), or `None` when it already says so. The
/// condition list is keyed by type, so the Service's other conditions are left alone; the
/// transition time moves only when the status does (`now` then).
pub fn condition_patch(
    svc: &Service,
    want: Option<&ServiceCondition>,
    now: Time,
) -> Option<serde_json::Value> {
    let have = sharing::condition(svc);
    match (have, want) {
        (None, None) => None,
        (Some(h), Some((on, why, message)))
            if (h.status == "True") == *on && h.reason == *why && h.message == *message =>
        {
            None
        }
        (Some(_), None) => Some(json!({"status": {"conditions": [
            {"type": sharing::CONDITION, "$patch": "delete"}]}})),
        (_, Some((on, why, message))) => {
            let changed = have.is_none_or(|h| (h.status == "True") != *on);
            let since = match (changed, have) {
                (false, Some(h)) => h.last_transition_time.clone(),
                _ => now,
            };
            Some(
                json!({"status": {"conditions": [{"type": sharing::CONDITION,
                "status": if *on { "True" } else { "False" },
                "reason": why, "message": message,
                "observedGeneration": svc.metadata.generation,
                "lastTransitionTime": since}]}}),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::decide::fixtures::*;
    use address_controller_api::names::SERVICE_CLAIM_ANNOTATION;
    use serde_json::json;

    /// A Service whose `AddressAttached` condition says `(status, reason, message)` since
    /// `since` (seconds), or that has none.
    fn with_condition(c: Option<(&str, &str, &str)>, since: i64) -> Service {
        let mut s = Service::default();
        s.metadata.generation = Some(3);
        s.status = Some(k8s_openapi::api::core::v1::ServiceStatus {
            conditions: c.map(|(status, reason, message)| {
                vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                    type_: sharing::CONDITION.into(),
                    status: status.into(),
                    reason: reason.into(),
                    message: message.into(),
                    last_transition_time: second(since),
                    observed_generation: Some(2),
                }]
            }),
            ..Default::default()
        });
        s
    }

    fn second(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn a_condition_is_written_only_when_it_changes_and_its_time_moves_with_its_status() {
        let now = second(1_000);
        let attached = Some((true, "Attached", "ok".to_string()));
        // Nothing to say, nothing said; or exactly what is said already: no write.
        assert_eq!(
            condition_patch(&with_condition(None, 0), None, now.clone()),
            None
        );
        let same = with_condition(Some(("True", "Attached", "ok")), 10);
        assert_eq!(condition_patch(&same, attached.as_ref(), now.clone()), None);
        // Not ours to say any more: removed by its type alone.
        assert_eq!(
            condition_patch(&same, None, now.clone()),
            Some(json!({"status": {"conditions": [
                {"type": sharing::CONDITION, "$patch": "delete"}]}}))
        );
        // A new message, the same status: the transition time stays.
        let reworded = Some((true, "Attached", "ok, shared".to_string()));
        let patch = condition_patch(&same, reworded.as_ref(), now.clone()).unwrap();
        let c = &patch["status"]["conditions"][0];
        assert_eq!(c["message"], "ok, shared");
        assert_eq!(c["lastTransitionTime"], json!(second(10)));
        assert_eq!(c["observedGeneration"], 3);
        // Another status: the transition time is now; none before: now too.
        let refused = Some((false, "PortConflict", "port 80".to_string()));
        for svc in [same, with_condition(None, 0)] {
            let patch = condition_patch(&svc, refused.as_ref(), now.clone()).unwrap();
            let c = &patch["status"]["conditions"][0];
            assert_eq!(
                (&c["status"], &c["reason"]),
                (&json!("False"), &json!("PortConflict"))
            );
            assert_eq!(c["lastTransitionTime"], json!(now));
        }
    }

    struct Case {
        key: &'static str,
        service: Option<Arc<Service>>,
        claim: Option<IPAddressClaim>,
        addresses: Vec<Arc<IPAddress>>,
        rivals: Vec<Arc<Service>>,
        associated_here: Vec<Arc<IPAddress>>,
        marked: Vec<IpAddr>,
        shown: Vec<IpAddr>,
        elsewhere: Vec<(&'static str, IpAddr)>,
        /// Addresses the backend cannot serve.
        unservable: Vec<&'static str>,
        backends: Option<Backends>,
        multiple_for: Option<Duration>,
        pin_shows: bool,
        /// The backend serves the Service (false: another driver's).
        serves: bool,
    }

    impl Case {
        /// Service `t/web`, annotated with claim `c`, Bound to 192.0.2.1.
        fn new() -> Case {
            let s = svc("web", json!({}));
            Case {
                key: "t/web",
                service: Some(s.clone()),
                claim: Some(claim("Bound", &[("x", "192.0.2.1")])),
                addresses: vec![addr("x", "192.0.2.1", json!({}))],
                rivals: vec![s],
                associated_here: vec![],
                marked: vec![],
                shown: vec![],
                elsewhere: vec![],
                unservable: vec![],
                backends: None,
                multiple_for: None,
                pin_shows: true,
                serves: true,
            }
        }
        fn plan(&self) -> ServicePlan {
            let elsewhere = |ip: IpAddr| {
                self.elsewhere
                    .iter()
                    .filter(|(_, y)| *y == ip)
                    .map(|(x, _)| x.to_string())
                    .collect()
            };
            plan_service(&ServiceSnapshot {
                key: self.key,
                service: self.service.as_deref(),
                served: self.serves && self.service.as_ref().is_some_and(|s| is_load_balancer(s)),
                claim: self.claim.as_ref(),
                addresses: &self.addresses,
                foreign: 0,
                rivals: &self.rivals,
                associated_here: &self.associated_here,
                marked: &self.marked,
                shown: &self.shown,
                shown_elsewhere: &elsewhere,
                unservable: &|a: &IPAddress| {
                    self.unservable
                        .contains(&a.spec.address.as_str())
                        .then(|| format!("{} is outside the pool", a.spec.address))
                },
                backends: self.backends.clone(),
                multiple_for: self.multiple_for,
                pin_shows: self.pin_shows,
            })
        }
    }

    fn names(v: &[Arc<IPAddress>]) -> Vec<String> {
        v.iter().map(|a| a.name_any()).collect()
    }

    #[test]
    fn an_address_the_backend_cannot_serve_is_refused_readably_and_never_pinned() {
        let mut c = Case::new();
        c.unservable = vec!["192.0.2.1"];
        let p = c.plan();
        assert!(
            p.associate.is_empty() && p.pin.as_ref().is_none_or(|(_, want)| want.is_empty()),
            "{p:?}"
        );
        let (on, why, message) = p.condition.unwrap();
        assert!(!on);
        assert_eq!(why, sharing::reason::ADDRESS_NOT_SERVED);
        assert!(
            message.contains("192.0.2.1 is outside the pool"),
            "{message}"
        );
        assert_eq!(p.problem.unwrap().reason, reason::ADDRESS_NOT_SERVED);
    }

    #[test]
    fn a_bound_claim_is_associated_ledger_first_then_pinned() {
        let p = Case::new().plan();
        assert_eq!(names(&p.associate), ["x"]);
        assert_eq!(p.marker, Some(vec![ip("192.0.2.1")]));
        assert_eq!(p.pin, Some((vec![ip("192.0.2.1")], vec![ip("192.0.2.1")])));
        assert_eq!(p.events[0].reason, reason::ASSOCIATED);
        assert_eq!(p.ledger_events().count(), 1);
        assert_eq!(p.closing_events().count(), 0);
        assert!(p.problem.is_none() && p.disassociate.is_empty());

        // Steady: the backend is asked (it writes nothing when it already says so); the
        // ledger and the record are left alone; no event.
        let mut c = Case::new();
        c.addresses = vec![addr("x", "192.0.2.1", at("web"))];
        c.associated_here = c.addresses.clone();
        c.marked = vec![ip("192.0.2.1")];
        c.shown = vec![ip("192.0.2.1")];
        let p = c.plan();
        assert!(p.associate.is_empty() && p.marker.is_none() && p.events.is_empty());
        assert!(p.disassociate.is_empty() && p.problem.is_none());
        assert_eq!(p.pin, Some((vec![ip("192.0.2.1")], vec![ip("192.0.2.1")])));
    }

    #[test]
    fn nothing_is_pinned_for_a_missing_or_unbound_claim_or_an_address_not_its_own() {
        let mut c = Case::new();
        c.claim = None;
        c.addresses = vec![];
        let p = c.plan();
        assert_eq!(p.problem.unwrap().reason, reason::CLAIM_NOT_FOUND);
        assert!(p.associate.is_empty());
        assert_eq!(p.pin, Some((vec![], vec![])));

        let mut c = Case::new();
        c.claim = Some(claim("Pending", &[]));
        assert_eq!(c.plan().problem.unwrap().reason, reason::CLAIM_NOT_BOUND);
        let mut c = Case::new();
        c.claim = Some(claim("Lost", &[("x", "192.0.2.1")]));
        assert_eq!(c.plan().problem.unwrap().reason, reason::CLAIM_NOT_BOUND);

        // The address names another uid, or is not Bound (Lost): not put on the Service.
        for extra in [
            json!({"spec": {"claimRef": {"uid": "older"}}}),
            json!({"spec": {"claimRef": {"uid": null}}}),
            json!({"status": {"phase": "Lost"}}),
            json!({"status": {"phase": "Released"}}),
        ] {
            let mut c = Case::new();
            c.addresses = vec![addr("x", "192.0.2.1", extra.clone())];
            let p = c.plan();
            assert!(p.associate.is_empty(), "{extra}");
            assert_eq!(p.pin, Some((vec![], vec![])), "{extra}");
        }
        // A Conflict address stays with its rightful Service.
        let mut c = Case::new();
        c.addresses = vec![addr(
            "x",
            "192.0.2.1",
            json!({"status": {"phase": "Conflict"}}),
        )];
        assert_eq!(names(&c.plan().associate), ["x"]);
    }

    fn vm(name: &str, whole: &str) -> Arc<Service> {
        svc(
            name,
            json!({"metadata": {"labels": {"service.kubernetes.io/service-proxy-name": "cozy-proxy"},
                "annotations": {"networking.cozystack.io/wholeIP": whole}},
                "spec": {"externalTrafficPolicy": "Local", "selector": {"vm": "v"},
                    "ports": [{"port": 65535, "protocol": "TCP"}]}}),
        )
    }

    #[test]
    fn a_service_cozy_proxy_serves_is_attached_whole_with_one_pod_ipv4_only() {
        // The claim is Dual (x v4, y v6): the VM Service gets the IPv4 address only, and
        // says so; its ledger record has no port and the method.
        let mut c = Case::new();
        let s = vm("web", "true");
        c.service = Some(s.clone());
        c.rivals = vec![s];
        c.claim = Some(claim("Bound", &[("x", "192.0.2.1"), ("y", "2001:db8::1")]));
        c.addresses = vec![
            addr("x", "192.0.2.1", json!({})),
            addr("y", "2001:db8::1", json!({})),
        ];
        c.backends = Some(Backends::One { node: None });
        let p = c.plan();
        assert_eq!(names(&p.associate), ["x"]);
        let record = p.attachment.clone().unwrap();
        assert!(record.ports.is_empty(), "the placeholder is no port");
        assert_eq!(record.method, Some(AttachmentMethod::WholeIP));
        let (on, why, message) = p.condition.unwrap();
        assert!(on, "{message}");
        assert_eq!(why, sharing::reason::ATTACHED);
        assert!(message.contains("whole, by cozy-proxy"), "{message}");
        assert!(message.contains("cozy-proxy serves IPv4 only"), "{message}");
        // Two ready pods: nothing is put on it; one again: attached.
        c.backends = Some(Backends::Many(2));
        let p = c.plan();
        assert!(p.associate.is_empty());
        assert_eq!(p.pin, Some((vec![], vec![])));
        let (on, why, _) = p.condition.unwrap();
        assert_eq!((on, why), (false, sharing::reason::MULTIPLE_ENDPOINTS));
        // Its slices not known yet: nothing is put on it, and no event — it waits.
        c.backends = None;
        let p = c.plan();
        assert!(p.associate.is_empty() && p.problem.is_none(), "{p:?}");
        assert_eq!(p.pin, Some((vec![], vec![])));
        let (on, why, _) = p.condition.unwrap();
        assert_eq!((on, why), (false, sharing::reason::WAITING_FOR_ENDPOINTS));
        // An IPv6 claim: refused readably.
        c.backends = Some(Backends::One { node: None });
        c.claim = Some(claim("Bound", &[("y", "2001:db8::1")]));
        c.addresses = vec![addr("y", "2001:db8::1", json!({}))];
        let (on, why, message) = c.plan().condition.unwrap();
        assert_eq!((on, why), (false, sharing::reason::FAMILY_MISMATCH));
        assert!(message.contains("IPv4 only"), "{message}");
    }

    /// The VM Service `t/web` holding 192.0.2.1 whole (the ledger and the pin say so).
    fn vm_holding() -> Case {
        let mut c = Case::new();
        let s = vm("web", "true");
        c.service = Some(s.clone());
        c.rivals = vec![s];
        let held = addr(
            "x",
            "192.0.2.1",
            json!({"status": {"associatedTo": {"kind": "Service", "namespace": "t", "name": "web"},
                "attachments": [{"kind": "Service", "namespace": "t", "name": "web", "method": "WholeIP"}]}}),
        );
        c.addresses = vec![held.clone()];
        c.associated_here = vec![held];
        c.marked = vec!["192.0.2.1".parse().unwrap()];
        c.shown = c.marked.clone();
        c
    }

    fn kept(p: &ServicePlan) -> bool {
        p.disassociate.is_empty()
            && p.pin.as_ref().is_some_and(|(_, want)| want.len() == 1)
            && p.condition.as_ref().is_some_and(|(on, ..)| *on)
    }

    #[test]
    fn a_vm_moving_keeps_its_address_and_says_so_once() {
        let mut c = vm_holding();
        c.backends = Some(Backends::Migrating {
            vmi: "t/vm".into(),
            nodes: vec!["n1".into(), "n2".into()],
            node: Some("n1".into()),
        });
        let p = c.plan();
        assert!(kept(&p), "{p:?}");
        let (_, why, message) = p.condition.clone().unwrap();
        assert_eq!(why, sharing::reason::MIGRATING);
        assert!(message.contains("t/vm is moving"), "{message}");
        assert_eq!(
            p.events.iter().map(|e| e.reason).collect::<Vec<_>>(),
            [reason::MIGRATING]
        );
        // The Service says Migrating already: no second event.
        let mut said = (*vm("web", "true")).clone();
        said.status = Some(serde_json::from_value(json!({"conditions": [{"type": sharing::CONDITION,
            "status": "True", "reason": "Migrating", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]})).unwrap());
        c.service = Some(Arc::new(said));
        assert!(c.plan().events.is_empty());
        // Positive control: the same two pods read as two workloads are refused at once
        // past the hold-down.
        c.backends = Some(Backends::Many(2));
        c.multiple_for = Some(MULTIPLE_WORKLOADS_HOLD_DOWN);
        assert!(!kept(&c.plan()));
    }

    #[test]
    fn a_service_holding_its_address_keeps_it_for_the_hold_down_only() {
        let mut c = vm_holding();
        c.backends = Some(Backends::Many(2));
        c.multiple_for = Some(Duration::from_secs(10));
        let p = c.plan();
        assert!(kept(&p), "{p:?}");
        assert_eq!(p.condition.as_ref().unwrap().1, sharing::reason::HELD_DOWN);
        assert_eq!(
            p.recheck,
            Some(MULTIPLE_WORKLOADS_HOLD_DOWN - Duration::from_secs(10))
        );
        // The hold-down over: refused, the pin withdrawn.
        c.multiple_for = Some(MULTIPLE_WORKLOADS_HOLD_DOWN);
        let p = c.plan();
        assert_eq!(p.pin, Some((vec!["192.0.2.1".parse().unwrap()], vec![])));
        let (on, why, _) = p.condition.unwrap();
        assert_eq!((on, why), (false, sharing::reason::MULTIPLE_ENDPOINTS));
        // Not known, or nobody ready, for a moment: kept.
        for b in [None, Some(Backends::None)] {
            c.backends = b;
            c.multiple_for = None;
            assert!(kept(&c.plan()));
        }
        // A Service that does not hold it yet gets no hold-down.
        let mut fresh = vm_holding();
        fresh.associated_here = vec![];
        fresh.marked = vec![];
        fresh.shown = vec![];
        fresh.addresses = vec![addr("x", "192.0.2.1", json!({}))];
        fresh.backends = Some(Backends::Many(2));
        fresh.multiple_for = Some(Duration::ZERO);
        let (on, why, _) = fresh.plan().condition.unwrap();
        assert_eq!((on, why), (false, sharing::reason::MULTIPLE_ENDPOINTS));
    }

    #[test]
    fn another_drivers_service_keeps_its_condition() {
        // Served by another driver (say the range driver's class): this driver plans no
        // pin, no ledger change, and leaves the condition alone.
        let mut c = Case::new();
        let mut s = (*svc("web", json!({}))).clone();
        s.status = serde_json::from_value(json!({"conditions": [{"type": sharing::CONDITION,
            "status": "True", "reason": "Attached", "message": "theirs",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}))
        .unwrap();
        c.service = Some(Arc::new(s));
        c.serves = false;
        let p = c.plan();
        assert!(
            p.not_ours && p.associate.is_empty() && p.pin.is_none(),
            "{p:?}"
        );
        // Once this driver pinned it (its marker), or the ledger records it here, it is
        // this driver's to clean up — and its condition with it.
        c.marked = vec![ip("192.0.2.1")];
        assert!(!c.plan().not_ours);
        c.marked = vec![];
        c.associated_here = c.addresses.clone();
        assert!(!c.plan().not_ours);
        // Served here: ours.
        c.associated_here = vec![];
        c.serves = true;
        assert!(!c.plan().not_ours);
    }

    #[test]
    fn attached_is_true_only_once_the_load_balancer_shows_it() {
        let mut c = Case::new();
        c.pin_shows = false;
        let p = c.plan();
        assert_eq!(p.pin, Some((vec![ip("192.0.2.1")], vec![ip("192.0.2.1")])));
        let (on, why, _) = p.condition.unwrap();
        assert_eq!(
            (on, why),
            (false, sharing::reason::WAITING_FOR_LOAD_BALANCER)
        );
        // Shown: True.
        c.addresses = vec![addr("x", "192.0.2.1", at("web"))];
        c.associated_here = c.addresses.clone();
        c.marked = vec![ip("192.0.2.1")];
        c.shown = vec![ip("192.0.2.1")];
        let (on, why, _) = c.plan().condition.unwrap();
        assert_eq!((on, why), (true, sharing::reason::ATTACHED));
    }

    #[test]
    fn another_namespaces_claim_missing_or_not_shared_reads_alike() {
        // A Service of namespace `o` naming `t/c`: the claim missing, or there and not
        // sharing, Pending or Bound — one reason, one message, one event; nothing pinned.
        let mut theirs = Vec::new();
        let mut notices = Vec::new();
        for claim in [
            None,
            Some(claim("Bound", &[("x", "192.0.2.1")])),
            Some(claim("Pending", &[])),
        ] {
            let mut c = Case::new();
            c.key = "o/web";
            c.service = Some(svc(
                "web",
                json!({"metadata": {"namespace": "o",
                    "annotations": {SERVICE_CLAIM_ANNOTATION: "t/c"}}}),
            ));
            c.rivals = c.service.iter().cloned().collect();
            c.claim = claim;
            let p = c.plan();
            assert!(p.associate.is_empty());
            assert_eq!(p.pin, Some((vec![], vec![])));
            let problem = p.problem.unwrap();
            theirs.push((p.condition, problem.reason, problem.note));
            notices.push(p.owner_notice.map(|n| n.reason));
        }
        assert_eq!(theirs[0], theirs[1]);
        assert_eq!(theirs[0], theirs[2]);
        let (condition, event, _) = &theirs[0];
        assert_eq!(
            condition
                .as_ref()
                .map(|(on, why, m)| (*on, *why, m.as_str())),
            Some((
                false,
                sharing::reason::NOT_SHARED,
                "IPAddressClaim t/c does not exist or does not share its address with this namespace (its owner's spec.sharing must list it)"
            ))
        );
        assert_eq!(*event, reason::ASSOCIATION_REJECTED);
        // The owner hears of it on its claim when there is one.
        assert_eq!(
            notices,
            [
                None,
                Some(reason::SERVICE_REFUSED),
                Some(reason::SERVICE_REFUSED)
            ]
        );
    }

    #[test]
    fn one_claim_serves_one_service_and_a_gone_holder_is_taken_over() {
        let older = svc("web", json!({}));
        let newer = svc(
            "web2",
            json!({"metadata": {"creationTimestamp": "2026-01-02T00:00:00Z"}}),
        );
        // The holder keeps it; the second is rejected.
        let mut c = Case::new();
        c.key = "t/web2";
        c.service = Some(newer.clone());
        c.rivals = vec![older.clone(), newer.clone()];
        c.addresses = vec![addr("x", "192.0.2.1", at("web"))];
        c.elsewhere = vec![("t/web", ip("192.0.2.1"))];
        let p = c.plan();
        assert_eq!(p.problem.unwrap().reason, reason::ASSOCIATION_REJECTED);
        assert!(p.associate.is_empty());
        assert_eq!(p.pin, Some((vec![], vec![])));
        // Before anyone holds it, the oldest wins.
        let mut c = Case::new();
        c.key = "t/web2";
        c.service = Some(newer.clone());
        c.rivals = vec![newer.clone(), older.clone()];
        assert_eq!(
            c.plan().problem.unwrap().reason,
            reason::ASSOCIATION_REJECTED
        );
        // The holder is gone, still in the ledger: its own pass lets go first (a takeover
        // never writes the ledger with the old holder first in it).
        let mut c = Case::new();
        c.key = "t/web2";
        c.service = Some(newer.clone());
        c.rivals = vec![newer.clone()];
        c.addresses = vec![addr("x", "192.0.2.1", at("web"))];
        let p = c.plan();
        assert!(p.problem.is_none());
        assert!(p.associate.is_empty(), "waits for the ledger to let go");
        // The ledger let go: taken over.
        c.addresses = vec![addr("x", "192.0.2.1", json!({}))];
        let p = c.plan();
        assert_eq!(names(&p.associate), ["x"]);

        // The holder let go of the claim but still shows the address: the handoff waits.
        c.elsewhere = vec![("t/web", ip("192.0.2.1"))];
        let p = c.plan();
        assert!(p.associate.is_empty());
        assert_eq!(
            p.pin,
            Some((vec![], vec![])),
            "not pinned while the old holder shows it"
        );
    }

    #[test]
    fn a_shared_claim_gives_its_address_to_every_compatible_service() {
        let shared = || {
            let mut c = claim("Bound", &[("x", "192.0.2.1")]);
            c.spec.sharing = Some(address_controller_api::Sharing {
                policy: address_controller_api::SharingPolicy::SameNamespace,
                namespaces: vec![],
            });
            c
        };
        let port = |n: i32| json!({"spec": {"ports": [{"port": n, "protocol": "TCP"}]}});
        let web = svc("web", port(80));
        let tls = svc(
            "tls",
            json!({"metadata": {"creationTimestamp": "2026-01-02T00:00:00Z"},
                "spec": {"ports": [{"port": 443, "protocol": "TCP"}]}}),
        );
        let clash = svc(
            "clash",
            json!({"metadata": {"creationTimestamp": "2026-01-03T00:00:00Z"},
                "spec": {"ports": [{"port": 443, "protocol": "TCP"}]}}),
        );
        // web holds and shows the address; tls joins it without waiting for web to let go.
        let mut c = Case::new();
        c.key = "t/tls";
        c.service = Some(tls.clone());
        c.claim = Some(shared());
        c.rivals = vec![web.clone(), tls.clone(), clash.clone()];
        c.addresses = vec![addr("x", "192.0.2.1", at("web"))];
        c.elsewhere = vec![("t/web", ip("192.0.2.1"))];
        let p = c.plan();
        assert_eq!(names(&p.associate), ["x"]);
        assert_eq!(p.attachment.unwrap().ports, ["TCP/443"]);
        assert_eq!(p.pin.unwrap().1, [ip("192.0.2.1")]);
        assert_eq!(p.condition.unwrap().1, sharing::reason::ATTACHED);
        // clash collides with tls on TCP/443: refused, with the reason a controller reads.
        c.key = "t/clash";
        c.service = Some(clash.clone());
        let p = c.plan();
        assert!(p.associate.is_empty());
        let (on, why, message) = p.condition.unwrap();
        assert!(!on && why == sharing::reason::PORT_CONFLICT, "{why}");
        assert!(
            message.contains("TCP/443") && message.contains("t/tls"),
            "{message}"
        );
        assert_eq!(p.problem.unwrap().reason, reason::ASSOCIATION_REJECTED);
        // Without sharing, the same Service is refused as attached elsewhere, and a Service
        // that is not a co-holder blocks a handoff while it shows the address.
        c.claim = Some(claim("Bound", &[("x", "192.0.2.1")]));
        c.key = "t/tls";
        c.service = Some(tls.clone());
        assert_eq!(
            c.plan().condition.unwrap().1,
            sharing::reason::ATTACHED_ELSEWHERE
        );
    }

    #[test]
    fn an_address_recorded_by_associated_to_alone_gains_its_attachment() {
        let mut c = Case::new();
        c.addresses = vec![addr(
            "x",
            "192.0.2.1",
            json!({"status": {"associatedTo": {"kind": "Service", "namespace": "t", "name": "web"}}}),
        )];
        c.associated_here = c.addresses.clone();
        c.marked = vec![ip("192.0.2.1")];
        c.shown = vec![ip("192.0.2.1")];
        let p = c.plan();
        assert_eq!(names(&p.associate), ["x"]);
        assert!(p.events.is_empty(), "not a new association: {:?}", p.events);
    }

    #[test]
    fn withdrawing_unpins_first_and_lets_the_ledger_go_once_the_backend_shows_it_gone() {
        let x = addr("x", "192.0.2.1", at("web"));
        let mut c = Case::new();
        c.service = Some(svc(
            "web",
            json!({"metadata": {"annotations": {SERVICE_CLAIM_ANNOTATION: null}}}),
        ));
        c.claim = None;
        c.addresses = vec![];
        c.associated_here = vec![x.clone()];
        c.marked = vec![ip("192.0.2.1")];
        c.shown = vec![ip("192.0.2.1")];
        let p = c.plan();
        assert_eq!(p.pin, Some((vec![ip("192.0.2.1")], vec![])), "unpin");
        assert!(p.disassociate.is_empty(), "the backend still shows it");
        assert!(p.marker.is_none(), "the record stays while it is shown");
        // The backend shows it gone: the record and the ledger let go.
        c.shown = vec![];
        let p = c.plan();
        assert_eq!(names(&p.disassociate), ["x"]);
        assert_eq!(p.marker, Some(vec![]));
        assert_eq!(p.events[0].reason, reason::DISASSOCIATED);
        // The Service is gone: the ledger lets go; nothing to pin.
        let mut c = Case::new();
        c.service = None;
        c.associated_here = vec![x];
        let p = c.plan();
        assert_eq!(names(&p.disassociate), ["x"]);
        assert!(p.pin.is_none() && p.marker.is_none());
    }

    #[test]
    fn only_the_services_families_are_pinned_ipv4_first() {
        let dual = || claim("Bound", &[("x", "192.0.2.1"), ("y", "2001:db8::1")]);
        let both = || {
            vec![
                addr("y", "2001:db8::1", json!({})),
                addr("x", "192.0.2.1", json!({})),
            ]
        };
        let mut c = Case::new();
        c.claim = Some(dual());
        c.addresses = both();
        let p = c.plan();
        assert_eq!(names(&p.associate), ["x"]);
        assert_eq!(p.problem.unwrap().reason, reason::FAMILY_MISMATCH);
        let s = svc("web", json!({"spec": {"ipFamilies": ["IPv6", "IPv4"]}}));
        let mut c = Case::new();
        c.service = Some(s.clone());
        c.rivals = vec![s];
        c.claim = Some(dual());
        c.addresses = both();
        let p = c.plan();
        assert!(p.problem.is_none());
        assert_eq!(p.pin.unwrap().1, [ip("192.0.2.1"), ip("2001:db8::1")]);
    }
}
