//! `?watch=true`: the changes of a view, pushed from the store's history as they are
//! computed — no watch polls or recomputes anything. A watch starts from a snapshot (no
//! resourceVersion, `0`, or `sendInitialEvents=true`: every object as ADDED, then with
//! `sendInitialEvents` the bookmark annotated `k8s.io/initial-events-end`) or resumes from a
//! resourceVersion a list or an earlier watch returned, replaying the history after it; one
//! older than the history holds gets the ERROR event 410 Expired (as kube-apiserver sends it)
//! and the client lists again. A watch that falls behind the history's end is ended the same
//! way. Bookmarks, when allowed, come every minute.

// Handlers answer `Result<Response, Response>`: the error is an answer too.
#![allow(clippy::result_large_err)]

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::group::API_VERSION;
use crate::list_options::ListOptions;
use crate::render::{self, IncludeObject};
use crate::state::State;
use crate::store::{Entry, Resume};
use address_controller_serving::negotiate::Format;
use address_controller_serving::status::ApiError;

const BOOKMARK_EVERY: Duration = Duration::from_secs(60);
const WAIT_FOR_REVISION: Duration = Duration::from_secs(3);

struct Watch {
    state: Arc<State>,
    view: usize,
    ns: Option<String>,
    opts: ListOptions,
    format: Format,
    include: IncludeObject,
    /// The next history sequence number to send.
    pos: u64,
    /// The last revision the client has everything up to.
    revision: u64,
    queue: VecDeque<Bytes>,
    columns_sent: bool,
    next_bookmark: Instant,
    deadline: Instant,
    done: bool,
}

impl Watch {
    fn object(&mut self, e: &Entry) -> Value {
        match self.format {
            Format::Json | Format::Yaml => e.value(),
            Format::Partial(v) | Format::PartialList(v) => render::partial(e, v),
            Format::Table(v) => {
                // Column definitions go with the first event only (kubectl get -w).
                let cols = if self.columns_sent {
                    json!([])
                } else {
                    json!(render::columns(self.state.store.views[self.view].info()))
                };
                self.columns_sent = true;
                json!({"kind": "Table", "apiVersion": format!("meta.k8s.io/{v}"),
                    "metadata": {"resourceVersion": e.rv.to_string()},
                    "columnDefinitions": cols, "rows": [render::row(e, v, self.include)]})
            }
        }
    }

    fn push(&mut self, kind: &str, e: &Entry) {
        let line = match self.format {
            // The object as the store serialized it: one encoding per change, not per watch.
            Format::Json | Format::Yaml => {
                let mut b = Vec::with_capacity(e.json.len() + 32);
                b.extend_from_slice(format!("{{\"type\":\"{kind}\",\"object\":").as_bytes());
                b.extend_from_slice(&e.json);
                b.extend_from_slice(b"}\n");
                b
            }
            _ => {
                let object = self.object(e);
                let mut b = serde_json::to_vec(&json!({"type": kind, "object": object}))
                    .unwrap_or_default();
                b.push(b'\n');
                b
            }
        };
        self.queue.push_back(Bytes::from(line));
    }

    fn push_value(&mut self, kind: &str, object: Value) {
        let mut b =
            serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
        b.push(b'\n');
        self.queue.push_back(Bytes::from(b));
    }

