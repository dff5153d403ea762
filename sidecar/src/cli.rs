//! The command line: flags and subcommands, and the small subcommands themselves (`validate`,
//! `probe`; `zone` is [`crate::zone`]). `main.rs` parses, then starts the runtime and
//! [`crate::run`].

use std::{
    ffi::OsString,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use clap::{Parser, Subcommand};

mod common;
mod shared;

use crate::{
    Options,
    api::ApiOptions,
    config, telemetry,
    upstream::guard,
    zone::{self, ZoneOptions},
};

/// MCP proxy sidecar: filters tools, starts upstream servers lazily, hot-reloads its config.
#[derive(Parser)]
#[command(name = "orchestrator-mcp-proxy", version)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The proxy config (YAML or JSON), e.g. /etc/orchestrator/proxy.yaml.
    #[arg(long, env = "MCP_PROXY_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// Serve MCP on stdin/stdout (for clients that spawn the proxy) instead of HTTP.
    #[arg(long)]
    stdio: bool,
    /// Listen address; overrides `listen` in the config. With --stdio, also serves the HTTP
    /// endpoints (/mcp, /healthz, /readyz, /metrics, /tools) there.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Directory for cached tool lists, so a restarted proxy answers without starting servers
    /// (default: $TMPDIR/orchestrator-mcp-proxy; in the pod /tmp is an emptyDir that outlives
    /// container restarts). `--cache-dir ""` keeps lists in memory only.
    #[arg(long, env = "MCP_PROXY_CACHE_DIR")]
    cache_dir: Option<OsString>,
    /// Log format on stderr.
    #[arg(long, value_enum, default_value = "text", env = "MCP_PROXY_LOG_FORMAT")]
    pub log_format: telemetry::LogFormat,
    #[command(flatten)]
    common: common::CommonArgs,
    /// Seconds between SIGTERM and SIGKILL for upstream processes.
    #[arg(long, default_value_t = 5)]
    kill_grace_seconds: u64,
    /// Milliseconds of quiet after a change in the config directory before reloading.
    #[arg(long, default_value_t = 50)]
    reload_debounce_ms: u64,
    /// Also follow this ConfigMap (data key `proxy.yaml`, the same config as the mounted file)
    /// through the Kubernetes API, so a change is served at once. With two sources only a higher
    /// `contextVersion` is applied. Uses the in-cluster config (or $KUBECONFIG).
    #[arg(long, env = "MCP_PROXY_WATCH_CONFIG_MAP", value_parser = nonempty)]
    watch_config_map: Option<String>,
    /// Report the `contextVersion` served on this Lease (annotation
    /// orchestrator.io/served-context-version, holderIdentity, renewTime).
    #[arg(long, env = "MCP_PROXY_SERVED_LEASE", value_parser = nonempty)]
    served_lease: Option<String>,
    /// Namespace of the ConfigMap and the Lease (default: the client's, in a pod its own).
    #[arg(long, env = "MCP_PROXY_NAMESPACE", value_parser = nonempty)]
    namespace: Option<String>,
    /// This pod's name, written as the Lease's holderIdentity.
    #[arg(long, env = "MCP_PROXY_POD_NAME", value_parser = nonempty)]
    pod_name: Option<String>,
    /// The uid of the task's TaskRun: with it, a tool definition that changes is also told as an
    /// Event on the TaskRun (events.k8s.io, in `--namespace`).
    #[arg(long, env = "MCP_PROXY_TASK_UID", value_parser = nonempty)]
    task_uid: Option<String>,
    /// The values of the task's Secrets, one file per key at `<secret>/<key>` (the operator's
    /// projected volume): what a call held for approval shows has them masked as
    /// `<secret:SECRET/KEY:NONCE>`. Read at each hold (at most 256 files of 64 KiB; never
    /// logged); when they cannot be read, calls that need approval are refused.
    #[arg(long, env = "MCP_PROXY_MASK_SECRETS_DIR", value_parser = nonempty_path)]
    mask_secrets_dir: Option<PathBuf>,
    /// Also serve `GET /metrics` (and nothing else: 404) on this address, e.g. the pod IP for
    /// a PodMonitor; the MCP listener stays where it is (loopback).
    #[arg(long, env = "MCP_PROXY_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// The agent's credential (sidecar mode): a random bearer token the proxy writes to this file
    /// (mode 0640; kept when the file already holds one, so a restarted proxy keeps it), on a
    /// volume only the proxy's and the agent's containers mount. `/mcp` then requires it, and
    /// `/tools`, `/audit` and `/metrics` require it or the auditors' token. Without it (and
    /// without --auditor-token-file) every process that reaches the listener is served.
    #[arg(long, env = "MCP_PROXY_CLIENT_TOKEN_FILE", value_parser = nonempty_path)]
    client_token_file: Option<PathBuf>,
    /// The auditors' credential: a file holding a token (at least 32 characters; a Secret's
    /// key, re-read at each request) that reads `/tools`, `/audit` and `/metrics` and never
    /// calls `/mcp`.
    #[arg(long, env = "MCP_PROXY_AUDITOR_TOKEN_FILE", value_parser = nonempty_path)]
    auditor_token_file: Option<PathBuf>,
    /// Also export each audit record as an OTLP log record (event name
    /// `mcp.audit.<recordType>`) to OTEL_EXPORTER_OTLP_LOGS_ENDPOINT or
    /// OTEL_EXPORTER_OTLP_ENDPOINT, per OTEL_EXPORTER_OTLP_PROTOCOL.
    #[arg(long, env = "MCP_PROXY_AUDIT_OTLP")]
    audit_otlp: bool,
    /// Runtime threads. One (the default) keeps every hop of a call on one thread: a sidecar
    /// serves one agent, and cross-thread wake-ups cost more than they buy.
    #[arg(long, default_value_t = 1, env = "MCP_PROXY_THREADS")]
    pub threads: usize,
}

