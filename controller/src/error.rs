use thiserror::Error;

/// What can go wrong in a reconcile pass. [`Error::category`] is the bounded label used
/// in metrics and in the requeue policy.
#[derive(Debug, Error)]
pub enum Error {
    /// A guarded write lost a race: the object changed since the snapshot. Recompute.
    #[error("{object} changed while {action}; recomputing")]
    Conflict {
        action: &'static str,
        object: String,
    },
    /// Any other API error.
    #[error("{action} {object}: {source}")]
    Kube {
        action: &'static str,
        object: String,
        #[source]
        source: kube::Error,
    },
}

impl Error {
    pub fn category(&self) -> &'static str {
        match self {
            Error::Conflict { .. } => "conflict",
            Error::Kube { .. } => "api",
        }
    }

    /// Maps a kube error, turning HTTP 409 into [`Error::Conflict`].
    pub fn kube(
        action: &'static str,
        object: impl Into<String>,
    ) -> impl FnOnce(kube::Error) -> Error {
        let object = object.into();
        move |source| match &source {
            kube::Error::Api(s) if s.code == 409 => Error::Conflict { action, object },
            _ => Error::Kube {
                action,
                object,
                source,
            },
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
