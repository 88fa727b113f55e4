//! `metav1.Status` error responses, with the reasons and wording kubectl expects.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// What kube-apiserver answers for a path that names nothing: a plain-text 404.
pub fn page_not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; charset=utf-8",
        )],
        "404 page not found\n",
    )
        .into_response()
}

/// An API error rendered as a `Status` object.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: StatusCode,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<serde_json::Value>,
    /// `metadata.continue` of the Status (an expired list's way on).
    pub continue_: Option<String>,
}

impl ApiError {
    pub fn unauthorized() -> Self {
        Self {
            code: StatusCode::UNAUTHORIZED,
            reason: "Unauthorized",
            message: "Unauthorized".into(),
            details: None,
            continue_: None,
        }
    }

    /// 403 in the wording of the Kubernetes authorizer.
    pub fn forbidden(
        user: &str,
        group: &str,
        verb: &str,
        resource: &str,
        subresource: &str,
        namespace: Option<&str>,
        name: Option<&str>,
    ) -> Self {
        let what = if subresource.is_empty() {
            resource.to_string()
        } else {
            format!("{resource}/{subresource}")
        };
        let scope = match namespace {
            Some(ns) => format!("in the namespace \"{ns}\""),
            None => "at the cluster scope".to_string(),
        };
        let named = name.map(|n| format!(" \"{n}\"")).unwrap_or_default();
        Self {
            code: StatusCode::FORBIDDEN,
            reason: "Forbidden",
            message: format!(
                "{resource}.{group}{named} is forbidden: User \"{user}\" cannot {verb} resource \"{what}\" in API group \"{group}\" {scope}",
            ),
            continue_: None,
            details: Some(
                json!({"group": group, "kind": resource, "name": name.unwrap_or_default()}),
            ),
        }
    }

    pub fn forbidden_path(user: &str, verb: &str, path: &str) -> Self {
        Self {
            code: StatusCode::FORBIDDEN,
            reason: "Forbidden",
            message: format!("forbidden: User \"{user}\" cannot {verb} path \"{path}\""),
            details: None,
            continue_: None,
        }
    }

    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        Self {
            code: StatusCode::NOT_FOUND,
            reason: "NotFound",
            message: format!("{resource}.{group} \"{name}\" not found"),
            continue_: None,
            details: Some(json!({"group": group, "kind": resource, "name": name})),
        }
    }

    pub fn path_not_found() -> Self {
        Self {
            code: StatusCode::NOT_FOUND,
            reason: "NotFound",
            message: "the server could not find the requested resource".into(),
            details: None,
            continue_: None,
        }
    }

    pub fn method_not_allowed(group: &str, verb: &str, resource: &str) -> Self {
        Self {
            code: StatusCode::METHOD_NOT_ALLOWED,
            reason: "MethodNotAllowed",
            message: format!("{verb} is not supported on resources of kind \"{resource}.{group}\""),
            continue_: None,
            details: Some(json!({"group": group, "kind": resource})),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            code: StatusCode::BAD_REQUEST,
            reason: "BadRequest",
            message: message.into(),
            details: None,
            continue_: None,
        }
    }

    pub fn gone(message: impl Into<String>) -> Self {
        Self {
            code: StatusCode::GONE,
            reason: "Expired",
            message: message.into(),
            details: None,
            continue_: None,
        }
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            code: StatusCode::SERVICE_UNAVAILABLE,
            reason: "ServiceUnavailable",
            message: message.into(),
            details: None,
            continue_: None,
        }
    }

    /// 422 on list options, as `ValidateListOptions` reports it.
    pub fn invalid_list_options(field: &str, reason: &str, message: String) -> Self {
        Self {
            code: StatusCode::UNPROCESSABLE_ENTITY,
            reason: "Invalid",
            message: format!("ListOptions.meta.k8s.io \"\" is invalid: {message}"),
            continue_: None,
            details: Some(list_options_causes(field, reason, &message)),
        }
    }

    /// 410 for a continue token whose list can no longer be given consistently, with a
    /// token that continues from the current state (kube-apiserver's answer, word for word).
    pub fn expired_continue(token: &str) -> Self {
        Self {
            code: StatusCode::GONE,
            reason: "Expired",
            message: "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.".into(),
            details: None,
            continue_: None,
        }
        .with_list_continue(token)
    }

    fn with_list_continue(mut self, token: &str) -> Self {
        self.continue_ = Some(token.to_string());
        self
    }

    /// 406: none of the accepted media types can be served (worded as kube-apiserver's,
    /// which lists the encodings it has: here JSON and YAML, no protobuf).
    pub fn not_acceptable() -> Self {
        Self::not_acceptable_message(
            "only the following media types are accepted: application/json, application/yaml",
        )
    }

    pub fn not_acceptable_message(message: &str) -> Self {
        Self {
            code: StatusCode::NOT_ACCEPTABLE,
            reason: "NotAcceptable",
            message: message.to_string(),
            details: None,
            continue_: None,
        }
    }

    /// 429 as kube-apiserver's max-in-flight filter answers it (the response also carries
    /// `Retry-After: 1`, see [`IntoResponse`]).
    pub fn too_many_requests() -> Self {
        Self {
            code: StatusCode::TOO_MANY_REQUESTS,
            reason: "TooManyRequests",
            message: "Too many requests, please try again later.".into(),
            details: Some(json!({"retryAfterSeconds": 1})),
            continue_: None,
        }
    }

    /// 500 without a reason, as kube-apiserver reports an encoding it cannot do.
    pub fn internal(message: &str) -> Self {
        Self {
            code: StatusCode::INTERNAL_SERVER_ERROR,
            reason: "",
            message: message.to_string(),
            details: None,
            continue_: None,
        }
    }

    /// 504: a resourceVersion newer than this replica has seen, after waiting for it.
    pub fn too_large_resource_version(wanted: u64, have: u64) -> Self {
        Self {
            code: StatusCode::GATEWAY_TIMEOUT,
            reason: "Timeout",
            message: format!("Timeout: Too large resource version: {wanted}, current: {have}"),
            continue_: None,
            details: Some(
                json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1}),
            ),
        }
    }

    pub fn body(&self) -> serde_json::Value {
        let mut v = json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
            "message": self.message, "code": self.code.as_u16()});
        if let Some(c) = &self.continue_ {
            v["metadata"]["continue"] = json!(c);
        }
        if !self.reason.is_empty() {
            v["reason"] = json!(self.reason);
        }
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }
}

/// The details of a 422 on list options: the cause's message without the field's name
/// in front, as `field.Error` words it.
fn list_options_causes(field: &str, reason: &str, message: &str) -> serde_json::Value {
    let detail = message
        .strip_prefix(&format!("{field}: "))
        .unwrap_or(message);
    json!({"kind": "ListOptions", "group": "meta.k8s.io", "causes": [{"reason": reason, "message": detail, "field": field}]})
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let retry = self
            .details
            .as_ref()
            .and_then(|d| d.get("retryAfterSeconds"))
            .and_then(serde_json::Value::as_u64);
        let mut response = (self.code, Json(self.body())).into_response();
        if let Some(secs) = retry.filter(|_| self.code == StatusCode::TOO_MANY_REQUESTS) {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(secs),
            );
        }
        response
    }
}