#[derive(Subcommand)]
pub enum Command {
    /// (internal) Start an upstream server with a parent-death signal: PARENT is the proxy's pid.
    #[command(name = "exec-upstream", hide = true)]
    ExecUpstream {
        parent: u32,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        command: Vec<OsString>,
    },
    /// (internal) Kill the process groups the proxy announces on stdin when the proxy is gone.
    #[command(hide = true)]
    Guard,
    /// Health probe for exec probes: GET the URL (e.g. http://127.0.0.1:8080/readyz), exit 0 on
    /// a 2xx answer within 2 s, 1 otherwise. Lets kubelet probe a proxy bound to loopback. For a
    /// loopback URL the listening socket must also be this container's uid's: another process
    /// of the pod that took the port fails the probe, whatever it answers.
    Probe { url: String },
    /// Serve many tasks from one process (shared mode): each task's ConfigMap (labelled
    /// orchestrator.io/shared-proxy-config=true in --namespace) is a task, and a request is
    /// served for the task whose pod its bearer token was issued to.
    Shared(shared::SharedArgs),
    /// Check a config file: print every problem with its code, exit non-zero on errors.
    Validate {
        file: PathBuf,
        /// Print the problems as a JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Run in a stdio server's own container (its zone): listen on SOCKET and start COMMAND
    /// there each time the proxy asks, handing its stdin, stdout and stderr to the proxy. The
    /// process gets this container's environment and working directory as they are.
    Zone {
        /// The unix socket to listen on (mode 0660; a stale one is replaced).
        #[arg(long, required_unless_present = "listen", conflicts_with = "listen")]
        socket: Option<PathBuf>,
        /// Listen on TCP instead (shared mode: the proxy is in another pod); needs --key-file.
        #[arg(long, value_name = "IP:PORT", requires = "key_file")]
        listen: Option<std::net::SocketAddr>,
        /// With --listen: the zone's key, at least 32 random bytes as hex digits
        /// (`openssl rand -hex 32`). A peer must prove it holds it.
        #[arg(long, value_name = "FILE", requires = "listen")]
        key_file: Option<PathBuf>,
        /// This zone's server name: the zone's first line names it (the proxy starts nothing in
        /// a zone of another server), a start for another server is refused, and with --listen
        /// the peer's proof covers it.
        #[arg(long, value_name = "NAME")]
        server: String,
        /// Only a peer with this uid (the proxy's) may start the server.
        #[arg(long, conflicts_with = "listen")]
        peer_uid: Option<u32>,
        /// Seconds between SIGTERM and SIGKILL when a process group is ended.
        #[arg(long, default_value_t = 5)]
        grace_seconds: u64,
        /// The server's command and its arguments, after `--`.
        #[arg(last = true, required = true, value_name = "COMMAND")]
        command: Vec<OsString>,
    },
}

impl Command {
    pub fn run(&self, log_format: telemetry::LogFormat) -> ExitCode {
        match self {
            Command::Probe { url } => probe(url),
            Command::Shared(args) => args.run(log_format),
            Command::Validate { file, json } => validate(file, *json),
            Command::ExecUpstream { parent, command } => guard::exec_upstream(*parent, command),
            Command::Guard => guard::guard_main(),
            Command::Zone {
                socket,
                listen,
                key_file,
                server,
                peer_uid,
                grace_seconds,
                command,
            } => {
                let Some((program, args)) = command.split_first() else {
                    eprintln!("zone: no command");
                    return ExitCode::from(2);
                };
                let listen = match (socket, listen, key_file) {
                    (_, Some(addr), Some(key_file)) => zone::Listen::Tcp {
                        addr: *addr,
                        key_file: key_file.clone(),
                    },
                    (Some(socket), None, _) => zone::Listen::Socket(socket.clone()),
                    _ => {
                        eprintln!("zone: give --socket PATH, or --listen IP:PORT with --key-file");
                        return ExitCode::from(2);
                    }
                };
                let options = ZoneOptions {
                    listen,
                    server: server.clone(),
                    peer_uid: *peer_uid,
                    grace: Duration::from_secs(*grace_seconds),
                    command: program.clone(),
                    args: args.to_vec(),
                };
                zone::main(options, log_format)
            }
        }
    }
}

impl Args {
    /// The options for [`crate::run`]; `Err` with the exit code when something is missing.
    pub fn options(&self) -> Result<Options, ExitCode> {
        let Some(config) = self.config.clone() else {
            eprintln!("error: --config PATH is required (or MCP_PROXY_CONFIG)");
            return Err(ExitCode::from(2));
        };
        Ok(Options {
            config,
            stdio: self.stdio,
            listen: self.listen,
            cache_dir: match &self.cache_dir {
                Some(dir) if dir.is_empty() => None,
                Some(dir) => Some(PathBuf::from(dir)),
                None => Some(std::env::temp_dir().join("orchestrator-mcp-proxy")),
            },
            kill_grace: Duration::from_secs(self.kill_grace_seconds),
            reload_debounce: Duration::from_millis(self.reload_debounce_ms),
            mask_secrets_dir: self.mask_secrets_dir.clone(),
            client_token_file: self.client_token_file.clone(),
            auditor_token_file: self.auditor_token_file.clone(),
            api: ApiOptions {
                watch_config_map: self.watch_config_map.clone(),
                served_lease: self.served_lease.clone(),
                namespace: self.namespace.clone(),
                pod_name: self.pod_name.clone(),
                task_uid: self.task_uid.clone(),
                replica: None,
            },
            runtime: self.common.settings(self.metrics_listen, self.audit_otlp),
        })
    }

