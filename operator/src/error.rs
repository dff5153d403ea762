//! The operator's one error type.

/// Everything that can fail in the operator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("serializing {what}: {source}")]
    Serialize {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("the TaskRun has no {0}")]
    MissingField(&'static str),
    #[error("lost the leader lease {0}: another replica may be running the controller")]
    LostLease(String),
    #[error("telemetry: {0}")]
    Telemetry(String),
    #[error("drawing a random key: {0}")]
    Random(String),
    /// A child's name taken by an object that is not the TaskRun's, found while creating it.
    #[error("{0}")]
    Taken(String),
    #[error("serving metrics and health on {addr}: {source}")]
    Serve {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A short label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(_)) => "api",
            Error::Kube(_) => "client",
            Error::Serialize { .. } => "serialize",
            Error::MissingField(_) => "invalid_object",
            Error::LostLease(_) => "lease",
            Error::Telemetry(_) => "telemetry",
            Error::Random(_) => "random",
            Error::Taken(_) => "taken",
            Error::Serve { .. } => "serve",
        }
    }
}
