//! The metrics of every driver built on the kit, served over HTTPS with delegated
//! authentication and authorization as the core's (`--metrics-address`): the process, the
//! build, the lease and the caches (`runtime::metrics`), the work queues, the passes, and
//! the driver's addresses by class and state — associated, Conflict, Lost. Every series
//! carries the label `driver` (the binary's name); labels are bounded (classes, passes,
//! results, queues).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use address_controller_api::{AddressPhase, IPAddress};
use address_controller_runtime::health::Health;
use address_controller_runtime::leader::Leadership;
use address_controller_runtime::metrics::QueueReader;
use address_controller_runtime::workers::Observe;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
};

/// The states an address of the driver is counted in.
pub const STATES: [&str; 4] = ["associated", "shared", "conflict", "lost"];

fn states(a: &IPAddress) -> Vec<&'static str> {
    let mut out = Vec::new();
    let holders = a.holders().len();
    if holders > 0 {
        out.push("associated");
    }
    if holders > 1 {
        out.push("shared");
    }
    match a.phase() {
        Some(AddressPhase::Conflict) => out.push("conflict"),
        Some(AddressPhase::Lost) => out.push("lost"),
        _ => {}
    }
    out
}

pub struct KitMetrics {
    pub registry: Registry,
    reconcile: IntCounterVec,
    duration: HistogramVec,
    addresses: IntGaugeVec,
    counts: Mutex<HashMap<(String, &'static str), i64>>,
}

impl KitMetrics {
    pub fn new(
        driver: &str,
        health: Arc<Health>,
        leadership: Arc<Leadership>,
        queues: Vec<(&'static str, QueueReader)>,
    ) -> Result<Arc<KitMetrics>, prometheus::Error> {
        let registry = Registry::new_custom(
            None,
            Some(HashMap::from([("driver".to_string(), driver.to_string())])),
        )?;
        address_controller_runtime::metrics::register(
            &registry,
            env!("CARGO_PKG_VERSION"),
            health,
            Some(leadership),
        )?;
        address_controller_runtime::metrics::register_queues(&registry, queues)?;
        let reconcile = IntCounterVec::new(
            Opts::new(
                "address_controller_reconcile_total",
                "Passes by controller (claim, address, service, class) and result (success or an error category)",
            ),
            &["controller", "result"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "address_controller_reconcile_duration_seconds",
                "How long a pass took",
            )
            .buckets(vec![0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0]),
            &["controller"],
        )?;
        let addresses = IntGaugeVec::new(
            Opts::new(
                "address_controller_driver_addresses",
                "Addresses of the driver's classes by state: associated (on a Service), shared (on more than one), conflict, lost",
            ),
            &["class", "state"],
        )?;
        registry.register(Box::new(reconcile.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        registry.register(Box::new(addresses.clone()))?;
        Ok(Arc::new(KitMetrics {
            registry,
            reconcile,
            duration,
            addresses,
            counts: Mutex::new(HashMap::new()),
        }))
    }

    /// What the workers call after each pass.
    pub fn observe(self: &Arc<Self>) -> Observe {
        let m = self.clone();
        Arc::new(move |controller, result, took: Duration| {
            m.reconcile.with_label_values(&[controller, result]).inc();
            m.duration
                .with_label_values(&[controller])
                .observe(took.as_secs_f64());
        })
    }

    /// An address of the driver's classes changed (`None`: not there, or not the
    /// driver's): the per-state counts follow. Every state of a known class is exported,
    /// zeros included, so an alert on `conflict > 0` sees it return to 0.
    pub fn address_changed(&self, old: Option<&IPAddress>, new: Option<&IPAddress>) {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        for (a, sign) in [(old, -1), (new, 1)] {
            let Some(a) = a else { continue };
            for st in STATES {
                counts.entry((a.spec.class_name.clone(), st)).or_default();
            }
            for st in states(a) {
                *counts.entry((a.spec.class_name.clone(), st)).or_default() += sign;
            }
        }
        for ((class, st), n) in counts.iter() {
            self.addresses
                .with_label_values(&[class.as_str(), st])
                .set(*n);
        }
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        let _ = prometheus::TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use address_controller_runtime::health::Bounds;
    use serde_json::json;

    fn addr(extra: serde_json::Value) -> IPAddress {
        let mut v = json!({"metadata": {"name": "a"},
            "spec": {"address": "192.0.2.1", "className": "k", "source": {"fromClass": {}}},
            "status": {"phase": "Bound"}});
        if let (Some(b), Some(p)) = (v.as_object_mut(), extra.as_object()) {
            for (k, x) in p {
                b.insert(k.clone(), x.clone());
            }
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn addresses_are_counted_by_state_and_return_to_zero() {
        let m = KitMetrics::new(
            "d",
            Health::new(Bounds::default()),
            Leadership::always(),
            vec![],
        )
        .unwrap();
        let assoc = addr(json!({"status": {"phase": "Bound",
            "associatedTo": {"kind": "Service", "namespace": "t", "name": "s"}}}));
        let conflict = addr(json!({"status": {"phase": "Conflict",
            "associatedTo": {"kind": "Service", "namespace": "t", "name": "s"}}}));
        let value = |text: &str, state: &str| -> Option<String> {
            text.lines()
                .find(|l| {
                    l.starts_with("address_controller_driver_addresses{")
                        && l.contains(r#"class="k""#)
                        && l.contains(r#"driver="d""#)
                        && l.contains(&format!(r#"state="{state}""#))
                })
                .and_then(|l| l.rsplit(' ').next())
                .map(str::to_string)
        };
        m.address_changed(None, Some(&assoc));
        m.address_changed(Some(&assoc), Some(&conflict));
        let text = m.render();
        assert_eq!(value(&text, "associated").as_deref(), Some("1"), "{text}");
        assert_eq!(value(&text, "conflict").as_deref(), Some("1"), "{text}");
        assert_eq!(value(&text, "lost").as_deref(), Some("0"), "{text}");
        m.address_changed(Some(&conflict), None);
        let text = m.render();
        assert_eq!(value(&text, "conflict").as_deref(), Some("0"), "{text}");
        assert!(text.contains("address_controller_build_info"), "{text}");
    }
}