    /// The runtime: current-thread for one thread, else multi-thread.
    pub fn runtime(&self) -> std::io::Result<tokio::runtime::Runtime> {
        let mut builder = if self.threads <= 1 {
            tokio::runtime::Builder::new_current_thread()
        } else {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(self.threads);
            b
        };
        builder.enable_all().build()
    }
}

/// An empty value (an unset env var rendered as "") is an error, not a name.
fn nonempty(value: &str) -> Result<String, String> {
    if value.trim().is_empty() {
        Err("must not be empty".to_string())
    } else {
        Ok(value.to_string())
    }
}

/// [`nonempty`], as a path.
fn nonempty_path(value: &str) -> Result<PathBuf, String> {
    nonempty(value).map(PathBuf::from)
}

fn validate(file: &Path, json: bool) -> ExitCode {
    let loaded = config::load_file(file);
    if json {
        match serde_json::to_string_pretty(&loaded.problems.0) {
            Ok(text) => println!("{text}"),
            Err(e) => eprintln!("cannot print problems: {e}"),
        }
    } else {
        for p in &loaded.problems.0 {
            println!("{p}");
        }
        if let Some(config) = &loaded.config {
            let startable = config.servers.iter().filter(|s| s.is_startable()).count();
            println!(
                "ok: {} (contextVersion {}, {} servers, {} startable)",
                file.display(),
                config.context_version,
                config.servers.len(),
                startable
            );
        }
    }
    if loaded.problems.has_errors() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn probe(url: &str) -> ExitCode {
    // On loopback any container of the pod could have taken the port: the answer counts only
    // when the listening socket is this container's uid's (the proxy's).
    let loopback = url
        .parse::<http::Uri>()
        .ok()
        .and_then(|u| {
            let ip = u
                .host()?
                .trim_matches(['[', ']'])
                .parse::<std::net::IpAddr>()
                .ok()?;
            Some(SocketAddr::new(ip, u.port_u16().unwrap_or(80)))
        })
        .filter(|a| a.ip().is_loopback());
    if let Some(addr) = loopback
        && let Err(e) = crate::probe::served_by_own_uid(addr)
    {
        eprintln!("{url}: {e}");
        return ExitCode::FAILURE;
    }
    match crate::probe::get(url, Duration::from_secs(2)) {
        Ok(status) if (200..300).contains(&status) => ExitCode::SUCCESS,
        Ok(status) => {
            eprintln!("{url}: HTTP {status}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("{url}: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache_dir(args: &[&str]) -> Option<PathBuf> {
        let args = Args::try_parse_from(
            ["orchestrator-mcp-proxy", "--config", "p.yaml"]
                .iter()
                .chain(args),
        )
        .expect("the flags parse");
        args.options().expect("options").cache_dir
    }

    #[test]
    fn the_api_flags_read_the_env_the_operator_renders() {
        use clap::CommandFactory;
        let command = Args::command();
        for (id, env) in [
            ("watch_config_map", "MCP_PROXY_WATCH_CONFIG_MAP"),
            ("served_lease", "MCP_PROXY_SERVED_LEASE"),
            ("namespace", "MCP_PROXY_NAMESPACE"),
            ("pod_name", "MCP_PROXY_POD_NAME"),
            ("task_uid", "MCP_PROXY_TASK_UID"),
            ("mask_secrets_dir", "MCP_PROXY_MASK_SECRETS_DIR"),
            ("metrics_listen", "MCP_PROXY_METRICS_LISTEN"),
            ("audit_otlp", "MCP_PROXY_AUDIT_OTLP"),
            ("memory_limit_bytes", "MCP_PROXY_MEMORY_LIMIT"),
        ] {
            let arg = command
                .get_arguments()
                .find(|a| a.get_id() == id)
                .unwrap_or_else(|| panic!("no flag {id}"));
            assert_eq!(arg.get_env().and_then(|e| e.to_str()), Some(env), "{id}");
        }
        let args = Args::try_parse_from([
            "orchestrator-mcp-proxy",
            "--config",
            "p.yaml",
            "--watch-config-map",
            "task-a-tools",
            "--served-lease",
            "task-a-served",
            "--namespace",
            "ns",
            "--pod-name",
            "task-a-x",
            "--mask-secrets-dir",
            "/etc/orchestrator/mask",
        ])
        .expect("the flags parse");
        let options = args.options().expect("options");
        assert_eq!(
            options.mask_secrets_dir,
            Some(PathBuf::from("/etc/orchestrator/mask"))
        );
        let api = options.api;
        assert_eq!(api.watch_config_map.as_deref(), Some("task-a-tools"));
        assert_eq!(api.served_lease.as_deref(), Some("task-a-served"));
        assert_eq!(api.namespace.as_deref(), Some("ns"));
        assert_eq!(api.pod_name.as_deref(), Some("task-a-x"));
        let none = Args::try_parse_from(["orchestrator-mcp-proxy", "--config", "p.yaml"])
            .expect("the flags parse");
        assert!(!none.options().expect("options").api.is_used());
        assert!(
            Args::try_parse_from(["x", "--config", "p.yaml", "--watch-config-map", ""]).is_err()
        );
    }

    #[test]
    fn an_empty_cache_dir_keeps_tool_lists_in_memory_as_the_help_says() {
        assert_eq!(cache_dir(&["--cache-dir", ""]), None);
        assert_eq!(cache_dir(&["--cache-dir="]), None);
        assert_eq!(
            cache_dir(&["--cache-dir", "/var/cache/p"]),
            Some(PathBuf::from("/var/cache/p"))
        );
        assert_eq!(
            cache_dir(&[]),
            Some(std::env::temp_dir().join("orchestrator-mcp-proxy"))
        );
    }
}
