//! What a driver implements. Everything else — which claims to serve, creating pre-bound
//! addresses with the right name, policy and source, idempotency across restarts, class
//! capacity and conditions, events, teardown behind a finalizer, leader election — is the
//! runner's job ([`crate::run`]).

use std::collections::BTreeSet;
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;

use address_controller_api::{AddressSource, Family, IPAddress, IPAddressClaim, IPAddressClass};
use k8s_openapi::api::core::v1::Service;
use kube::Client;

/// How many addresses of each family a class's backend can hold (`status.capacity`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capacity {
    pub ipv4: i64,
    pub ipv6: i64,
}

impl Capacity {
    pub fn of(&self, f: Family) -> i64 {
        match f {
            Family::IPv4 => self.ipv4,
            Family::IPv6 => self.ipv6,
        }
    }
}

/// The classes whose backend configuration must stay, for [`Driver::release_classes`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClassesInUse {
    /// The uids of the classes that exist.
    pub uids: BTreeSet<String>,
    /// The names of the classes that addresses name (a deleted class's retained addresses).
    pub named: BTreeSet<String>,
}

impl ClassesInUse {
    /// Whether what was made for class `name` (uid `uid`, as its owner reference says) must
    /// stay: that class exists, or an address names a class of that name.
    pub fn keeps(&self, name: &str, uid: Option<&str>) -> bool {
        uid.is_some_and(|u| self.uids.contains(u)) || self.named.contains(name)
    }
}

/// What the runner asks a driver to allocate.
pub struct Request<'a, P> {
    pub class: &'a IPAddressClass,
    /// The class's parameters, as [`Driver::parameters`] parsed them.
    pub params: &'a P,
    pub claim: &'a IPAddressClaim,
    pub family: Family,
    /// Whether an address is taken: an IPAddress object of any class carries it, or this
    /// process is creating one for it right now.
    pub in_use: &'a (dyn Fn(IpAddr) -> bool + Send + Sync),
}

/// An allocated address.
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    pub address: IpAddr,
    /// `fromClass` for an address of the class's own range, `providerRef` for one the
    /// provider holds under an id.
    pub source: AddressSource,
    /// The object name; by default derived from the address ([`object_name`]), which
    /// makes creating the object the lock on the address.
    pub name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AllocateError {
    /// No free address of the family: reported on the claim and the class, retried when
    /// an address of the class goes away.
    #[error("no free address left")]
    Exhausted,
    /// Anything else: reported on the claim, retried with backoff.
    #[error("{0}")]
    Failed(String),
}

/// Whether `service` asks for the load balancer of `class` by its `spec.loadBalancerClass`
/// (`None`: a Service without one, the default load balancer's).
pub fn of_load_balancer_class(service: &Service, class: Option<&String>) -> bool {
    service
        .spec
        .as_ref()
        .and_then(|s| s.load_balancer_class.as_ref())
        == class
}

/// Each class's parsed parameters (`parsed`, in the order of `classes`), with an error on
/// each of two classes whose `blocks` overlap: one address in two classes would be handed
/// out twice, and a backend (MetalLB, LB-IPAM) refuses overlapping pools. The one rule of
/// the drivers this project ships.
pub fn without_overlaps<P: Clone>(
    classes: &[Arc<IPAddressClass>],
    parsed: &[Result<P, String>],
    blocks: impl Fn(&P) -> &[address_controller_api::ranges::Cidr],
) -> Vec<Result<P, String>> {
    use kube::ResourceExt;
    classes
        .iter()
        .zip(parsed)
        .map(|(class, mine)| {
            let mine = mine.clone()?;
            for (other, theirs) in classes.iter().zip(parsed) {
                if other.name_any() == class.name_any() {
                    continue;
                }
                if let Ok(theirs) = theirs
                    && let Some((a, b)) = address_controller_api::ranges::overlap_between(
                        blocks(&mine),
                        blocks(theirs),
                    )
                {
                    return Err(address_controller_api::ranges::ParamError::Overlap(
                        a.to_string(),
                        format!("{b} of class {}", other.name_any()),
                    )
                    .to_string());
                }
            }
            Ok(mine)
        })
        .collect()
}

