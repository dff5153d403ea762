//! Where a task's proxy runs (docs/design/shared-mode.md): in its own pod, as a sidecar
//! ([`Placement::Sidecar`]), or in the chart's shared proxy ([`Placement::Shared`]). Resolved
//! once per task (`mode.rs`); every question a step asks that the two answer differently is a
//! method here, so the steps (`steps/`) and the ends (`ends/`) never ask which it is:
//!
//! | question                                  | sidecar                     | shared                                      |
//! |-------------------------------------------|-----------------------------|---------------------------------------------|
//! | what else blocks the config               | nothing                     | the shared ConfigMap's size                 |
//! | what else blocks the Job                  | nothing                     | a zone-keys Secret that is not the task's   |
//! | what comes before the Job                 | the auditors' token         | the zones' keys                             |
//! | what follows an applied config            | running pods are nudged     | the task's Role again                       |
//! | what follows the status                   | the Lease bound             | the Lease bound, the shared ConfigMap       |
//! | where the verdicts go                     | the task's ConfigMap        | the shared ConfigMap, while the task runs   |
//! | what happens at the end (and on a cancel) | nothing                     | the shared ConfigMap deleted                |
//! | when to look again                        | [`RESYNC`]                  | soon, until the pod is known                |
//!
//! The children, in the order they may import each other (each uses only those before it):
//! `mode` (which placement: recorded, else chosen), `nudge` (running pods told of a new
//! config), `zone_keys` (a shared task's zones' keys), `auditor` (a sidecar task's namespace's
//! auditor token), `binding` (which pod's proxy may write the Lease), `shared` (a shared task's
//! ConfigMap in the shared proxy's namespace).

pub mod auditor;
pub mod binding;
pub mod mode;
pub mod nudge;
pub mod shared;
pub mod zone_keys;

use std::time::Duration;

use k8s_openapi::api::rbac::v1::Role;
use kube::Api;
use orchestrator_crds::shared::ProxyMode;
use orchestrator_crds::taskrun::{TaskRun, TaskRunStatus};

use super::approvals::Target;
use super::context::{Context, POD_POLL_SECONDS, POD_RETRY, RESYNC, apply};
use super::facts::{JobFacts, Observed};
use super::status;
use crate::error::Result;
use crate::render::shared::TaskPod;
use crate::render::{self, Plan, Problem};

/// Where a task's proxy runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    Sidecar,
    Shared,
}

impl Placement {
    pub fn of(mode: ProxyMode) -> Self {
        match mode {
            ProxyMode::Sidecar => Self::Sidecar,
            ProxyMode::Shared => Self::Shared,
        }
    }

    pub fn mode(self) -> ProxyMode {
        match self {
            Self::Sidecar => ProxyMode::Sidecar,
            Self::Shared => ProxyMode::Shared,
        }
    }

    /// The placement already decided for the task, if any (see `mode.rs`).
    pub fn recorded(previous: &TaskRunStatus, job: Option<&JobFacts>) -> Option<Self> {
        mode::recorded(previous, job).map(Self::of)
    }

    /// The placement of a task whose mode could not be resolved (a Namespace label naming no
    /// mode): only a ConfigMap of its own can hold its verdicts.
    pub fn of_seen(seen: &Observed) -> Self {
        seen.mode.map_or(Self::Sidecar, Self::of)
    }

