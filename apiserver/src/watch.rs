//! `?watch=true` on the views. Views are computed, so a watch recomputes its objects when
//! the caches move (the revision changes) and sends the difference: ADDED, MODIFIED,
//! DELETED. Bookmarks (with kind and apiVersion) when asked; `sendInitialEvents=true`
//! ends the initial ADDED events with the `k8s.io/initial-events-end` bookmark so client-go
//! informers sync; a resourceVersion older than the current one cannot be replayed and is
//! answered 410 Expired, so the client lists again.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::State;
use crate::handlers::{Item, Shape, Snapshot, Target, columns, partial};
use crate::registry::Resource;
use crate::status::ApiError;
use crate::views::API_VERSION;

/// How often a watch looks whether the caches moved.
const POLL: Duration = Duration::from_millis(200);
/// How often a bookmark is sent when the client allows them.
const BOOKMARK_EVERY: Duration = Duration::from_secs(30);

struct Watch {
    state: Arc<State>,
    resource: &'static Resource,
    target: Target,
    query: BTreeMap<String, String>,
    shape: Shape,
    /// What the client knows: key → the object as last sent.
    known: BTreeMap<String, Value>,
    revision: u64,
    queue: VecDeque<Bytes>,
    bookmarks: bool,
    last_bookmark: Instant,
    deadline: Instant,
    columns_sent: bool,
}

impl Watch {
    fn object(&mut self, item: &Item) -> Value {
        match self.shape {
            Shape::Json => item.value.clone(),
            Shape::PartialMetadata => partial(&item.value),
            Shape::Table => {
                // Column definitions go with the first event only.
                let cols = if self.columns_sent {
                    json!([])
                } else {
                    json!(columns(self.resource.plural))
                };
                self.columns_sent = true;
                json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": item.value["metadata"]["resourceVersion"]},
                    "columnDefinitions": cols, "rows": [{"cells": item.cells, "object": partial(&item.value)}]})
            }
        }
    }

    fn push(&mut self, kind: &str, object: Value) {
        let mut line =
            serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
        line.push(b'\n');
        self.queue.push_back(Bytes::from(line));
    }

    fn bookmark(&mut self, rv: &str, initial_end: bool) {
        let (kind, api_version) = match self.shape {
            Shape::Json => (self.resource.kind.to_string(), API_VERSION.to_string()),
            Shape::PartialMetadata => ("PartialObjectMetadata".into(), "meta.k8s.io/v1".into()),
            Shape::Table => ("Table".into(), "meta.k8s.io/v1".into()),
        };
        let mut meta = json!({"resourceVersion": rv});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        self.push(
            "BOOKMARK",
            json!({"kind": kind, "apiVersion": api_version, "metadata": meta}),
        );
        self.last_bookmark = Instant::now();
    }

    /// Recomputes the objects and queues the differences.
    fn refresh(&mut self) -> Result<(), ApiError> {
        let snap = Snapshot::take(&self.state);
        let items = snap.all(self.resource, &self.target, &self.query)?;
        let mut seen = BTreeMap::new();
        for item in &items {
            let mut content = item.value.clone();
            content["metadata"]["resourceVersion"] = Value::Null;
            let kind = match self.known.get(&item.key) {
                None => Some("ADDED"),
                Some(old) if *old != content => Some("MODIFIED"),
                Some(_) => None,
            };
            if let Some(kind) = kind {
                let object = self.object(item);
                self.push(kind, object);
            }
            seen.insert(item.key.clone(), content);
        }
        let gone: Vec<(String, Value)> = self
            .known
            .iter()
            .filter(|(k, _)| !seen.contains_key(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (_, mut last) in gone {
            last["metadata"]["resourceVersion"] = json!(snap.rv);
            let object = match self.shape {
                Shape::Json => last,
                _ => partial(&last),
            };
            self.push("DELETED", object);
        }
        self.known = seen;
        self.revision = snap.rv.parse().unwrap_or(self.revision);
        Ok(())
    }
}

pub fn serve(
    state: Arc<State>,
    resource: &'static Resource,
    target: Target,
    query: BTreeMap<String, String>,
    shape: Shape,
) -> Result<Response, ApiError> {
    if target.name.is_some() {
        return Err(ApiError::method_not_allowed("watch", resource.plural));
    }
    let current = state.world.revision.load(Ordering::Acquire);
    let requested = query
        .get("resourceVersion")
        .filter(|v| !v.is_empty() && *v != "0");
    let send_initial = query.get("sendInitialEvents").map(|v| v == "true");
    let initial = match (send_initial, requested) {
        (Some(true), _) => true,
        (Some(false), _) => false,
        (None, None) => true,
        (None, Some(_)) => false,
    };
    if let (Some(rv), None | Some(false)) = (requested, send_initial) {
        let rv: u64 = rv
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv:?}")))?;
        if rv < current {
            // Views are computed; there is no history to replay from an older version.
            return Err(ApiError::gone(format!(
                "too old resource version: {rv} ({current})"
            )));
        }
    }
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .unwrap_or(1800)
        .clamp(1, 3600);
    let mut w = Watch {
        state,
        resource,
        target,
        query,
        shape,
        known: BTreeMap::new(),
        revision: 0,
        queue: VecDeque::new(),
        bookmarks: false,
        last_bookmark: Instant::now(),
        deadline: Instant::now() + Duration::from_secs(timeout),
        columns_sent: false,
    };
    w.bookmarks = query_flag(&w.query, "allowWatchBookmarks");
    w.refresh()?;
    if !initial {
        // The client has this state already: start from it, send nothing for it.
        w.queue.clear();
        w.columns_sent = false;
    }
    if send_initial == Some(true) {
        let rv = w.revision.to_string();
        w.bookmark(&rv, true);
    }
    let stream = futures::stream::unfold(w, |mut w| async move {
        loop {
            if let Some(b) = w.queue.pop_front() {
                return Some((Ok::<Bytes, std::io::Error>(b), w));
            }
            if Instant::now() >= w.deadline {
                return None;
            }
            tokio::time::sleep(POLL).await;
            if w.state.world.revision.load(Ordering::Acquire) != w.revision {
                if w.refresh().is_err() {
                    return None;
                }
            } else if w.bookmarks && w.last_bookmark.elapsed() >= BOOKMARK_EVERY {
                let rv = w.revision.to_string();
                w.bookmark(&rv, false);
            }
        }
    });
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(stream),
    )
        .into_response())
}

fn query_flag(query: &BTreeMap<String, String>, key: &str) -> bool {
    query.get(key).is_some_and(|v| v == "true" || v == "1")
}
