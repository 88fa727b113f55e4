use address_controller_runtime::workers::{PassError, Retry};
use thiserror::Error;

/// What can go wrong in a reconcile pass. [`Error::category`] is the bounded label used
/// in metrics; [`PassError::retry`] decides the requeue.
#[derive(Debug, Error)]
pub enum Error {
    /// A guarded write lost a race: the object changed since the snapshot. Recompute
    /// (with the key's backoff, which starts at a few milliseconds).
    #[error("{object} changed while {action}; recomputing")]
    Conflict {
        action: &'static str,
        object: String,
    },
    /// The object the pass writes is gone: nothing left to do, not retried.
    #[error("{object} is gone ({action})")]
    Gone {
        action: &'static str,
        object: String,
    },
    /// The API server refused the write as invalid: retrying the same write cannot help.
    #[error("{action} {object} was refused: {message}")]
    Invalid {
        action: &'static str,
        object: String,
        message: String,
    },
    /// Any other API error (including timeouts): retried with backoff.
    #[error("{action} {object}: {source}")]
    Kube {
        action: &'static str,
        object: String,
        #[source]
        source: kube::Error,
    },
}

impl Error {
    /// Maps a kube error by its HTTP status.
    pub fn kube(
        action: &'static str,
        object: impl Into<String>,
    ) -> impl FnOnce(kube::Error) -> Error {
        let object = object.into();
        move |source| match &source {
            kube::Error::Api(s) if s.code == 409 => Error::Conflict { action, object },
            kube::Error::Api(s) if s.code == 404 => Error::Gone { action, object },
            kube::Error::Api(s) if s.code == 422 => Error::Invalid {
                action,
                object,
                message: s.message.clone(),
            },
            _ => Error::Kube {
                action,
                object,
                source,
            },
        }
    }
}

impl Error {
    /// Like [`Error::kube`], for a write to an object other than the one being reconciled:
    /// that object being gone means the snapshot was stale, so the pass is recomputed.
    pub fn kube_other(
        action: &'static str,
        object: impl Into<String>,
    ) -> impl FnOnce(kube::Error) -> Error {
        let object = object.into();
        move |source| match &source {
            kube::Error::Api(s) if s.code == 404 => Error::Conflict { action, object },
            _ => Error::kube(action, object)(source),
        }
    }
}

impl Error {
    /// The API server answered that the write did not happen (a conflict, a gone object,
    /// an invalid or otherwise refused request: a 4xx). A timeout, a 5xx or a broken
    /// connection says nothing: the write may have landed (kube-apiserver answers 504 to a
    /// write it then completes).
    pub fn refused(&self) -> bool {
        match self {
            Error::Conflict { .. } | Error::Gone { .. } | Error::Invalid { .. } => true,
            Error::Kube { source, .. } => {
                matches!(source, kube::Error::Api(s) if (400..500).contains(&s.code))
            }
        }
    }
}

impl PassError for Error {
    fn retry(&self) -> Retry {
        match self {
            Error::Conflict { .. } | Error::Kube { .. } => Retry::Backoff,
            Error::Gone { .. } => Retry::Never,
            Error::Invalid { .. } => {
                tracing::warn!(error = %self, "write refused by the API server");
                Retry::Never
            }
        }
    }

    fn category(&self) -> &'static str {
        match self {
            Error::Conflict { .. } => "conflict",
            Error::Gone { .. } => "gone",
            Error::Invalid { .. } => "invalid",
            Error::Kube { .. } => "api",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::Error;

    fn api(code: u16) -> Error {
        let status = kube::core::Status::failure("", "").with_code(code);
        Error::kube("writing", "x")(kube::Error::Api(Box::new(status)))
    }

    /// kube-apiserver's admission window after each start (#56: a policy without a schema
    /// answers 503 "Resource kind … not found" for a moment) is retried with the key's
    /// backoff, as every 5xx and 429; what retrying cannot change is not.
    #[test]
    fn the_admission_windows_503_is_retried_and_an_invalid_write_is_not() {
        use address_controller_runtime::workers::{PassError, Retry};
        for code in [503, 500, 504, 429, 409] {
            assert!(matches!(api(code).retry(), Retry::Backoff), "{code}");
        }
        for code in [404, 422] {
            assert!(matches!(api(code).retry(), Retry::Never), "{code}");
        }
    }

    #[test]
    fn only_a_4xx_says_the_write_did_not_land() {
        for code in [400, 403, 404, 409, 422, 429] {
            assert!(api(code).refused(), "{code}");
        }
        for code in [500, 503, 504] {
            assert!(!api(code).refused(), "{code}");
        }
    }
}
