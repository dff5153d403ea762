//! The command line's consistency, and how flags parse.

use crate::args::*;
use crate::output::Format;
use clap::{CommandFactory, Parser};

#[test]
fn the_command_line_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn every_command_has_examples_in_its_help() {
    fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
        let path = format!("{path} {}", cmd.get_name());
        let subs: Vec<_> = cmd
            .get_subcommands()
            .filter(|c| c.get_name() != "help")
            .collect();
        if subs.is_empty() {
            let help = cmd
                .get_after_help()
                .map(|h| h.to_string())
                .unwrap_or_default();
            if !help.contains("Examples:") {
                missing.push(path.clone());
            }
        }
        for sub in subs {
            walk(sub, &path, missing);
        }
    }
    let mut missing = Vec::new();
    walk(&Cli::command(), "", &mut missing);
    assert!(missing.is_empty(), "commands without examples: {missing:?}");
}

#[test]
fn a_task_is_named_by_name_or_task_id_not_both() {
    let parse = |args: &[&str]| Cli::try_parse_from(args.iter().copied());
    assert!(parse(&["o", "task", "get", "t1"]).is_ok());
    assert!(parse(&["o", "task", "get", "--task-id", "7"]).is_ok());
    let err = parse(&["o", "task", "get"]).expect_err("needs one");
    assert_eq!(err.exit_code(), 2);
    let err = parse(&["o", "task", "get", "t1", "--task-id", "7"]).expect_err("not both");
    assert_eq!(err.exit_code(), 2);
}

#[test]
fn add_context_needs_something_to_change() {
    let parse = |args: &[&str]| Cli::try_parse_from(args.iter().copied());
    assert!(parse(&["o", "task", "add-context", "t", "--disable-tools", "a:b"]).is_ok());
    let err = parse(&["o", "task", "add-context", "t"]).expect_err("nothing to do");
    assert!(err.to_string().contains("--enable-tools"), "{err}");
}

#[test]
fn global_flags_work_after_the_subcommand_like_kubectl() {
    let cli = Cli::try_parse_from([
        "o",
        "task",
        "list",
        "-n",
        "team-a",
        "-o",
        "yaml",
        "--context",
        "kind",
    ])
    .expect("valid");
    assert_eq!(cli.global.namespace.as_deref(), Some("team-a"));
    assert_eq!(cli.global.output, Format::Yaml);
    assert_eq!(cli.global.context.as_deref(), Some("kind"));
}

fn task(args: &[&str]) -> Result<TaskCommand, clap::Error> {
    let cli = Cli::try_parse_from(["o", "task"].iter().chain(args).copied())?;
    match cli.command {
        Command::Task(t) => Ok(*t),
        other => panic!("not a task command: {other:?}"),
    }
}

#[test]
fn logs_default_to_the_agent_and_name_the_proxy_container() {
    let TaskCommand::Logs(a) = task(&["logs", "t"]).expect("valid") else {
        panic!("logs");
    };
    assert_eq!(a.container.container_name(), "agent");
    assert!(!a.follow);
    for c in ["proxy", "mcp-proxy"] {
        let TaskCommand::Logs(a) = task(&["logs", "t", "-f", "-c", c]).expect("valid") else {
            panic!("logs");
        };
        assert_eq!(a.container.container_name(), "mcp-proxy");
        assert!(a.follow);
    }
    assert!(task(&["logs", "t", "-c", "sidecar"]).is_err());
    assert!(task(&["logs", "t", "-f", "--previous"]).is_err());
}

#[test]
fn cancel_and_delete_take_a_task_and_wait() {
    let TaskCommand::Cancel(a) =
        task(&["cancel", "--task-id", "7", "--wait", "--timeout", "2m"]).expect("valid")
    else {
        panic!("cancel");
    };
    assert_eq!((a.task.task_id, a.wait), (Some(7), true));
    assert_eq!(a.timeout, Some(std::time::Duration::from_secs(120)));
    assert!(
        task(&["cancel", "t", "--timeout", "2m"]).is_err(),
        "--timeout needs --wait"
    );
    assert!(task(&["cancel"]).is_err(), "a task is needed");
    let TaskCommand::Delete(a) = task(&["delete", "t", "--wait"]).expect("valid") else {
        panic!("delete");
    };
    assert_eq!(a.task.name.as_deref(), Some("t"));
}

#[test]
fn approvals_take_one_task_or_all_namespaces() {
    let TaskCommand::Approvals(a) =
        task(&["approvals", "-A", "-w", "-l", "team=a"]).expect("valid")
    else {
        panic!("approvals");
    };
    assert!(a.all_namespaces && a.watch);
    assert_eq!(a.selector.as_deref(), Some("team=a"));
    assert!(task(&["approvals"]).is_err(), "a task or -A");
    assert!(task(&["approvals", "t", "-A"]).is_err(), "not both");
    assert!(
        task(&["approvals", "t", "--watch"]).is_err(),
        "--watch needs -A"
    );
    assert!(
        task(&["approvals", "-A", "--show", "x"]).is_err(),
        "--show names one task's call"
    );
    let TaskCommand::Approvals(a) =
        task(&["approvals", "--task-id", "3", "--pending"]).expect("valid")
    else {
        panic!("approvals");
    };
    assert_eq!(a.task().task_id, Some(3));
}

#[test]
fn submit_takes_a_proxy_mode_by_its_name_only() {
    let TaskCommand::Submit(args) = task(&[
        "submit",
        "--service",
        "s",
        "--tools",
        "git:*",
        "--prompt",
        "p",
        "--proxy-mode",
        "shared",
    ])
    .expect("valid") else {
        panic!("not submit");
    };
    assert_eq!(
        args.proxy_mode,
        Some(orchestrator_crds::shared::ProxyMode::Shared)
    );
    let err = task(&[
        "submit",
        "--service",
        "s",
        "--tools",
        "git:*",
        "--prompt",
        "p",
        "--proxy-mode",
        "central",
    ])
    .expect_err("unknown mode");
    assert!(err.to_string().contains("use sidecar or shared"), "{err}");
}
