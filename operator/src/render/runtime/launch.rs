//! What a runtime's render gives the agent container ([`Launch`]: its files in the task's
//! ConfigMap, its env, its `sh -c` script), and how a runtime's script is put together
//! ([`script`]): the shared prelude (`prelude.sh`: its own directory in `$TMPDIR`, the wait for
//! the shared proxy, the agent's credential, `run` which passes SIGTERM on), the runtime's run
//! part, and its result reducer (`json.awk`, then the runtime's `.awk`), which writes the same
//! TaskResult JSON for every runtime to the termination log and the final text to stdout.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::EnvVar;
use orchestrator_crds::taskrun::Permissions;

use super::access::ProxyAccess;

/// The shared start of every runtime's script.
const PRELUDE: &str = include_str!("prelude.sh");
/// The JSON reader and report writer of every reducer.
const JSON_AWK: &str = include_str!("json.awk");

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
/// `reducer` over its output; the script exits with the runtime's exit code.
pub fn script(run: &str, reducer: &str) -> String {
    format!(
        "{PRELUDE}{run}LC_ALL=C awk -v code=\"$code\" -v tl=\"$tl\" -v note=\"$note\" '\n{JSON_AWK}{reducer}' \"$out\" || cat \"$out\"\nrm -rf \"$work\"\nexit \"$code\"\n"
    )
}

/// A JSON file as the runtimes read it: pretty, with a final newline.
pub fn pretty(v: &impl serde::Serialize) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default() + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The awk program is one single-quoted shell word: a `'` inside would end it.
    #[test]
    fn no_awk_program_has_a_single_quote() {
        for (name, awk) in [
            ("json.awk", JSON_AWK),
            ("claude_code.awk", include_str!("claude_code.awk")),
            ("codex.awk", include_str!("codex.awk")),
            ("gemini.awk", include_str!("gemini.awk")),
            ("opencode.awk", include_str!("opencode.awk")),
        ] {
            assert!(!awk.contains('\''), "{name}");
        }
    }
}
