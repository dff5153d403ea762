//! How the binary was started: as `orchestrator-cli`, or as the kubectl plugin
//! `kubectl-orchestrator` (kubectl runs `kubectl-orchestrator` from PATH for `kubectl
//! orchestrator ...`), which then names itself `kubectl orchestrator` in its usage, help and
//! examples; and shell completion through the environment (`COMPLETE=bash orchestrator-cli`,
//! clap_complete's dynamic completion: task names and approval ids come from the cluster, see
//! [`crate::complete`]).

use std::ffi::OsString;
use std::path::Path;

use clap::{CommandFactory, FromArgMatches};

use crate::args::Cli;

/// The plugin's file name: kubectl finds it on PATH as `kubectl-<plugin>`.
pub const PLUGIN_FILE: &str = "kubectl-orchestrator";

/// How the plugin is typed.
pub const PLUGIN_NAME: &str = "kubectl orchestrator";

/// The binary's own name.
pub const BIN_NAME: &str = "orchestrator-cli";

/// The name to show for a program started as `argv0`: `kubectl orchestrator` for the plugin
/// (`kubectl-orchestrator`, also with `.exe`), else `orchestrator-cli`.
pub fn display_name(argv0: Option<&OsString>) -> &'static str {
    let file = argv0
        .and_then(|a| Path::new(a).file_stem())
        .and_then(|s| s.to_str());
    if file == Some(PLUGIN_FILE) {
        PLUGIN_NAME
    } else {
        BIN_NAME
    }
}

/// The command line definition, named `name` everywhere it names itself (usage, examples).
pub fn command(name: &str) -> clap::Command {
    let cmd = Cli::command();
    if name == BIN_NAME {
        return cmd;
    }
    rename(cmd, name).bin_name(name).display_name(name)
}

/// `orchestrator-cli` in the help texts of `cmd` and its subcommands becomes `name`.
fn rename(mut cmd: clap::Command, name: &str) -> clap::Command {
    let swap = |s: String| s.replace("orchestrator-cli ", &format!("{name} "));
    if let Some(text) = cmd.get_after_help().map(|t| swap(t.to_string())) {
        cmd = cmd.after_help(text);
    }
    if let Some(text) = cmd.get_long_about().map(|t| swap(t.to_string())) {
        cmd = cmd.long_about(text);
    }
    if let Some(text) = cmd.get_about().map(|t| swap(t.to_string())) {
        cmd = cmd.about(text);
    }
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    for sub in names {
        cmd = cmd.mut_subcommand(sub, |s| rename(s, name));
    }
    cmd
}

/// Parses the process's command line (answering a shell's completion request first, when
/// `COMPLETE` is set, and exiting); a bad one prints clap's error and exits 2.
pub fn parse() -> Cli {
    let argv0 = std::env::args_os().next();
    let name = display_name(argv0.as_ref());
    clap_complete::CompleteEnv::with_factory(move || command(name)).complete();
    let matches = command(name).get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.format(&mut command(name)).exit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plugin_names_itself_as_kubectl_runs_it() {
        let plugin = OsString::from("/usr/local/bin/kubectl-orchestrator");
        assert_eq!(display_name(Some(&plugin)), "kubectl orchestrator");
        let exe = OsString::from("/opt/bin/kubectl-orchestrator.exe");
        assert_eq!(display_name(Some(&exe)), "kubectl orchestrator");
        let own = OsString::from("target/debug/orchestrator-cli");
        assert_eq!(display_name(Some(&own)), "orchestrator-cli");
        assert_eq!(display_name(None), "orchestrator-cli");

        let mut cmd = command(PLUGIN_NAME);
        let usage = cmd.render_usage().to_string();
        assert!(usage.contains("kubectl orchestrator"), "{usage}");
        let mut list = cmd
            .find_subcommand_mut("task")
            .and_then(|t| t.find_subcommand_mut("list"))
            .expect("task list")
            .clone();
        let help = list.render_long_help().to_string();
        assert!(
            help.contains("kubectl orchestrator task list --phase Running"),
            "{help}"
        );
        assert!(!help.contains("orchestrator-cli "), "{help}");
    }
}
