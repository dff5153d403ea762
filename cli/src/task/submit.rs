//! `task submit`: build a TaskRun from the flags, check it, create it, optionally follow it.

use std::io::Read as _;

use kube::api::{ListParams, ObjectMeta, PostParams};
use orchestrator_crds::catalog::{Catalog, is_dns1123_label};
use orchestrator_crds::taskrun::history::{REQUESTED_BY_ANNOTATION, RequestedBy};
use orchestrator_crds::taskrun::result::CREATED_BY_ANNOTATION;
use orchestrator_crds::taskrun::{
    AgentSpec, CancelRequest, MAX_NAME_LEN, McpServer, Phase, PodTemplate, ProxyContainerSpec,
    TaskRun, TaskRunSpec, TaskSource, ToolConfig, permission_rules,
};

use crate::args::{Global, SubmitArgs};
use crate::catalog;
use crate::connect::{Cluster, connect};
use crate::error::{Error, Result, is_conflict};
use crate::identity;
use crate::merge::{self, Request};
use crate::output::{self, Format};
use crate::toolspec::{catalog_notes, check_servers, parse_specs};
use crate::wait;

/// The longest inline prompt the CRD accepts (characters).
const MAX_PROMPT: usize = 262_144;

/// How many ids to try when the next free one is taken by a concurrent submit.
const ID_ATTEMPTS: i64 = 20;

/// Runs `task submit`.
pub async fn run(global: &Global, args: &SubmitArgs) -> Result<()> {
    // Everything that can be judged locally is judged before connecting.
    check_names(args)?;
    let deny_rules = deny_internal_tools(args)?;
    let prompt = read_task(args)?;
    let request = Request {
        enable: parse_specs("--tools", &args.tools)?,
        disable: parse_specs("--deny-tools", &args.deny_tools)?,
    };
    merge::check_contradictions(&request)?;
    if request.enable.is_empty() {
        return Err(Error::Usage(
            "give the task at least one MCP tool with --tools SERVER:TOOL (the proxy refuses to \
             start without one; see `orchestrator-cli catalog list`)"
                .into(),
        ));
    }

    let needs_catalog = !(request.enable.is_empty() && request.disable.is_empty());
    let local = if needs_catalog {
        catalog::load_local(global)?
    } else {
        None
    };
    let local_config = local
        .as_ref()
        .map(|c| tool_config(c, &request, &args.with_servers))
        .transpose()?;
    let cluster = if args.dry_run && (local.is_some() || !needs_catalog) && args.task_id.is_some() {
        None
    } else {
        Some(connect(global).await?)
    };
    let mut tool_config = match (local_config, &cluster) {
        (Some(config), _) => config,
        (None, Some(cluster)) if needs_catalog => {
            let catalog = catalog::load(global, Some(cluster)).await?;
            tool_config(&catalog, &request, &args.with_servers)?
        }
        _ => ToolConfig::default(),
    };
    tool_config.internal_tools.permissions.deny = deny_rules;

    let spec = TaskRunSpec {
        task_id: args.task_id.unwrap_or(0),
        service_name: args.service.clone(),
        task: TaskSource {
            prompt: Some(prompt),
            ..Default::default()
        },
        agent: args.image.as_ref().map(|image| AgentSpec {
            image: Some(image.clone()),
            ..Default::default()
        }),
        proxy: args.proxy_mode.map(|mode| ProxyContainerSpec {
            mode: Some(mode),
            ..Default::default()
        }),
        service_account_name: None,
        pod_template: (!args.node_selector.is_empty() || !args.toleration.is_empty()).then(|| {
            PodTemplate {
                node_selector: args.node_selector.iter().cloned().collect(),
                tolerations: args.toleration.clone(),
                ..Default::default()
            }
        }),
        active_deadline_seconds: args.active_deadline_seconds,
        ttl_seconds_after_finished: None,
        retention_seconds_after_finished: None,
        tool_config,
        model: args.model_secret.clone().map(|secret_key_ref| {
            orchestrator_crds::taskrun::model::ModelSpec {
                secret_key_ref,
                ..Default::default()
            }
        }),
        budget: args
            .max_output_tokens
            .map(|tokens| orchestrator_crds::taskrun::model::Budget {
                output_tokens: Some(tokens),
                ..Default::default()
            }),
    };

    let Some(cluster) = cluster else {
        let namespace = global.namespace.as_deref().unwrap_or("default");
        return print_dry_run(global, args, spec, namespace);
    };
    if args.dry_run {
        let spec = TaskRunSpec {
            task_id: match args.task_id {
                Some(id) => id,
                None => next_id(&cluster).await?,
            },
            ..spec
        };
        return print_dry_run(global, args, spec, &cluster.namespace);
    }

    let created = create(&cluster, args, spec).await?;
    let name = created.metadata.name.clone().unwrap_or_default();
    match &global.output {
        Format::Table | Format::Wide => output::print(&format!("{name}\n"))?,
        f => output::print(&output::render(f, &created)?)?,
    }
    if args.wait {
        let phase = wait::until_finished(&super::api(&cluster), &name, args.timeout).await?;
        match phase {
            Phase::Failed => {
                return Err(Error::Failed(format!(
                    "TaskRun {name} failed (see `orchestrator-cli task describe {name}`)"
                )));
            }
            // Cancelled is not a success either: the same exit code (5), its own words.
            Phase::Cancelled => {
                return Err(Error::Failed(format!(
                    "TaskRun {name} was cancelled (see `orchestrator-cli task describe {name}`)"
                )));
            }
            _ => {}
        }
    }
    Ok(())
}

