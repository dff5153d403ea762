//! How the binary was started: as `orchestrator-cli`, or as the kubectl plugin
//! `kubectl-orchestrator` (kubectl runs `kubectl-orchestrator` from PATH for `kubectl
//! orchestrator ...`), which then names itself `kubectl orchestrator` in its usage, help and
//! examples; and shell completion through the environment (`COMPLETE=bash orchestrator-cli`,
//! clap_complete's dynamic completion: task names and approval ids come from the cluster, see
//! [`crate::complete`]), or, for `kubectl orchestrator <TAB>`, through kubectl's plugin
//! completion (`kubectl_complete-orchestrator __complete ...`, a link to this binary).

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

/// What kubectl (1.26+) runs to complete a plugin's arguments: `kubectl_complete-orchestrator
/// ARGS... CURRENT` (the words after `kubectl orchestrator`), answered in Cobra's protocol.
pub const KUBECTL_COMPLETER_FILE: &str = "kubectl_complete-orchestrator";

/// Cobra's `ShellCompDirectiveNoFileComp`: offer no file names besides the candidates.
const NO_FILE_COMPLETION: u8 = 4;

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
    let stem = argv0
        .as_ref()
        .and_then(|a| Path::new(a).file_stem())
        .and_then(|s| s.to_str());
    if stem == Some(KUBECTL_COMPLETER_FILE) {
        let mut args: Vec<OsString> = std::env::args_os().skip(1).collect();
        if args.first().is_some_and(|a| a == "__complete") {
            args.remove(0);
        }
        print!("{}", kubectl_complete(args));
        std::process::exit(0);
    }
    let name = display_name(argv0.as_ref());
    clap_complete::CompleteEnv::with_factory(move || command(name)).complete();
    let matches = command(name).get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.format(&mut command(name)).exit())
}

/// The answer to `kubectl_complete-orchestrator WORDS... CURRENT` in Cobra's protocol: one `candidate<TAB>help` a line, then `:4` (no file names).
pub fn kubectl_complete(words: Vec<OsString>) -> String {
    let mut args = vec![OsString::from(BIN_NAME)];
    args.extend(words);
    if args.len() == 1 {
        args.push(OsString::new());
    }
    let index = args.len() - 1;
    let mut cmd = command(PLUGIN_NAME);
    let current = std::env::current_dir().ok();
    let candidates = clap_complete::engine::complete(&mut cmd, args, index, current.as_deref())
        .unwrap_or_default();
    let mut out = String::new();
    for c in candidates.iter().filter(|c| !c.is_hide_set()) {
        out.push_str(&c.get_value().to_string_lossy());
        if let Some(help) = c.get_help() {
            let help = help.to_string();
            out.push('\t');
            out.push_str(help.lines().next().unwrap_or_default());
        }
        out.push('\n');
    }
    out.push_str(&format!(":{NO_FILE_COMPLETION}\n"));
    out
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

    #[test]
    fn kubectl_completion_gets_cobras_protocol() {
        let words = ["task", "ap"].map(OsString::from).to_vec();
        let out = kubectl_complete(words);
        assert!(out.ends_with("\n:4\n"), "{out}");
        assert!(out.lines().any(|l| l.starts_with("approvals\t")), "{out}");
        assert!(out.lines().any(|l| l.starts_with("approve\t")), "{out}");
        assert!(!out.lines().any(|l| l.starts_with("audit")), "{out}");
    }
}
