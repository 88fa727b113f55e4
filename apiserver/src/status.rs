//! `metav1.Status` error responses, with the reasons and wording kubectl expects.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An API error rendered as a `Status` object.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: StatusCode,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<serde_json::Value>,
}

impl ApiError {
    pub fn unauthorized() -> Self {
        Self {
            code: StatusCode::UNAUTHORIZED,
            reason: "Unauthorized",
            message: "Unauthorized".into(),
            details: None,
        }
    }

    /// 403 in the wording of the Kubernetes authorizer.
    pub fn forbidden(
        user: &str,
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
                group = crate::views::GROUP
            ),
            details: Some(
                json!({"group": crate::views::GROUP, "kind": resource, "name": name.unwrap_or_default()}),
            ),
        }
    }

    pub fn forbidden_path(user: &str, verb: &str, path: &str) -> Self {
        Self {
            code: StatusCode::FORBIDDEN,
            reason: "Forbidden",
            message: format!("forbidden: User \"{user}\" cannot {verb} path \"{path}\""),
            details: None,
        }
    }

    pub fn not_found(resource: &str, name: &str) -> Self {
        Self {
            code: StatusCode::NOT_FOUND,
            reason: "NotFound",
            message: format!("{resource}.{} \"{name}\" not found", crate::views::GROUP),
            details: Some(json!({"group": crate::views::GROUP, "kind": resource, "name": name})),
        }
    }

    pub fn path_not_found() -> Self {
        Self {
            code: StatusCode::NOT_FOUND,
            reason: "NotFound",
            message: "the server could not find the requested resource".into(),
            details: None,
        }
    }

    pub fn method_not_allowed(verb: &str, resource: &str) -> Self {
        Self {
            code: StatusCode::METHOD_NOT_ALLOWED,
            reason: "MethodNotAllowed",
            message: format!(
                "{verb} is not supported on resources of kind \"{resource}.{}\"",
                crate::views::GROUP
            ),
            details: Some(json!({"group": crate::views::GROUP, "kind": resource})),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            code: StatusCode::BAD_REQUEST,
            reason: "BadRequest",
            message: message.into(),
            details: None,
        }
    }

    pub fn gone(message: impl Into<String>) -> Self {
        Self {
            code: StatusCode::GONE,
            reason: "Expired",
            message: message.into(),
            details: None,
        }
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            code: StatusCode::SERVICE_UNAVAILABLE,
            reason: "ServiceUnavailable",
            message: message.into(),
            details: None,
        }
    }

    pub fn body(&self) -> serde_json::Value {
        let mut v = json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "code": self.code.as_u16()});
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.code, Json(self.body())).into_response()
    }
}
