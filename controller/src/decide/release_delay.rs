//! The release delay (SPEC §5.8): a `Released` address whose class has a `releaseDelay`
//! becomes free again once the delay has elapsed since `releasedAt`, unless it is annotated
//! `held: "true"`. The delay is read from the class when the pass runs; no class or no
//! delay means waiting for an admin. The pass is scheduled for the deadline (no polling).

use std::time::Duration;

use address_controller_api::names::{self, HELD_ANNOTATION};
use address_controller_api::{IPAddress, IPAddressClass, duration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// The release delay of a class, if it has a valid one.
pub fn release_delay(class: Option<&IPAddressClass>) -> Option<Duration> {
    duration::parse(class?.spec.release_delay.as_deref()?).ok()
}

/// Whether an admin holds the address back (`held: "true"`).
pub fn held(a: &IPAddress) -> bool {
    names::annotation_is_true(a.metadata.annotations.as_ref(), HELD_ANNOTATION)
}

/// When a Released address (released at `released_at`) becomes free, if it ever does by
/// itself.
pub fn deadline(
    a: &IPAddress,
    class: Option<&IPAddressClass>,
    released_at: &Time,
) -> Option<Timestamp> {
    if held(a) {
        return None;
    }
    let delay = SignedDuration::try_from(release_delay(class)?).unwrap_or(SignedDuration::MAX);
    Some(released_at.0.checked_add(delay).unwrap_or(Timestamp::MAX))
}

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

pub fn due(a: &IPAddress, class: Option<&IPAddressClass>, released_at: &Time, now: &Time) -> Due {
    match deadline(a, class, released_at) {
        None => Due::Never,
        Some(d) if now.0 >= d => Due::Now,
        Some(d) => Due::In(Duration::try_from(d.duration_since(now.0)).unwrap_or(Duration::ZERO)),
    }
}
