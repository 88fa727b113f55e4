//! Authorization by SubjectAccessReview, with the attributes the generic apiserver sends
//! (verb, group, version, resource, subresource, namespace, name; or a non-resource path),
//! `system:masters` allowed without a review, and decisions cached briefly.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};

use crate::authn::UserInfo;

const TTL: Duration = Duration::from_secs(10);

/// What is being asked for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Attributes {
    Resource {
        verb: String,
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
    client: Client,
    cache: Mutex<HashMap<(UserInfo, Attributes), (Instant, bool)>>,
}

impl Authorizer {
    pub fn new(client: Client) -> Self {
        Authorizer {
            client,
            cache: Mutex::new(HashMap::new()),
        }
    }

    pub async fn allowed(&self, user: &UserInfo, attrs: &Attributes) -> Result<bool, kube::Error> {
        if user.groups.iter().any(|g| g == "system:masters") {
            return Ok(true);
        }
        let key = (user.clone(), attrs.clone());
        if let Some((at, allowed)) = self
            .cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
            && at.elapsed() < TTL
        {
            return Ok(*allowed);
        }
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
                resource,
                subresource,
                namespace,
                name,
            } => {
                spec.resource_attributes = Some(ResourceAttributes {
                    verb: Some(verb.clone()),
                    group: Some(crate::views::GROUP.into()),
                    version: Some(crate::views::VERSION.into()),
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
        let result = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await?;
        let allowed = result
            .status
            .is_some_and(|s| s.allowed && s.denied != Some(true));
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        cache.retain(|_, (at, _)| at.elapsed() < TTL);
        cache.insert(key, (Instant::now(), allowed));
        Ok(allowed)
    }
}
