//! The default agent: Claude Code, headless (`claude -p --output-format json`), with the proxy as
//! its only MCP server and the rendered permissions, the task text on stdin (no argument-length
//! limit), run by `sh -c` ([`DEFAULT_AGENT_SCRIPT`], the text of `agent.sh`).
//!
//! - `umask 002`: what the agent writes in the workspace stays writable for the servers given it
//!   (their own uids, the pod's fsGroup).
//! - The final text (Claude Code's `result`) goes to stdout, so `kubectl logs` and `task logs`
//!   show the answer; without a JSON result, whatever Claude Code printed.
//! - Its report (docs/api.md, "The agent's result") goes to `/dev/termination-log` (or the file
//!   `ORCHESTRATOR_TERMINATION_LOG` names: a run on a host gives each run its own) as one JSON
//!   object under 4096 bytes (the kubelet keeps the last 4096): `subtype`, `isError`, `turns`,
//!   the token counts, `costUsd`, `durationMs`, `sessionId`, and `text` clipped to what fits
//!   (`textTruncated`), never inside an escape or a UTF-8 sequence. Without a JSON result (Claude
//!   Code failed before it printed one), `subtype: error_no_result, isError: true`.
//! - Built with `awk` (POSIX; Debian's `mawk` in the agent image, which has no Node.js or
//!   Python), under `LC_ALL=C` so strings are bytes.
//! - Claude Code's JSON goes to a file of its own (`mktemp` in `$TMPDIR`), removed at the end:
//!   no fixed path that a run as another uid could own.
//! - The shell waits for Claude Code and passes on SIGTERM (a cancelled task's pod is stopped:
//!   a shell as a container's PID 1 would ignore it), and exits with Claude Code's exit code.

