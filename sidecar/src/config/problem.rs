//! A config problem: a stable code, the path of the field, what is wrong and how to fix it.

use std::fmt;

/// Stable problem codes. The string form (`PROXY.UNKNOWN_KEY`) is part of the contract:
/// documented in `docs/proxy-config.md`, printed by `validate`, counted in metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Code {
    /// The file could not be read.
    Read,
    /// The file is not valid YAML/JSON.
    Parse,
    /// A key the schema does not know (often a typo).
    UnknownKey,
    /// A required field is missing.
    MissingField,
    /// A value has the wrong type (string where a list is expected, ...).
    BadType,
    /// A value of the right type that is not accepted (unknown enum value, negative number, ...).
    BadValue,
    /// Two servers share a name.
    DuplicateServer,
    /// A server name that cannot be used as a tool-name prefix.
    BadName,
    /// Two enabled servers could expose the same tool name.
    NameCollision,
    /// A glob pattern that does not compile, or is empty.
    BadPattern,
    /// A `policy.conditions` entry that does not compile (its CEL expression, its patterns, a
    /// duplicate name).
    BadCondition,
    /// A `policy.decisionPoints` entry that cannot be asked (its URL, timeout or cache).
    BadDecisionPoint,
    /// Warning: no server is enabled with any tool allowed: the task is offered no MCP tool.
    NothingEnabled,
    /// A server with neither `stdio` nor `http`.
    NoTransport,
    /// A server with both `stdio` and `http`.
    TwoTransports,
    /// `stdio.command` is empty.
    EmptyCommand,
    /// `http.url` is not an absolute http(s) URL.
    BadUrl,
    /// `listen` is not `IP:port`.
    BadListen,
    /// An `allowedHosts` entry is not a host or `host:port`.
    BadHost,
    /// An environment variable name that cannot be used.
    BadEnvName,
    /// The same variable is set twice (`env` and `passEnv`, or twice in `passEnv`).
    DuplicateEnv,
    /// A header name that is not a valid HTTP header name.
    BadHeader,
    /// `callTimeoutSeconds` is zero.
    BadTimeout,
    /// An empty path, or a `stdio.socket` that is not absolute or too long for a socket.
    BadPath,
    /// `stdio.socket` with `env`, `passEnv` or `cwd` (those are the zone container's).
    SocketConflict,
    /// Warning: a literal `env` value that looks like a secret (it would sit in a ConfigMap).
    LiteralSecret,
    /// Warning: `listen` binds every interface.
    WideListen,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Read => "PROXY.READ",
            Code::Parse => "PROXY.PARSE",
            Code::UnknownKey => "PROXY.UNKNOWN_KEY",
            Code::MissingField => "PROXY.MISSING_FIELD",
            Code::BadType => "PROXY.BAD_TYPE",
            Code::BadValue => "PROXY.BAD_VALUE",
            Code::DuplicateServer => "PROXY.DUPLICATE_SERVER",
            Code::BadName => "PROXY.BAD_NAME",
            Code::NameCollision => "PROXY.NAME_COLLISION",
            Code::BadPattern => "PROXY.BAD_PATTERN",
            Code::BadCondition => "PROXY.BAD_CONDITION",
            Code::BadDecisionPoint => "PROXY.BAD_DECISION_POINT",
            Code::NothingEnabled => "PROXY.NOTHING_ENABLED",
            Code::NoTransport => "PROXY.NO_TRANSPORT",
            Code::TwoTransports => "PROXY.TWO_TRANSPORTS",
            Code::EmptyCommand => "PROXY.EMPTY_COMMAND",
            Code::BadUrl => "PROXY.BAD_URL",
            Code::BadListen => "PROXY.BAD_LISTEN",
            Code::BadHost => "PROXY.BAD_HOST",
            Code::BadEnvName => "PROXY.BAD_ENV_NAME",
            Code::DuplicateEnv => "PROXY.DUPLICATE_ENV",
            Code::BadHeader => "PROXY.BAD_HEADER",
            Code::BadTimeout => "PROXY.BAD_TIMEOUT",
            Code::BadPath => "PROXY.BAD_PATH",
            Code::SocketConflict => "PROXY.SOCKET_CONFLICT",
            Code::LiteralSecret => "PROXY.LITERAL_SECRET",
            Code::WideListen => "PROXY.WIDE_LISTEN",
        }
    }

    pub fn severity(self) -> Severity {
        match self {
            Code::LiteralSecret | Code::WideListen | Code::NothingEnabled => Severity::Warning,
            _ => Severity::Error,
        }
    }

    /// Every code, for documentation checks.
    pub const ALL: &'static [Code] = &[
        Code::Read,
        Code::Parse,
        Code::UnknownKey,
        Code::MissingField,
        Code::BadType,
        Code::BadValue,
        Code::DuplicateServer,
        Code::BadName,
        Code::NameCollision,
        Code::BadPattern,
        Code::BadCondition,
        Code::BadDecisionPoint,
        Code::NothingEnabled,
        Code::NoTransport,
        Code::TwoTransports,
        Code::EmptyCommand,
        Code::BadUrl,
        Code::BadListen,
        Code::BadHost,
        Code::BadEnvName,
        Code::DuplicateEnv,
        Code::BadHeader,
        Code::BadTimeout,
        Code::BadPath,
        Code::SocketConflict,
        Code::LiteralSecret,
        Code::WideListen,
    ];
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for Code {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

/// One problem found in a config file.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    pub code: Code,
    pub severity: Severity,
    /// Path of the offending field, e.g. `servers[0].stdio.command` (empty for the whole file).
    pub path: String,
    /// What is wrong, and how to fix it.
    pub message: String,
}

impl Problem {
    pub fn new(code: Code, path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code,
            severity: code.severity(),
            path: path.into(),
            message: message.into(),
        }
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sev = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        if self.path.is_empty() {
            write!(f, "{sev}[{}]: {}", self.code, self.message)
        } else {
            write!(f, "{sev}[{}] {}: {}", self.code, self.path, self.message)
        }
    }
}

/// All problems of one load, errors first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Problems(pub Vec<Problem>);

impl Problems {
    pub fn has_errors(&self) -> bool {
        self.0.iter().any(Problem::is_error)
    }
    pub fn errors(&self) -> impl Iterator<Item = &Problem> {
        self.0.iter().filter(|p| p.is_error())
    }
    pub fn warnings(&self) -> impl Iterator<Item = &Problem> {
        self.0.iter().filter(|p| !p.is_error())
    }
    pub fn codes(&self) -> Vec<&'static str> {
        self.0.iter().map(|p| p.code.as_str()).collect()
    }
}

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}