    fn bookmark(&mut self, initial_end: bool) {
        let info = self.state.store.views[self.view].info();
        let (kind, api_version) = match self.format {
            Format::Json | Format::Yaml => (info.kind.to_string(), API_VERSION.to_string()),
            Format::Partial(v) | Format::PartialList(v) => {
                ("PartialObjectMetadata".into(), format!("meta.k8s.io/{v}"))
            }
            Format::Table(v) => ("Table".into(), format!("meta.k8s.io/{v}")),
        };
        let mut meta = json!({"resourceVersion": self.revision.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        self.push_value(
            "BOOKMARK",
            json!({"kind": kind, "apiVersion": api_version, "metadata": meta}),
        );
        self.next_bookmark = Instant::now() + BOOKMARK_EVERY;
    }

    fn expired(&mut self, message: String) {
        let status = ApiError::gone(message).body();
        self.push_value("ERROR", status);
        self.done = true;
    }

    /// Queues what the history has for this watch since `pos`.
    fn catch_up(&mut self) {
        match self.state.store.events_from(self.pos) {
            None => self.expired(format!(
                "too old resource version: {} (the watch fell behind)",
                self.revision
            )),
            Some((events, revision)) => {
                for e in events {
                    self.pos = e.seq + 1;
                    if e.view == self.view && e.entry.selected(self.ns.as_deref(), &self.opts) {
                        self.push(e.kind.as_str(), &e.entry);
                    }
                }
                self.revision = self.revision.max(revision);
            }
        }
    }
}

impl Watch {
    /// A watch of VIEW (in NS) as OPTS ask, with nothing sent yet: its deadline is the
    /// client's timeoutSeconds, or as kube-apiserver's, a random time in [30 min, 60 min].
    fn new(
        state: Arc<State>,
        view: usize,
        ns: Option<String>,
        opts: ListOptions,
        format: Format,
        include: IncludeObject,
    ) -> Watch {
        // About 30 years: a deadline no watch reaches.
        const FOREVER: Duration = Duration::from_secs(1 << 30);
        // kube-apiserver ends a watch after a random time in [30 min, 60 min] unless asked.
        let timeout = opts.timeout.unwrap_or_else(|| {
            let jitter = u64::from(std::process::id()) % 1800;
            Duration::from_secs(1800 + jitter)
        });
        Watch {
            state,
            view,
            ns,
            opts,
            format,
            include,
            pos: 0,
            revision: 0,
            queue: VecDeque::new(),
            columns_sent: false,
            next_bookmark: Instant::now() + BOOKMARK_EVERY,
            // A client's timeoutSeconds can be anything up to i64::MAX: past what an Instant
            // holds the watch simply never times out by itself.
            deadline: Instant::now()
                .checked_add(timeout)
                .unwrap_or_else(|| Instant::now() + FOREVER),
            done: false,
        }
    }
}

pub async fn serve(
    state: Arc<State>,
    view: usize,
    ns: Option<String>,
    opts: ListOptions,
    format: Format,
    include: IncludeObject,
) -> Result<Response, Response> {
    if format == Format::Yaml {
        return Err(ApiError::not_acceptable_message(
            "only the following media types are accepted: application/json;stream=watch",
        )
        .into_response());
    }
    let store = state.store.clone();
    let mut w = Watch::new(state.clone(), view, ns, opts, format, include);
    let from = w.opts.resource_version.filter(|rv| *rv > 0);
    let initial = w.opts.send_initial_events == Some(true) || from.is_none();
    if let Some(rv) = from
        && !store.wait_for_revision(rv, WAIT_FOR_REVISION).await
    {
        return Err(ApiError::too_large_resource_version(rv, store.revision()).into_response());
    }
    if initial {
        let snap = store.snapshot(view);
        w.pos = snap.next_seq;
        w.revision = snap.revision;
        for e in &snap.objects {
            if e.selected(w.ns.as_deref(), &w.opts) {
                w.push("ADDED", e);
            }
        }
        // The bookmark that ends them, to a client that takes bookmarks (kube-apiserver
        // sends it whenever a watch starts with the current state).
        if w.opts.bookmarks {
            w.bookmark(true);
        }
    } else if let Some(rv) = from {
        match store.resume(rv) {
            Resume::From(seq) => {
                w.pos = seq;
                w.revision = rv;
                w.catch_up();
            }
            Resume::TooOld { oldest } => {
                w.expired(format!("too old resource version: {rv} ({oldest})"))
            }
        }
    }
    let rx = store.subscribe();
    let stream = futures::stream::unfold((w, rx), |(mut w, mut rx)| async move {
        loop {
            if let Some(b) = w.queue.pop_front() {
                return Some((Ok::<Bytes, std::io::Error>(b), (w, rx)));
            }
            if w.done || Instant::now() >= w.deadline {
                return None;
            }
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                    w.catch_up();
                }
                () = tokio::time::sleep_until(w.next_bookmark) => {
                    if w.opts.bookmarks {
                        w.catch_up();
                        w.bookmark(false);
                    } else {
                        w.next_bookmark = Instant::now() + BOOKMARK_EVERY;
                    }
                }
                () = tokio::time::sleep_until(w.deadline) => return None,
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
