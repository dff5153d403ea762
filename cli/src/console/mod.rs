//! `orchestrator-cli console`: a web page for the people around a task, served on 127.0.0.1 by
//! the CLI itself. Everything it shows and does goes through the caller's own Kubernetes
//! credentials (kubeconfig, `--as`), so RBAC decides; nothing new runs in the cluster. The
//! contract (API, events, the page's structure): docs/design/console.md.
//!
//! Children, in the order they may import each other: [`guard`] (Host, session and CSRF checks;
//! pure), [`handoff`] (the one-time link the browser is opened with: no token on a command
//! line), [`params`] (a held call's arguments laid out; pure), [`view`] (a TaskRun as the page
//! sees it; pure), [`access`] (what the caller may do: SelfSubjectAccessReviews), [`podlog`]
//! (the task pod's log, bounded), [`actions`] (approve, add-context, cancel, audit, log,
//! access: the task commands' own functions), [`live`] (the watch as Server-Sent Events),
//! [`routes`] (the HTTP surface), and `routes_tests` (the surface against a scripted API server).

pub mod access;
pub mod actions;
pub mod guard;
pub mod handoff;
pub mod live;
pub mod params;
pub mod podlog;
pub mod routes;
#[cfg(test)]
mod routes_tests;
pub mod view;

use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;

use kube::Api;
use kube::api::ListParams;
use orchestrator_crds::taskrun::TaskRun;

use crate::args::{ConsoleArgs, Global};
use crate::connect::{Cluster, connect};
use crate::error::{Error, Result};
use crate::identity;
use crate::output;

/// What every request of one console shares.
pub struct Console {
    pub client: kube::Client,
    /// `-n`'s namespace; `None` with `-A`.
    namespace: Option<String>,
    /// The namespace commands default to (the catalog's lookups use `global`).
    default_namespace: String,
    pub global: Global,
    pub session: guard::Session,
    /// Who the API server says the caller is.
    pub user: Option<String>,
    /// Where it listens (`127.0.0.1:PORT`).
    pub addr: SocketAddr,
    /// The one-time link the browser is opened with.
    pub handoff: handoff::Handoff,
    /// Whether a connection from a peer to `addr` comes from the console's own user
    /// ([`handoff::same_user`]; tests put their own).
    pub same_user: fn(SocketAddr, SocketAddr) -> Result<(), String>,
}

impl Console {
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// A [`Cluster`] for namespace `ns` (default: the console's).
    pub fn cluster(&self, ns: Option<&str>) -> Cluster {
        Cluster {
            client: self.client.clone(),
            namespace: ns.unwrap_or(&self.default_namespace).to_string(),
        }
    }

    /// The cluster for one task, refusing what is not a name or not in the console's namespace.
    pub fn task_cluster(&self, ns: &str, name: &str) -> Result<Cluster, actions::ApiError> {
        actions::scoped(self, ns, name)
    }

    /// The TaskRuns the page watches.
    pub fn taskruns(&self) -> Api<TaskRun> {
        match &self.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        }
    }

    pub fn scope_text(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("namespace {ns}"),
            None => "all namespaces".into(),
        }
    }
}

/// `orchestrator-cli console`.
pub async fn run(global: &Global, args: &ConsoleArgs) -> Result<()> {
    let cluster = connect(global).await?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port))
        .await
        .map_err(|e| {
            Error::Usage(format!(
                "cannot listen on 127.0.0.1:{} ({e}); choose another --port (0: any free port)",
                args.port
            ))
        })?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::Cluster(format!("the console's address: {e}")))?;
    let port = addr.port();
    let session = guard::Session::new(port, &args.allow_host)
        .map_err(|e| Error::Cluster(format!("making the console's session token: {e}")))?;
    // What the page will watch: said now, in the API server's words, rather than as an empty
    // page with a problem banner.
    let namespace = match args.all_namespaces {
        true => crate::task::inbox::all_or_current(&cluster, &ListParams::default()).await?,
        false => Some(cluster.namespace.clone()),
    };
    if let Some(ns) = &namespace {
        crate::task::api(&cluster)
            .list(&ListParams::default().limit(1))
            .await
            .map_err(|e| {
                Error::kube(
                    format!("listing TaskRuns in namespace {ns} (the console shows the TaskRuns you may list; -n picks another namespace)"),
                    e,
                )
            })?;
    }
    let user = identity::whoami(&cluster.client).await;
    let url = format!("http://127.0.0.1:{port}/?token={}", session.token());
    let console = Arc::new(Console {
        client: cluster.client.clone(),
        namespace,
        default_namespace: cluster.namespace.clone(),
        global: global.clone(),
        session,
        user: user.clone(),
        addr,
        handoff: handoff::Handoff::default(),
        same_user: handoff::same_user,
    });
    // One line on stdout, flushed at once: scripts and tests read it.
    let mut stdout = std::io::stdout();
    writeln!(stdout, "console: {url}")
        .and_then(|()| stdout.flush())
        .map_err(|e| Error::Output(e.to_string()))?;
    output::note(&format!(
        "serving TaskRuns of {} as {}; the URL carries this session's token, keep it to yourself; Ctrl-C stops",
        console.scope_text(),
        user.as_deref()
            .unwrap_or("(the API server did not say who)")
    ));
    if !args.no_open {
        open_browser(port);
    }
    let app = routes::router(console).into_make_service_with_connect_info::<SocketAddr>();
    tokio::select! {
        served = axum::serve(listener, app) => {
            served.map_err(|e| Error::Cluster(format!("serving the console: {e}")))
        }
        _ = tokio::signal::ctrl_c() => Ok(()),
    }
}

/// Opens the console in the desktop's browser, if there is one, through the one-time link
/// ([`handoff`]): the opener's command line (which every local user can read) carries no
/// token. Where the link cannot work, nothing is opened: the URL printed is the way in.
fn open_browser(port: u16) {
    if !handoff::SUPPORTED {
        output::note(
            "open the URL above yourself: on this system the console cannot hand its session to a browser without putting the token on a command line",
        );
        return;
    }
    let opener = "xdg-open";
    let spawned = std::process::Command::new(opener)
        .arg(handoff::url(port))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    if let Err(e) = spawned {
        output::note(&format!(
            "could not open a browser ({opener}: {e}); open the URL above yourself"
        ));
    }
}