    /// Problems of the config at `version` besides the task's own ConfigMap's: the shared
    /// proxy's ConfigMap holds the proxy config (the verdicts beside it, counted too).
    pub fn config_problems(
        self,
        ctx: &Context,
        seen: &Observed,
        plan: &Plan,
        version: u64,
    ) -> Vec<Problem> {
        let shared = match (self, plan.shared()) {
            (Self::Shared, Some(shared)) => shared,
            (Self::Sidecar, _) | (Self::Shared, None) => return Vec::new(),
        };
        let data = shared
            .config_map(version, plan.config_hash(), "Running", None)
            .data;
        let written = shared::verdicts_target(ctx, &seen.ns, &seen.name).and_then(|t| t.written);
        let values = data
            .iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.len()))
            .chain(
                written
                    .as_deref()
                    .map(|v| (orchestrator_crds::approval::VERDICTS_KEY, v.len())),
            );
        render::files::too_large(shared.namespace(), shared.name(), values)
            .into_iter()
            .collect()
    }

    /// Problems that keep the Job from being created besides the pod's identity and inputs: a
    /// shared task's zone-keys Secret made by someone else.
    pub async fn job_problems(
        self,
        ctx: &Context,
        ns: &str,
        tr: &TaskRun,
        plan: &Plan,
    ) -> Result<Vec<Problem>> {
        match self {
            Self::Sidecar => Ok(Vec::new()),
            Self::Shared if !zone_keys::wanted(plan) => Ok(Vec::new()),
            Self::Shared => {
                let taken = zone_keys::not_ours(&ctx.client, ns, tr).await?;
                Ok(taken.into_iter().collect())
            }
        }
    }

    /// What the Job needs before it is created, after the pod's identity: the auditors'
    /// credential the proxy accepts on its read-only endpoints (sidecar), each zone's key,
    /// which its container mounts (shared; the pod waits for none).
    pub async fn prepare_job(
        self,
        ctx: &Context,
        ns: &str,
        tr: &TaskRun,
        plan: &Plan,
    ) -> Result<()> {
        match self {
            Self::Sidecar => auditor::create_if_missing(ctx, ns).await,
            Self::Shared => zone_keys::create_if_missing(ctx, ns, tr, plan).await,
        }
    }

    /// After a new config was applied, for a running task: its pods are told now rather than
    /// at the kubelet's next periodic sync (sidecar, see `nudge.rs`); its Role is applied again
    /// (shared: the shared proxy reads the task's Secrets through it, and a server enabled
    /// since may name one the Role did not; the agent's files in the pod are read once, at
    /// start).
    pub async fn after_config(
        self,
        ctx: &Context,
        seen: &Observed,
        plan: &Plan,
        version: u64,
    ) -> Result<()> {
        if seen.job.is_none() || seen.finished {
            return Ok(());
        }
        match self {
            Self::Sidecar => {
                let annotated = nudge::pods(&ctx.client, &seen.ns, &seen.name, version).await;
                tracing::debug!(annotated, version, "running pods told of the new config");
            }
            Self::Shared => {
                let roles = Api::<Role>::namespaced(ctx.client.clone(), &seen.ns);
                apply(&roles, &plan.identity().role).await?;
            }
        }
        Ok(())
    }

    /// What a task's end leaves to undo, in the reconcile that records its outcome (or cancels
    /// it, `terminating`: the shared proxy stops serving its token first): a shared task's
    /// ConfigMap goes.
    pub async fn end(self, ctx: &Context, seen: &Observed, terminating: bool) -> Result<()> {
        match self {
            Self::Sidecar => Ok(()),
            Self::Shared => shared::delete(ctx, &seen.ns, &seen.name, terminating).await,
        }
    }

    /// After the status is written: the task's Lease bound to its pod (when it has a Lease),
    /// and a shared task's ConfigMap applied at `version`, naming that pod. Returns the pod
    /// when known (a shared task's, with its IP, is looked for until then).
    pub async fn serve(
        self,
        ctx: &Context,
        tr: &TaskRun,
        seen: &Observed,
        plan: &Plan,
        version: u64,
    ) -> Result<Option<TaskPod>> {
        let (shared, known) = match self {
            Self::Sidecar => (false, None),
            Self::Shared => (true, shared::known_pod(ctx, plan)),
        };
        let mut pod = None;
        if let Some(job) = seen.job.as_deref().filter(|_| !seen.finished) {
            let need_pod = shared && known.is_none();
            pod = binding::bind_lease(ctx, tr, job, (shared, need_pod)).await;
        }
        let pod = pod.or(known);
        if shared && !seen.finished {
            let phase = seen.job_state.as_ref().map(|s| s.phase);
            shared::apply_config(ctx, plan, version, phase, pod.as_ref()).await?;
        }
        Ok(pod)
    }

    /// Where the verdicts go: the task's own ConfigMap when it is this TaskRun's (`own`: the
    /// verdicts it holds; `None` when it is not the TaskRun's); a shared task's ConfigMap in
    /// the shared proxy's namespace while the task runs (the watch may not show one applied
    /// this reconcile yet: no verdict is lost, the next reconcile writes them).
    pub fn verdicts_target(
        self,
        ctx: &Context,
        seen: &Observed,
        own: Option<Option<&str>>,
    ) -> Option<Target> {
        match self {
            Self::Sidecar => own.map(|written| Target {
                namespace: seen.ns.clone(),
                config_map: render::config_map_name(&seen.name),
                written: written.map(Into::into),
            }),
            Self::Shared if seen.finished => None,
            Self::Shared => shared::verdicts_target(ctx, &seen.ns, &seen.name),
        }
    }

    /// When to look at an unfinished task again: soon while a shared task's young Job has no
    /// pod with an IP yet (until then the shared proxy serves the agent nothing; a pod that
    /// cannot be scheduled is looked at every minute afterwards, like any task's: its Job's
    /// changes bring a reconcile anyway), else after [`RESYNC`].
    pub fn resync(self, seen: &Observed, pod: Option<&TaskPod>) -> Duration {
        let young = seen
            .job_state
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .is_none_or(|t| status::now().0.duration_since(t.0).as_secs() < POD_POLL_SECONDS);
        let waiting_for_pod = seen.job.is_some() && young && pod.is_none_or(|p| p.ip.is_none());
        match self {
            Self::Sidecar => RESYNC,
            Self::Shared if waiting_for_pod => POD_RETRY,
            Self::Shared => RESYNC,
        }
    }
}
