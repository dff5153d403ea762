//! `orchestrator-mcp-proxy`: thin entry point; the work happens in the library.
use std::{net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};
use orchestrator_mcp_proxy::{Options, config, telemetry};

/// MCP proxy sidecar: filters tools, starts upstream servers lazily, hot-reloads its config.
#[derive(Parser)]
#[command(name = "orchestrator-mcp-proxy", version)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
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
    cache_dir: Option<PathBuf>,
    /// Log format on stderr.
    #[arg(long, value_enum, default_value = "text", env = "MCP_PROXY_LOG_FORMAT")]
    log_format: telemetry::LogFormat,
    /// Seconds calls in flight may take to finish after SIGTERM.
    #[arg(long, default_value_t = 10)]
    shutdown_grace_seconds: u64,
    /// Seconds between SIGTERM and SIGKILL for upstream processes.
    #[arg(long, default_value_t = 5)]
    kill_grace_seconds: u64,
    /// Seconds an upstream may take to start and complete the MCP handshake.
    #[arg(long, default_value_t = 60)]
    start_timeout_seconds: u64,
    /// Milliseconds of quiet after a change in the config directory before reloading.
    #[arg(long, default_value_t = 50)]
    reload_debounce_ms: u64,
    /// Seconds after which an HTTP session no request used (and with no call in flight) is
    /// closed.
    #[arg(long, default_value_t = 24 * 3600)]
    session_idle_seconds: u64,
    /// Runtime threads. One (the default) keeps every hop of a call on one thread: a sidecar
    /// serves one agent, and cross-thread wake-ups cost more than they buy.
    #[arg(long, default_value_t = 1, env = "MCP_PROXY_THREADS")]
    threads: usize,
}

#[derive(Subcommand)]
enum Command {
    /// Health probe for exec probes: GET the URL (e.g. http://127.0.0.1:8080/readyz), exit 0 on
    /// a 2xx answer within 2 s, 1 otherwise. Lets kubelet probe a proxy bound to loopback.
    Probe { url: String },
    /// Check a config file: print every problem with its code, exit non-zero on errors.
    Validate {
        file: PathBuf,
        /// Print the problems as a JSON array.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    match &args.command {
        Some(Command::Validate { file, json }) => return validate(file, *json),
        Some(Command::Probe { url }) => return probe(url),
        None => {}
    }
    let Some(config) = args.config.clone() else {
        eprintln!("error: --config PATH is required (or MCP_PROXY_CONFIG)");
        return ExitCode::from(2);
    };
    let options = Options {
        config,
        stdio: args.stdio,
        listen: args.listen,
        cache_dir: match args.cache_dir {
            Some(dir) if dir.as_os_str().is_empty() => None,
            Some(dir) => Some(dir),
            None => Some(std::env::temp_dir().join("orchestrator-mcp-proxy")),
        },
        shutdown_grace: Duration::from_secs(args.shutdown_grace_seconds),
        kill_grace: Duration::from_secs(args.kill_grace_seconds),
        start_timeout: Duration::from_secs(args.start_timeout_seconds),
        reload_debounce: Duration::from_millis(args.reload_debounce_ms),
        session_idle: Duration::from_secs(args.session_idle_seconds),
    };
    let mut builder = if args.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(args.threads);
        b
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let log_format = args.log_format;
    let result = runtime.block_on(async move {
        // Inside the runtime: the OTLP exporter needs it.
        let telemetry = telemetry::init(log_format);
        let result = orchestrator_mcp_proxy::run(options).await;
        telemetry.shutdown().await;
        result
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

fn validate(file: &std::path::Path, json: bool) -> ExitCode {
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
    match orchestrator_mcp_proxy::probe::get(url, std::time::Duration::from_secs(2)) {
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