/// --deny-internal-tools as deny rules, each checked against the agent's rule grammar (the CRD
/// refuses the same; the agent would skip a rule it cannot parse and leave the tool enabled).
fn deny_internal_tools(args: &SubmitArgs) -> Result<Vec<String>> {
    let rules: Vec<String> = args
        .deny_internal_tools
        .iter()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .collect();
    let problems: Vec<String> = rules
        .iter()
        .filter_map(|r| permission_rules::problem(r, permission_rules::List::Deny))
        .map(|p| format!("--deny-internal-tools: {p}"))
        .collect();
    if problems.is_empty() {
        Ok(rules)
    } else {
        Err(Error::Usage(problems.join("\n")))
    }
}

fn check_names(args: &SubmitArgs) -> Result<()> {
    let mut problems = Vec::new();
    if !is_dns1123_label(&args.service) {
        problems.push(format!(
            "--service {:?}: must be a DNS-1123 label (lowercase letters, digits and '-', starting \
             and ending with a letter or digit), e.g. todo-api",
            args.service
        ));
    }
    if let Some(name) = &args.name
        && (!is_dns1123_label(name) || name.len() > MAX_NAME_LEN)
    {
        problems.push(format!(
            "--name {name:?}: must be a DNS-1123 label of at most {MAX_NAME_LEN} characters \
             (the Job is named after it)"
        ));
    }
    if let Some(id) = args.task_id
        && id < 0
    {
        problems.push(format!("--task-id {id}: must be 0 or more"));
    }
    if let Some(s) = args.active_deadline_seconds
        && s < 1
    {
        problems.push(format!("--active-deadline-seconds {s}: must be at least 1"));
    }
    if let Some(image) = &args.image
        && image.trim().is_empty()
    {
        problems.push("--image is empty".into());
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Usage(problems.join("\n")))
    }
}

