//! The release delay (SPEC §5.8): a `Released` address whose class has a `releaseDelay`
//! becomes free again once the delay has elapsed since `releasedAt`, unless it is annotated
//! `held: "true"`. The delay is read from the class when the pass runs; no class or no
//! delay means waiting for an admin. The pass is scheduled for the deadline (no polling).
//! The deadline itself is the class's rule ([`IPAddressClass::release_deadline`]); it
//! applies only to the binding that was released ([`IPAddress::is_released`]).

use std::time::Duration;

use address_controller_api::{IPAddress, IPAddressClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// What the release delay asks of a Released address now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Never by itself (no delay, no class, or held).
    Never,
    /// Free it now.
    Now,
    /// Look again after this long.
    In(Duration),
}

/// What the delay asks of `a`, released (or being released in this pass) at `released_at`.
pub fn due(a: &IPAddress, class: Option<&IPAddressClass>, released_at: &Time, now: &Time) -> Due {
    match class.and_then(|c| c.release_deadline_after(a, released_at)) {
        None => Due::Never,
        Some(d) if now.0 >= d => Due::Now,
        Some(d) => Due::In(Duration::try_from(d.duration_since(now.0)).unwrap_or(Duration::ZERO)),
    }
}
