//! What a runtime's render gives the agent container ([`Launch`]: its files in the task's
//! ConfigMap, its env, its `sh -c` script), and how a runtime's script is put together
//! ([`script`]): the shared prelude (`prelude.sh`: its own directory in `$TMPDIR`, the wait for
//! the shared proxy, the agent's credential, `run` which passes SIGTERM on), the runtime's run
//! part, and `orchestrator-agent result` (the agent images' helper, `crate::report`), which
//! writes the same TaskResult JSON for every runtime to the termination log and the final text
//! to stdout.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::EnvVar;
use orchestrator_crds::taskrun::Permissions;

use super::access::ProxyAccess;

/// The shared start of every runtime's script.
const PRELUDE: &str = include_str!("prelude.sh");
/// The agent images' helper that reads a runtime's output (`src/bin/orchestrator-agent.rs`).
pub const AGENT_HELPER: &str = "orchestrator-agent";

/// What the agent container gets from its runtime's render.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Launch {
    /// Files of the task's ConfigMap (mounted read-only at `/etc/orchestrator/tools`).
    pub files: BTreeMap<String, String>,
    /// The agent container's env for the runtime (before `spec.agent.env`, which replaces any
    /// of the same name).
    pub env: Vec<EnvVar>,
    /// The `sh -c` script, unless the runtime is `custom`.
    pub script: Option<String>,
}

/// What a runtime's files are rendered from.
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    /// `toolConfig.internalTools.permissions`.
    pub permissions: &'a Permissions,
    /// How the agent reaches its proxy.
    pub access: &'a ProxyAccess,
    /// The model the runtime asks for (`spec.agent.model`, else the runtime's default).
    pub model: Option<&'a str>,
    /// The task's proxy serves the model (a model credential is configured): every runtime but
    /// Claude Code and `custom` needs it.
    pub gateway: bool,
}

/// A runtime's script: the prelude, `run` (which runs the runtime and sets `$code`), then
/// `orchestrator-agent result --runtime RUNTIME` over its output (the final text to stdout, the
/// report to the termination log; without a result the output is logged as it was); the script
/// exits with the runtime's exit code. An image without the helper still logs the output, and
/// its report says what is missing.
pub fn script(run: &str, runtime: &str) -> String {
    let missing = serde_json::json!({
        "subtype": "error_no_result",
        "isError": true,
        "text": format!(
            "{AGENT_HELPER} is not in the agent image, so the output of the runtime could not be read \
             (it is in the log): run the agent image of this operator release, or copy \
             /usr/local/bin/{AGENT_HELPER} from it into your image"
        ),
    });
    format!(
        "{PRELUDE}{run}# The final text to stdout and the report to the termination log (the output as it was when it\n\
         # holds no result).\n\
         if command -v {AGENT_HELPER} >/dev/null; then\n  \
         {AGENT_HELPER} result --runtime {runtime} --exit-code \"$code\" --note \"$note\" --termination-log \"$tl\" \"$out\" || cat \"$out\"\n\
         else\n  cat \"$out\"\n  printf '%s' '{missing}' > \"$tl\"\nfi\n\
         rm -rf \"$work\"\nexit \"$code\"\n"
    )
}

/// A JSON file as the runtimes read it: pretty, with a final newline.
pub fn pretty(v: &impl serde::Serialize) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default() + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The report for an image without the helper is one single-quoted shell word.
    #[test]
    fn the_missing_helpers_report_is_one_shell_word() {
        let s = script("run x\n", "codex");
        let line = s
            .lines()
            .find(|l| l.contains("printf '%s'"))
            .expect("the printf");
        let word = line.split('\'').nth(3).expect("the quoted report");
        let v: serde_json::Value = serde_json::from_str(word).expect("JSON");
        assert_eq!(v["subtype"], "error_no_result");
    }
}