/// A driver. `Params` is what the class's `spec.parameters` parse into.
pub trait Driver: Send + Sync + 'static {
    type Params: Send + Sync + 'static;

    /// The provisioner name classes select this driver by (`spec.provisioner`).
    fn provisioner(&self) -> &str;

    /// Parses the parameters of every class of this driver, in order; an error (say, a
    /// range overlapping another class's) is published on that class and nothing is
    /// allocated from it.
    fn parameters(&self, classes: &[Arc<IPAddressClass>]) -> Vec<Result<Self::Params, String>>;

    /// The capacity of a class, published in its status.
    fn capacity(&self, params: &Self::Params) -> Capacity;

    /// One line about valid parameters, for the class's `ParametersValid` condition.
    fn describe(&self, _params: &Self::Params) -> String {
        "parameters are valid".into()
    }

    /// Allocates one address.
    fn allocate(
        &self,
        req: Request<'_, Self::Params>,
    ) -> impl Future<Output = Result<Allocation, AllocateError>> + Send;

    /// A finalizer the runner puts on every address it creates, for backend teardown in
    /// [`Driver::release`]. `None` (the default): no teardown.
    fn finalizer(&self) -> Option<&'static str> {
        None
    }

    /// Makes the backend's configuration of a class of this driver what its parameters say
    /// (a pool, an advertisement), on every pass over the class; idempotent, writing nothing
    /// when it already is. Objects it makes should be owned by the class, so that they go
    /// with it.
    fn sync_class(
        &self,
        _client: &Client,
        _class: &IPAddressClass,
        _params: &Self::Params,
    ) -> impl Future<Output = Result<(), String>> + Send {
        async { Ok(()) }
    }

    /// Lets go of what the backend keeps for classes that are gone and that no address
    /// names any more. What [`Driver::sync_class`] makes is owned by its class and deleted
    /// with it by the garbage collector; a backend whose configuration must outlive the class
    /// while addresses of it are left (MetalLB refuses every new configuration while a
    /// Service shows an address of a pool that is gone) holds it with a finalizer, and
    /// removes it here from whatever [`ClassesInUse::keeps`] does not keep. Returns the
    /// classes it let go of (one that exists again, by another uid, is synced anew). Called
    /// when a class goes, when the last address of a gone class goes, and by a new leader;
    /// idempotent.
    fn release_classes(
        &self,
        _client: &Client,
        _in_use: &ClassesInUse,
    ) -> impl Future<Output = Result<Vec<String>, String>> + Send {
        async { Ok(Vec::new()) }
    }

    /// Makes the backend's state of an address of this driver's classes what the address
    /// says (e.g. hold it in the backend's books), on every pass over it; idempotent.
    fn sync_address(
        &self,
        _client: &Client,
        _address: &IPAddress,
        _params: &Self::Params,
    ) -> impl Future<Output = Result<(), String>> + Send {
        async { Ok(()) }
    }

    /// Tears down the backend of an address being deleted (only with a [`Driver::finalizer`]);
    /// the kit calls it once no Service shows the address any more.
    fn release(
        &self,
        _client: &Client,
        _address: &IPAddress,
    ) -> impl Future<Output = Result<(), String>> + Send {
        async { Ok(()) }
    }

    // ---- Association (SPEC §8): the kit decides, the backend pins. -----------------------

    /// Whether the backend puts addresses on this Service (the kit has checked that it is
    /// `type: LoadBalancer` and not being deleted) — e.g. by `spec.loadBalancerClass`.
    /// The default, `false`, is a driver without association.
    fn serves(&self, _service: &Service) -> bool {
        false
    }

    /// Makes the backend's pins on `service` exactly `want` (addresses of this driver's
    /// classes, IPv4 first). `ours` is every address the kit pinned there before or wants
    /// now: remove those not in `want`, and leave everything else on the Service alone.
    /// Called on every pass over an associated Service, so it must be idempotent and write
    /// nothing when the backend already says so.
    fn pin(
        &self,
        _client: &Client,
        _service: &Service,
        _ours: &[IpAddr],
        _want: &[Arc<IPAddress>],
    ) -> impl Future<Output = Result<(), String>> + Send {
        async { Ok(()) }
    }

    /// Whether a Service is the backend's own (e.g. a placeholder that holds an address in
    /// the backend's books): the kit never associates it, nor counts it as using an
    /// address it was not given.
    fn internal(&self, _service: &Service) -> bool {
        false
    }

    /// The addresses the backend shows on the Service: until an unpinned address is gone
    /// from here, the kit keeps its ledger entry (`associatedTo`), and until a pinned one is
    /// here, the Service's `AddressAttached` condition is not `True`. The default reads
    /// `status.loadBalancer.ingress`, where a load balancer reports what it serves.
    fn shown(&self, service: &Service) -> Vec<IpAddr> {
        ingress(service)
    }

    /// Whether what [`Driver::pin`] pins is shown once it returns (the backend is the load
    /// balancer and writes the ingress itself): the condition is `True` in the same pass.
    /// The default, `false`: another load balancer shows it, and the condition waits for it.
    fn pin_shows(&self) -> bool {
        false
    }

    /// Why the load balancer does not show what was pinned on `service`, in its own words,
    /// when it said so (e.g. MetalLB's `AllocationFailed` event); asked only while the
    /// Service waits. The default: nothing said.
    fn refusal(
        &self,
        _client: &Client,
        _service: &Service,
    ) -> impl Future<Output = Option<String>> + Send {
        async { None }
    }

    /// Whether the backend can put an address of a class of this driver on a Service
    /// (`Err`: why not, said on the Service as `AddressNotServed`). Asked of every address
    /// the kit would pin, an admin's static ones included. The default: always.
    fn servable(&self, _params: &Self::Params, _address: &IPAddress) -> Result<(), String> {
        Ok(())
    }

    /// Whether the backend still has an address this driver provisioned (the kit asks only
    /// for those: annotated `provisioned-by` at creation): `Missing` turns it `Lost` (its
    /// claim turns `Lost`, and is never silently given another); `Present` again ends that.
    fn presence(&self, _params: &Self::Params, _address: &IPAddress) -> Presence {
        Presence::Unknown
    }
}