/// The agent container's `sh -c` script when the TaskRun names no command (see the module).
pub const DEFAULT_AGENT_SCRIPT: &str = include_str!("agent.sh");

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::process::{Command, Output};

    use orchestrator_crds::taskrun::result::{MESSAGE_BYTES, TaskResult};

    use super::DEFAULT_AGENT_SCRIPT;

    /// Claude Code 2.x's `--output-format json` result, as it prints it (one line).
    const SAMPLE: &str = r#"{"type":"result","subtype":"success","is_error":false,"duration_ms":5400,"duration_api_ms":5120,"num_turns":3,"result":"Done: opened PR #12.\nQuote: \"ok\" \\ tab\there; é ✓ 😀 \ud83d\ude00 esc\u001b.","session_id":"4f1c9d2e-8a6b-4c1e-9f3a-2b7d5e6a1c00","total_cost_usd":0.0123,"usage":{"input_tokens":1200,"cache_creation_input_tokens":310,"cache_read_input_tokens":4500,"output_tokens":45,"server_tool_use":{"web_search_requests":0},"service_tier":"standard"},"modelUsage":{"claude-sonnet-4-5":{"inputTokens":1200,"outputTokens":45,"costUSD":0.0123}},"permission_denials":[{"tool_name":"Bash","tool_use_id":"t1","tool_input":{"command":"rm -rf /"}}],"uuid":"9e0c"}"#;

    struct Run {
        stdout: String,
        message: String,
        code: Option<i32>,
    }

    /// Runs the script as the agent container does (`sh -c`), with a stand-in `claude` that
    /// prints `printed` and exits with `exit`, and the termination log in a scratch directory.
    fn run(printed: &str, exit: i32) -> Run {
        let dir = scratch();
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).expect("bin dir");
        std::fs::write(dir.join("printed"), printed).expect("the output");
        let fake = bin.join("claude");
        std::fs::write(
            &fake,
            format!(
                "#!/bin/sh\ncat > {0}/stdin\ncat {0}/printed\nexit {exit}\n",
                dir.display()
            ),
        )
        .expect("the stand-in");
        chmod_x(&fake);
        for f in ["task.md", "mcp.json", "settings.json"] {
            std::fs::write(dir.join(f), "# the task").expect("an input");
        }
        let log = dir.join("termination-log");
        let tmp = dir.join("tmp");
        std::fs::create_dir_all(&tmp).expect("tmp dir");
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let Output { stdout, status, .. } = Command::new("sh")
            .args(["-c", DEFAULT_AGENT_SCRIPT])
            .env("PATH", path)
            .env("TMPDIR", &tmp)
            .env("ORCHESTRATOR_TERMINATION_LOG", &log)
            .env("ORCHESTRATOR_TASK_FILE", dir.join("task.md"))
            .env("ORCHESTRATOR_MCP_CONFIG", dir.join("mcp.json"))
            .env("ORCHESTRATOR_SETTINGS", dir.join("settings.json"))
            .output()
            .expect("sh runs");
        assert_eq!(
            std::fs::read_to_string(dir.join("stdin")).ok().as_deref(),
            Some("# the task"),
            "the task is on stdin"
        );
        let message = std::fs::read_to_string(&log).unwrap_or_default();
        let left: Vec<_> = std::fs::read_dir(&tmp)
            .expect("tmp dir")
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .expect("tmp entries");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            left.is_empty(),
            "the script leaves nothing in $TMPDIR: {left:?}"
        );
        Run {
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            message,
            code: status.code(),
        }
    }

    #[test]
    fn sigterm_reaches_claude_code_and_the_shell_exits_with_its_code() {
        let dir = scratch();
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).expect("bin dir");
        // A stand-in that runs until it is told to stop (10 s at most), and says it was.
        let fake = bin.join("claude");
        std::fs::write(
            &fake,
            format!(
                "#!/bin/sh\ntrap 'echo stopped > {0}/told; exit 143' TERM\n\
                 echo $$ > {0}/started\ni=0; while [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done\n",
                dir.display()
            ),
        )
        .expect("the stand-in");
        chmod_x(&fake);
        std::fs::write(dir.join("task.md"), "# the task").expect("the task");
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut shell = Command::new("sh")
            .args(["-c", DEFAULT_AGENT_SCRIPT])
            .env("PATH", path)
            .env("TMPDIR", &dir)
            .env("ORCHESTRATOR_TERMINATION_LOG", dir.join("log"))
            .env("ORCHESTRATOR_TASK_FILE", dir.join("task.md"))
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("sh runs");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !dir.join("started").exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "the stand-in never started"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let killed = Command::new("kill")
            .args(["-TERM", &shell.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(killed.success());
        let status = shell.wait().expect("sh ends");
        let told = std::fs::read_to_string(dir.join("told")).unwrap_or_default();
        let message = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(told.trim(), "stopped", "the shell passed SIGTERM on");
        assert_eq!(status.code(), Some(143), "{status:?}");
        let r = result(&message);
        assert_eq!(r.subtype.as_deref(), Some("error_no_result"));
    }

    fn scratch() -> PathBuf {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "orch-agent-script-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn chmod_x(path: &Path) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }

    fn result(message: &str) -> TaskResult {
        assert!(message.len() < MESSAGE_BYTES, "{} bytes", message.len());
        TaskResult::from_termination_message(message)
            .unwrap_or_else(|e| panic!("a result: {e}: {message}"))
            .unwrap_or_else(|| panic!("not empty: {message}"))
    }

    #[test]
    fn claude_codes_json_result_becomes_the_answer_on_stdout_and_the_report() {
        let run = run(SAMPLE, 0);
        let text = "Done: opened PR #12.\nQuote: \"ok\" \\ tab\there; é ✓ 😀 😀 esc\u{1b}.";
        assert_eq!(run.stdout, format!("{text}\n"));
        assert_eq!(run.code, Some(0));
        let r = result(&run.message);
        assert_eq!(r.text.as_deref(), Some(text));
        assert_eq!(
            (r.subtype.as_deref(), r.is_error, r.text_truncated),
            (Some("success"), Some(false), false)
        );
        assert_eq!(
            (
                r.turns,
                r.input_tokens,
                r.output_tokens,
                r.cache_read_input_tokens,
                r.cache_creation_input_tokens
            ),
            (Some(3), Some(1200), Some(45), Some(4500), Some(310))
        );
        assert_eq!(r.cost_usd.as_deref(), Some("0.0123"));
        assert_eq!(r.duration_ms, Some(5400));
        assert_eq!(
            r.session_id.as_deref(),
            Some("4f1c9d2e-8a6b-4c1e-9f3a-2b7d5e6a1c00")
        );
    }

    #[test]
    fn a_failed_run_keeps_its_exit_code_and_a_long_answer_is_clipped_to_fit() {
        // Multi-byte characters and escapes across the cut: the message stays valid JSON.
        let long = "é✓\\n\\\"😀\\u001b".repeat(2000);
        let printed = format!(
            r#"{{"type":"result","subtype":"error_max_turns","is_error":true,"num_turns":50,"result":"{long}","session_id":"s"}}"#
        );
        let run = run(&printed, 1);
        assert_eq!(run.code, Some(1));
        let r = result(&run.message);
        assert_eq!(
            (r.subtype.as_deref(), r.is_error, r.turns),
            (Some("error_max_turns"), Some(true), Some(50))
        );
        assert!(r.text_truncated);
        let text = r.text.unwrap_or_default();
        assert!(text.starts_with("é✓\n\"😀\u{1b}é"), "{text:.40}");
        assert!(
            text.len() > 2000,
            "the answer fills what fits: {}",
            text.len()
        );
        assert!(
            run.stdout.len() > 20_000,
            "the log has all of it: {}",
            run.stdout.len()
        );
    }

    #[test]
    fn output_that_is_no_json_result_is_logged_and_reported_as_an_error() {
        for (printed, code) in [
            ("Error: Invalid API key · Please run /login\n", 1),
            ("", 137),
            (r#"{"result": "unterminated"#, 1),
            ("[1, 2, 3]", 0),
            (r#"{"a":1} trailing"#, 0),
        ] {
            let run = run(printed, code);
            assert_eq!(run.code, Some(code), "{printed}");
            assert_eq!(
                run.stdout.trim_end(),
                printed.trim_end(),
                "the output is logged as it was"
            );
            let r = result(&run.message);
            assert_eq!(
                (r.subtype.as_deref(), r.is_error),
                (Some("error_no_result"), Some(true)),
                "{printed}"
            );
            let text = r.text.unwrap_or_default();
            assert!(
                text.contains(&format!("exited with code {code} without a JSON result")),
                "{text}"
            );
        }
    }
}
