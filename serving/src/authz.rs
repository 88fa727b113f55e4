//! Authorization by SubjectAccessReview, with the attributes the generic apiserver sends
//! (verb, group, version, resource, subresource, namespace, name; or a non-resource path),
//! `system:masters` allowed without a review, and decisions cached briefly.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};

use crate::authn::UserInfo;
use crate::limits::ReviewGate;
use crate::metrics::Peer;

const TTL: Duration = Duration::from_secs(10);

/// What is being asked for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Attributes {
    Resource {
        verb: String,
        /// The API group and version, from the request's path.
        group: String,
        version: String,
        resource: String,
        subresource: String,
        namespace: Option<String>,
        name: Option<String>,
    },
    Path {
        verb: String,
        path: String,
    },
}

pub struct Authorizer {
    /// The reviews' own client: no other call of the process waits behind them.
    client: Client,
    gate: Arc<ReviewGate>,
    /// Decisions by a hash of (user, attributes): bounded in size and time; concurrent
    /// identical reviews are made once.
    cache: moka::future::Cache<[u8; 32], bool>,
}

/// Longest wait for a SubjectAccessReview.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum AuthzError {
    #[error("SubjectAccessReview: {0}")]
    Review(#[from] kube::Error),
    #[error("SubjectAccessReview timed out after {0:?}")]
    Timeout(Duration),
    /// No room for the review now ([`ReviewGate`]): 429, the client retries.
    #[error("too many reviews in flight")]
    Overloaded,
}

/// A digest of what a decision depends on.
fn cache_key(user: &UserInfo, attrs: &Attributes) -> [u8; 32] {
    let text = serde_json::json!([
        user.name,
        user.uid,
        user.groups,
        user.extra,
        format!("{attrs:?}")
    ])
    .to_string();
    let d = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

impl Authorizer {
    /// `capacity`: most decisions kept; `gate`: the process's budget of reviews.
    pub fn new(client: Client, capacity: u64, gate: Arc<ReviewGate>) -> Self {
        Authorizer {
            client,
            gate,
            cache: moka::future::Cache::builder()
                .max_capacity(capacity)
                .time_to_live(TTL)
                .build(),
        }
    }

    /// Applies pending evictions and expirations (they are otherwise applied lazily).
    pub async fn upkeep(&self) {
        self.cache.run_pending_tasks().await;
    }

    /// Decisions held (as of the last upkeep).
    pub fn cached(&self) -> u64 {
        self.cache.entry_count()
    }

    pub async fn allowed(
        &self,
        user: &UserInfo,
        attrs: &Attributes,
    ) -> Result<bool, Arc<AuthzError>> {
        if user.groups.iter().any(|g| g == "system:masters") {
            return Ok(true);
        }
        self.cache
            .try_get_with(cache_key(user, attrs), self.review(user, attrs))
            .await
    }

    async fn review(&self, user: &UserInfo, attrs: &Attributes) -> Result<bool, AuthzError> {
        let peer = if user.groups.iter().any(|g| g == "system:unauthenticated") {
            Peer::Unauthenticated
        } else {
            Peer::Authenticated
        };
        let _permit = self.gate.enter(peer).ok_or(AuthzError::Overloaded)?;
        let mut spec = SubjectAccessReviewSpec {
            user: Some(user.name.clone()),
            uid: user.uid.clone(),
            groups: Some(user.groups.clone()),
            extra: Some(user.extra.clone()),
            ..Default::default()
        };
        match attrs {
            Attributes::Resource {
                verb,
                group,
                version,
                resource,
                subresource,
                namespace,
                name,
            } => {
                spec.resource_attributes = Some(ResourceAttributes {
                    verb: Some(verb.clone()),
                    group: Some(group.clone()),
                    version: Some(version.clone()),
                    resource: Some(resource.clone()),
                    subresource: Some(subresource.clone()).filter(|s| !s.is_empty()),
                    namespace: namespace.clone(),
                    name: name.clone(),
                    ..Default::default()
                })
            }
            Attributes::Path { verb, path } => {
                spec.non_resource_attributes = Some(NonResourceAttributes {
                    verb: Some(verb.clone()),
                    path: Some(path.clone()),
                })
            }
        }
        let review = SubjectAccessReview {
            spec,
            ..Default::default()
        };
        let api = Api::<SubjectAccessReview>::all(self.client.clone());
        let result =
            tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), &review))
                .await
                .map_err(|_| AuthzError::Timeout(REVIEW_TIMEOUT))??;
        Ok(result
            .status
            .is_some_and(|s| s.allowed && s.denied != Some(true)))
    }
}