/// What the backend says of an address ([`Driver::presence`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Presence {
    Present,
    /// Gone from the backend, and why (said on the address).
    Missing(String),
    /// The backend cannot tell: nothing changes.
    Unknown,
}

impl Presence {
    /// The rule of a driver whose backend is the class's own blocks: an address in one of
    /// BLOCKS is present; one outside them (an admin shrank the class) is missing, said with
    /// what the blocks are (`pool`: "the class's ranges", "the class's MetalLB pool"); an
    /// invalid address (never trusted) is unknown.
    pub fn within_blocks(
        blocks: &[address_controller_api::ranges::Cidr],
        pool: &str,
        address: &IPAddress,
    ) -> Self {
        let Some(ip) = address.ip() else {
            return Presence::Unknown;
        };
        if blocks.iter().any(|b| b.contains(ip)) {
            return Presence::Present;
        }
        let list: Vec<String> = blocks.iter().map(ToString::to_string).collect();
        Presence::Missing(format!("{ip} is outside {pool} ({})", list.join(", ")))
    }
}

/// The addresses in a Service's `status.loadBalancer.ingress`.
pub use address_controller_api::service::ingress_addresses as ingress;

pub use address_controller_api::family::object_name;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn names_are_dns_valid_and_unique_per_address() {
        let cases = [
            ("192.0.2.1", "ipv4-192-0-2-1"),
            ("2001:db8::", "ipv6-2001-0db8-0000-0000-0000-0000-0000-0000"),
            (
                "2001:db8::1",
                "ipv6-2001-0db8-0000-0000-0000-0000-0000-0001",
            ),
            ("::", "ipv6-0000-0000-0000-0000-0000-0000-0000-0000"),
            ("fe80::", "ipv6-fe80-0000-0000-0000-0000-0000-0000-0000"),
        ];
        for (ip, want) in cases {
            let name = object_name(ip.parse().unwrap());
            assert_eq!(name, want);
            assert!(
                name.len() <= 63
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            );
        }
        // Every spelling of one address gives one name.
        let a: IpAddr = "2001:DB8:0:0::1".parse().unwrap();
        let b: IpAddr = "2001:db8::0:1".parse().unwrap();
        assert_eq!(object_name(a), object_name(b));
    }

    #[test]
    fn a_gone_class_is_kept_while_an_address_names_it_and_a_recreated_one_is_not_the_old() {
        let in_use = ClassesInUse {
            uids: BTreeSet::from(["u2".to_string()]),
            named: BTreeSet::from(["retained".to_string()]),
        };
        assert!(in_use.keeps("public", Some("u2")), "the class exists");
        assert!(
            in_use.keeps("retained", Some("u0")),
            "gone, an address left"
        );
        assert!(in_use.keeps("retained", None));
        assert!(
            !in_use.keeps("public", Some("u1")),
            "gone: recreated by uid u2"
        );
        assert!(!in_use.keeps("gone", None));
    }

    #[test]
    fn a_service_asks_for_the_load_balancer_of_its_class() {
        let svc = |class: Option<&str>| -> Service {
            serde_json::from_value(serde_json::json!({"metadata": {"name": "s"},
                "spec": {"type": "LoadBalancer", "loadBalancerClass": class}}))
            .unwrap()
        };
        let lb = Some("example.com/lb".to_string());
        assert!(of_load_balancer_class(&svc(None), None));
        assert!(!of_load_balancer_class(&svc(None), lb.as_ref()));
        assert!(of_load_balancer_class(
            &svc(Some("example.com/lb")),
            lb.as_ref()
        ));
        assert!(!of_load_balancer_class(&svc(Some("example.com/lb")), None));
    }
}
