//! Class resolution (SPEC §4.7): `spec.className`, else the sticky `status.className`,
//! else the single default class. Never guesses.

use std::sync::Arc;

use address_controller_api::names::{DEFAULT_CLASS_ANNOTATION, reason};
use address_controller_api::{IPAddressClaim, IPAddressClass, Marked};
use kube::ResourceExt;

/// The outcome of class resolution.
#[derive(Debug, Clone)]
pub enum Resolution<'a> {
    Resolved(&'a IPAddressClass),
    Failed {
        reason: &'static str,
        message: String,
    },
}

/// The class a claim names: `spec.className`, else the sticky `status.className`.
pub fn named_class(claim: &IPAddressClaim) -> Option<&str> {
    claim
        .spec
        .class_name
        .as_deref()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            claim
                .status
                .as_ref()
                .and_then(|s| s.class_name.as_deref())
                .filter(|n| !n.is_empty())
        })
}

/// Resolves the class of a claim.
pub fn resolve_class<'a>(
    claim: &IPAddressClaim,
    classes: &'a [Arc<IPAddressClass>],
) -> Resolution<'a> {
    if let Some(name) = named_class(claim) {
        return match classes.iter().find(|c| c.name_any() == name) {
            Some(c) => Resolution::Resolved(c),
            None => Resolution::Failed {
                reason: reason::CLASS_NOT_FOUND,
                message: format!("IPAddressClass {name:?} does not exist"),
            },
        };
    }
    match IPAddressClass::the_marked(classes, DEFAULT_CLASS_ANNOTATION) {
        Marked::One(one) => Resolution::Resolved(one),
        Marked::None => Resolution::Failed {
            reason: reason::NO_DEFAULT_CLASS,
            message: "the claim names no class and no IPAddressClass is marked as the default"
                .into(),
        },
        Marked::Several(names) => Resolution::Failed {
            reason: reason::MULTIPLE_DEFAULT_CLASSES,
            message: format!(
                "several IPAddressClasses are marked as the default: {}",
                names.join(", ")
            ),
        },
    }
}