/// The task text from `--prompt`, `--task-file FILE` or `--task-file -` (stdin).
fn read_task(args: &SubmitArgs) -> Result<String> {
    let (text, source) = match (&args.prompt, &args.task_file) {
        (Some(p), _) => (p.clone(), "--prompt".to_string()),
        (None, Some(path)) if path.as_os_str() == "-" => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| Error::Usage(format!("reading the task from stdin: {e}")))?;
            (text, "the task on stdin".to_string())
        }
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Error::Usage(format!("--task-file {}: {e}", path.display())))?;
            (text, format!("--task-file {}", path.display()))
        }
        (None, None) => {
            return Err(Error::Usage(
                "give the task with --task-file or --prompt".into(),
            ));
        }
    };
    if text.trim().is_empty() {
        return Err(Error::Usage(format!(
            "{source} is empty: the agent needs a task"
        )));
    }
    let chars = text.chars().count();
    if chars > MAX_PROMPT {
        return Err(Error::Usage(format!(
            "{source} has {chars} characters; a TaskRun holds at most {MAX_PROMPT} inline. Put it \
             in a ConfigMap and reference it from spec.task.configMapKeyRef (kubectl apply)"
        )));
    }
    Ok(text)
}

/// `--tools` and `--deny-tools` as a tool config, and `--with-servers` listed switched off;
/// every server checked against the catalog.
pub fn tool_config(
    catalog: &Catalog,
    request: &Request,
    with_servers: &[String],
) -> Result<ToolConfig> {
    let unknown: Vec<&str> = with_servers
        .iter()
        .filter(|s| catalog.get(s).is_none())
        .map(String::as_str)
        .collect();
    if !unknown.is_empty() {
        return Err(Error::Usage(format!(
            "--with-servers: {} not in the catalog; known servers: {}",
            unknown.join(", "),
            catalog.names().join(", ")
        )));
    }
    check_servers(
        catalog,
        request
            .enable
            .iter()
            .map(|s| ("--tools", s))
            .chain(request.disable.iter().map(|s| ("--deny-tools", s))),
    )?;
    for n in catalog_notes(catalog, &request.enable) {
        output::note(&n);
    }
    let mut out = merge::apply(&ToolConfig::default(), request, catalog)?;
    if merge::nothing_enabled(&out.config) {
        // A running task may have every tool revoked (add-context); a new one with none is a
        // mistake worth stopping.
        return Err(Error::Usage(
            "the task would be offered no MCP tool: --deny-tools hides everything --tools allows"
                .into(),
        ));
    }
    for n in out.notes {
        output::note(&n);
    }
    for name in with_servers {
        if !out.config.mcp_servers.iter().any(|s| s.name == *name) {
            let mut server = McpServer::new(name.clone(), &[], &[]);
            server.enabled = false;
            out.config.mcp_servers.push(server);
        }
    }
    Ok(out.config)
}

fn taskrun(name: &str, spec: TaskRunSpec) -> TaskRun {
    TaskRun {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        spec,
        status: None,
    }
}

fn print_dry_run(
    global: &Global,
    args: &SubmitArgs,
    spec: TaskRunSpec,
    namespace: &str,
) -> Result<()> {
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| format!("task-{}", spec.task_id));
    let mut tr = taskrun(&name, spec);
    tr.metadata.namespace = Some(namespace.to_string());
    let format = if global.output.is_table() {
        Format::Yaml
    } else {
        global.output.clone()
    };
    output::print(&output::render(&format, &tr)?)
}

/// One more than the highest task id in the namespace (1 when there is none).
async fn next_id(cluster: &Cluster) -> Result<i64> {
    let list = super::api(cluster)
        .list(&ListParams::default())
        .await
        .map_err(|e| {
            Error::kube(
                format!("listing TaskRuns in namespace {}", cluster.namespace),
                e,
            )
        })?;
    Ok(list
        .items
        .iter()
        .map(|t| t.spec.task_id)
        .max()
        .map_or(1, |m| m + 1))
}

