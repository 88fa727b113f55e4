//! The mock-API tier of the tests (feature `mock-api`, kube-rs's `ApiServerVerifier`
//! pattern): a [`kube::Client`] whose requests go to a function of the test instead of an
//! API server. A pass runs against it; the test then reads the writes it issued — method,
//! path, body — and answers each as it chooses: the object, a 409 Conflict, a 422 Invalid.
//! Between the pure decision tests and the cluster suite: it proves what a pass *writes*
//! (the guard, the order, what it does after a refusal) in milliseconds.

use std::sync::{Arc, Mutex, PoisonError};

use kube::Client;
use serde_json::{Value, json};

/// One request the client made.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub method: String,
    /// The path, without the query.
    pub path: String,
    pub query: String,
    /// The body as JSON (`Null` when there is none or it is not JSON).
    pub body: Value,
}

impl Call {
    /// `"PATCH /apis/…/ipaddresses/x"`: the method and path, for assertions that read well.
    pub fn line(&self) -> String {
        format!("{} {}", self.method, self.path)
    }

    /// Whether it is an Event being recorded (the tests of a pass's writes usually leave
    /// them aside).
    pub fn is_event(&self) -> bool {
        self.path.contains("/events")
    }
}

/// What the test answers.
#[derive(Debug, Clone)]
pub enum Answer {
    /// 200 (201 to a POST) with this object.
    Object(Value),
    /// An error `Status`: the code and its reason (`Conflict`, `Invalid`, `NotFound`, …).
    Status(u16, &'static str),
}

impl Answer {
    /// 409, as kube-apiserver answers a write whose resourceVersion is stale.
    pub fn conflict() -> Answer {
        Answer::Status(409, "Conflict")
    }

    /// 422, as kube-apiserver answers a write the schema refuses.
    pub fn invalid() -> Answer {
        Answer::Status(422, "Invalid")
    }
}

type Responder = dyn Fn(&Call) -> Answer + Send + Sync;

/// The requests a client made, answered by the test's function.
#[derive(Clone)]
pub struct MockApi {
    calls: Arc<Mutex<Vec<Call>>>,
}

impl MockApi {
    /// A client whose every request is recorded and answered by `respond`. An Event is
    /// answered with itself when `respond` says `NotFound` for it, so a test need not
    /// script them.
    pub fn new(respond: impl Fn(&Call) -> Answer + Send + Sync + 'static) -> (MockApi, Client) {
        let calls: Arc<Mutex<Vec<Call>>> = Arc::default();
        let respond: Arc<Responder> = Arc::new(respond);
        let recorded = calls.clone();
        let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let (recorded, respond) = (recorded.clone(), respond.clone());
            async move {
                let (parts, body) = req.into_parts();
                let bytes = body.collect_bytes().await.unwrap_or_default();
                let call = Call {
                    method: parts.method.to_string(),
                    path: parts.uri.path().to_string(),
                    query: parts.uri.query().unwrap_or_default().to_string(),
                    body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                };
                let answer = match respond(&call) {
                    Answer::Status(404, _) if call.is_event() => Answer::Object(call.body.clone()),
                    a => a,
                };
                let created = call.method == "POST";
                recorded
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(call);
                let (code, body) = match answer {
                    Answer::Object(o) => (if created { 201 } else { 200 }, o),
                    Answer::Status(code, reason) => (code, status(code, reason)),
                };
                let response = http::Response::builder()
                    .status(code)
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(body.to_string())
                    .map_err(std::io::Error::other)?;
                Ok::<_, std::io::Error>(response)
            }
        });
        (MockApi { calls }, Client::new(svc, "default"))
    }

    /// Every request so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The requests so far that are not Events.
    pub fn writes(&self) -> Vec<Call> {
        self.calls().into_iter().filter(|c| !c.is_event()).collect()
    }
}

/// A `metav1.Status` of `code` and `reason`.
fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("mock API: {reason}"), "reason": reason, "code": code})
}