/// Creates the TaskRun. Without --task-id the next free id is taken; a concurrent submit that
/// took it first makes the create fail with AlreadyExists, and the next id is tried.
async fn create(cluster: &Cluster, args: &SubmitArgs, spec: TaskRunSpec) -> Result<TaskRun> {
    let api = super::api(cluster);
    let auto_id = args.task_id.is_none();
    let mut id = match args.task_id {
        Some(id) => id,
        None => next_id(cluster).await?,
    };
    // Who asks, for the TaskRun's history (a new object's generation is 1) and as its creator
    // (status.createdBy; the chart's admission policy checks it is us).
    let requested_by = identity::whoami(&cluster.client).await.map(|user| {
        let created_by = CancelRequest::annotation_value(&user);
        let value = RequestedBy {
            user,
            generation: 1,
        };
        [
            (REQUESTED_BY_ANNOTATION.to_string(), value.to_annotation()),
            (CREATED_BY_ANNOTATION.to_string(), created_by),
        ]
        .into()
    });
    for _ in 0..ID_ATTEMPTS {
        let name = args.name.clone().unwrap_or_else(|| format!("task-{id}"));
        let mut tr = taskrun(
            &name,
            TaskRunSpec {
                task_id: id,
                ..spec.clone()
            },
        );
        tr.metadata.annotations = requested_by.clone();
        let params = PostParams {
            field_manager: Some(super::add_context::FIELD_MANAGER.to_string()),
            ..Default::default()
        };
        match api.create(&params, &tr).await {
            Ok(created) => return Ok(created),
            Err(e) if is_conflict(&e) && auto_id && args.name.is_none() => id += 1,
            Err(e) if is_conflict(&e) => {
                return Err(Error::Usage(format!(
                    "a TaskRun named {name} already exists in namespace {}; choose another \
                     --name (or --task-id) to run the task again",
                    cluster.namespace
                )));
            }
            Err(e) => {
                return Err(Error::kube(
                    format!("creating TaskRun {name} in namespace {}", cluster.namespace),
                    e,
                ));
            }
        }
    }
    Err(Error::Cluster(format!(
        "could not find a free task id after {ID_ATTEMPTS} tries; pass --task-id"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use orchestrator_crds::taskrun::McpServer;

    #[test]
    fn with_servers_are_listed_switched_off_for_add_context_to_enable() {
        let catalog =
            Catalog::parse(include_str!("../../../config/catalog.yaml")).expect("catalog");
        let request = Request {
            enable: parse_specs("--tools", &["time:*".into()]).expect("valid"),
            disable: vec![],
        };
        let with = ["git".to_string(), "time".to_string()];
        let config = tool_config(&catalog, &request, &with).expect("valid");
        let listed: Vec<(&str, bool)> = config
            .mcp_servers
            .iter()
            .map(|s| (s.name.as_str(), s.enabled))
            .collect();
        assert_eq!(listed, [("time", true), ("git", false)]);
        let err = tool_config(&catalog, &request, &["gitlab".to_string()])
            .expect_err("unknown")
            .to_string();
        assert!(
            err.contains("--with-servers: gitlab not in the catalog"),
            "{err}"
        );
    }

    #[test]
    fn tools_become_mcp_servers_with_allow_and_deny() {
        let catalog = Catalog::parse(
            "servers:\n  - {name: github, stdio: {command: g}}\n  - {name: filesystem, stdio: {command: f}}\n",
        )
        .expect("valid");
        let request = Request {
            enable: parse_specs(
                "--tools",
                &["github:*,filesystem:read_file,filesystem:write_*".into()],
            )
            .expect("valid"),
            disable: parse_specs("--deny-tools", &["filesystem:write_secret".into()])
                .expect("valid"),
        };
        let config = tool_config(&catalog, &request, &[]).expect("valid");
        assert_eq!(
            config.mcp_servers,
            [
                McpServer::new("github", &["*"], &[]),
                McpServer::new("filesystem", &["read_file", "write_*"], &["write_secret"]),
            ]
        );
    }

    #[test]
    fn unknown_servers_are_refused_before_anything_is_written() {
        let catalog =
            Catalog::parse("servers:\n  - {name: time, stdio: {command: t}}\n").expect("valid");
        let request = Request {
            enable: parse_specs("--tools", &["gitlab:*".into()]).expect("valid"),
            disable: vec![],
        };
        let err = tool_config(&catalog, &request, &[]).expect_err("unknown server");
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("known servers: time"), "{err}");
    }
}
