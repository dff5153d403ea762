//! Each runtime's default script, run as the agent container runs it (`sh -c`) with the agent
//! images' helper (`orchestrator-agent`, this package's binary) on the PATH, against a stand-in
//! for the CLI that records what it was given (its arguments, stdin, environment, the
//! files of its private homes) and prints what the real CLI prints (`testdata/`: the outputs of
//! `@openai/codex` 0.171.0, `@google/gemini-cli` 0.61.0 and `opencode-ai` 1.18.33 in the runs of
//! docs/design/agent-runtimes.md), or hostile output. Checked: the final text on stdout, the
//! TaskResult in the termination log (under 4096 bytes, as the operator parses it), the exit
//! code, nothing left in `$TMPDIR`, SIGTERM passed on.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use orchestrator_crds::taskrun::result::{MESSAGE_BYTES, TaskResult};

use orchestrator_operator::render::runtime::{claude_code, codex, gemini, opencode};

/// The agent images' helper, as the image has it (`/usr/local/bin/orchestrator-agent`).
const HELPER: &str = env!("CARGO_BIN_EXE_orchestrator-agent");

/// One runtime as its script runs it.
#[derive(Clone, Copy, Debug)]
struct Runtime {
    /// The CLI the script runs.
    binary: &'static str,
    script: fn() -> String,
    /// Its config files, by the env var the script reads their paths from.
    files: &'static [&'static str],
}

const CLAUDE: Runtime = Runtime {
    binary: "claude",
    script: claude_code::default_script,
    files: &["ORCHESTRATOR_MCP_CONFIG", "ORCHESTRATOR_SETTINGS"],
};
const CODEX: Runtime = Runtime {
    binary: "codex",
    script: codex::default_script,
    files: &["ORCHESTRATOR_CODEX_CONFIG"],
};
const GEMINI: Runtime = Runtime {
    binary: "gemini",
    script: gemini::default_script,
    files: &["ORCHESTRATOR_GEMINI_SETTINGS", "ORCHESTRATOR_GEMINI_POLICY"],
};
const OPENCODE: Runtime = Runtime {
    binary: "opencode",
    script: opencode::default_script,
    files: &["ORCHESTRATOR_OPENCODE_CONFIG"],
};
const ALL: [Runtime; 4] = [CLAUDE, CODEX, GEMINI, OPENCODE];

/// The agent's credential, in the token file.
const TOKEN: &str = "agent-token-123";

struct Run {
    stdout: String,
    message: String,
    code: Option<i32>,
    /// What the stand-in recorded: `args`, `stdin`, `env` (selected variables), `home` (the
    /// files of its private home); empty when it did not run.
    args: Vec<String>,
    stdin: String,
    env: String,
    home: String,
}

/// A scratch directory with a stand-in for `rt` that prints `printed` and exits with `exit`;
/// `helper`: a credential helper script (sidecar mode), else the token file is read as it is.
fn setup(rt: Runtime, printed: &str, exit: i32, helper: Option<&str>) -> (PathBuf, Command) {
    let dir = scratch();
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    std::fs::create_dir_all(dir.join("tmp")).expect("tmp dir");
    std::fs::write(dir.join("printed"), printed).expect("the output");
    let d = dir.display();
    std::fs::write(
        bin.join(rt.binary),
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done > {d}/args\ncat > {d}/stdin\n\
             env | grep -E '^(ORCHESTRATOR_MCP_TOKEN|GEMINI_API_KEY|GEMINI_CLI_|CODEX_HOME|OPENCODE_|XDG_)' | sort > {d}/env\n\
             for h in \"$CODEX_HOME\" \"$GEMINI_CLI_HOME\"; do [ -n \"$h\" ] && ls -A \"$h\"; done > {d}/home 2>&1\n\
             [ -n \"$CODEX_HOME\" ] && cat \"$CODEX_HOME/config.toml\" >> {d}/home\n\
             cat {d}/printed\nexit {exit}\n"
        ),
    )
    .expect("the stand-in");
    chmod_x(&bin.join(rt.binary));
    std::fs::write(dir.join("task.md"), "# the task").expect("the task");
    std::fs::write(dir.join("token"), TOKEN).expect("the token");
    std::os::unix::fs::symlink(HELPER, bin.join("orchestrator-agent")).expect("the helper");
    let mut command = Command::new("sh");
    command
        .args(["-c", &(rt.script)()])
        .env(
            "PATH",
            format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .env("TMPDIR", dir.join("tmp"))
        .env("ORCHESTRATOR_TERMINATION_LOG", dir.join("termination-log"))
        .env("ORCHESTRATOR_TASK_FILE", dir.join("task.md"))
        .env("ORCHESTRATOR_MCP_TOKEN_FILE", dir.join("token"))
        .env("ORCHESTRATOR_MODEL", "model-x")
        .env_remove("ORCHESTRATOR_CREDENTIAL_HELPER")
        .env_remove("ORCHESTRATOR_PROXY_MODE");
    for var in rt.files {
        let file = dir.join(var.to_lowercase());
        std::fs::write(&file, format!("config of {var}\n")).expect("a config");
        command.env(var, file);
    }
    if rt.binary == GEMINI.binary {
        // The image's system settings (`/etc/gemini-cli/settings.json` in a pod): the same as
        // the ConfigMap's.
        let system = dir.join("system-settings.json");
        std::fs::write(&system, "config of ORCHESTRATOR_GEMINI_SETTINGS\n").expect("settings");
        command.env("GEMINI_CLI_SYSTEM_SETTINGS_PATH", system);
    }
    if let Some(helper) = helper {
        std::fs::write(dir.join("helper.sh"), helper).expect("the helper");
        command.env("ORCHESTRATOR_CREDENTIAL_HELPER", dir.join("helper.sh"));
    }
    (dir, command)
}

fn run_with(rt: Runtime, printed: &str, exit: i32, helper: Option<&str>) -> Run {
    let (dir, mut command) = setup(rt, printed, exit, helper);
    let Output { stdout, status, .. } = command.output().expect("sh runs");
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    let left: Vec<_> = std::fs::read_dir(dir.join("tmp"))
        .expect("tmp dir")
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .expect("tmp entries");
    let run = Run {
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        message: read("termination-log"),
        code: status.code(),
        args: read("args").lines().map(str::to_string).collect(),
        stdin: read("stdin"),
        env: read("env"),
        home: read("home"),
    };
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        left.is_empty(),
        "the script leaves nothing in $TMPDIR: {left:?}"
    );
    run
}

fn output(rt: Runtime, printed: &str, exit: i32) -> Run {
    run_with(rt, printed, exit, None)
}

fn scratch() -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "orch-runtime-script-{}-{}",
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

fn counts(r: &TaskResult) -> [Option<i64>; 5] {
    [
        r.turns,
        r.input_tokens,
        r.output_tokens,
        r.cache_read_input_tokens,
        r.cache_creation_input_tokens,
    ]
}

/// Claude Code 2.x's `--output-format json` result, as it prints it (one line).
const CLAUDE_SAMPLE: &str = r#"{"type":"result","subtype":"success","is_error":false,"duration_ms":5400,"duration_api_ms":5120,"num_turns":3,"result":"Done: opened PR #12.\nQuote: \"ok\" \\ tab\there; é ✓ 😀 \ud83d\ude00 esc\u001b.","session_id":"4f1c9d2e-8a6b-4c1e-9f3a-2b7d5e6a1c00","total_cost_usd":0.0123,"usage":{"input_tokens":1200,"cache_creation_input_tokens":310,"cache_read_input_tokens":4500,"output_tokens":45,"server_tool_use":{"web_search_requests":0},"service_tier":"standard"},"modelUsage":{"claude-sonnet-4-5":{"inputTokens":1200,"outputTokens":45,"costUSD":0.0123}},"permission_denials":[{"tool_name":"Bash","tool_use_id":"t1","tool_input":{"command":"rm -rf /"}}],"uuid":"9e0c"}"#;
/// The decoded `result` of [`CLAUDE_SAMPLE`].
const CLAUDE_TEXT: &str = "Done: opened PR #12.\nQuote: \"ok\" \\ tab\there; é ✓ 😀 😀 esc\u{1b}.";

#[test]
fn claude_codes_json_result_becomes_the_answer_on_stdout_and_the_report() {
    let run = output(CLAUDE, CLAUDE_SAMPLE, 0);
    assert_eq!(run.stdout, format!("{CLAUDE_TEXT}\n"));
    assert_eq!(run.code, Some(0));
    assert_eq!(run.stdin, "# the task", "the task is on stdin");
    assert_eq!(
        &run.args[..4],
        ["-p", "--output-format", "json", "--strict-mcp-config"]
    );
    let r = result(&run.message);
    assert_eq!(r.text.as_deref(), Some(CLAUDE_TEXT));
    assert_eq!(
        (r.subtype.as_deref(), r.is_error, r.text_truncated),
        (Some("success"), Some(false), false)
    );
    assert_eq!(
        counts(&r),
        [Some(3), Some(1200), Some(45), Some(4500), Some(310)]
    );
    assert_eq!(r.cost_usd.as_deref(), Some("0.0123"));
    assert_eq!(r.duration_ms, Some(5400));
    assert_eq!(
        r.session_id.as_deref(),
        Some("4f1c9d2e-8a6b-4c1e-9f3a-2b7d5e6a1c00")
    );
}

#[test]
fn codex_exec_gets_the_task_on_stdin_a_private_home_and_the_token_and_its_events_become_the_report()
{
    let printed = format!(
        "{}{}\n{}\n",
        include_str!("../src/render/runtime/testdata/codex.jsonl")
            .replace("\"FINAL ANSWER\"", r#""first \"answer\"""#),
        r#"{"type":"item.completed","item":{"id":"item_1","type":"mcp_tool_call","server":"orchestrator","tool":"echo","arguments":{"text":"hi"},"status":"completed"}}"#,
        r#"{"type":"item.completed","item":{"id":"item_2","type":"agent_message","text":"Done ✓\nline two"}}
{"type":"turn.completed","usage":{"input_tokens":50,"cached_input_tokens":10,"cache_write_input_tokens":5,"output_tokens":3,"reasoning_output_tokens":0}}"#
    );
    let run = output(CODEX, &printed, 0);
    assert_eq!(run.code, Some(0));
    assert_eq!(run.stdout, "Done ✓\nline two\n", "the last agent message");
    assert_eq!(run.stdin, "# the task");
    assert_eq!(
        run.args,
        [
            "exec",
            "--json",
            "--ephemeral",
            "--skip-git-repo-check",
            "--enable",
            "mcp_tool_list_changed",
            "-m",
            "model-x",
            "-"
        ]
    );
    // Its CODEX_HOME holds the rendered config and nothing else (under $TMPDIR, removed).
    assert_eq!(
        run.home,
        "config.toml\nconfig of ORCHESTRATOR_CODEX_CONFIG\n"
    );
    assert!(
        run.env
            .contains(&format!("ORCHESTRATOR_MCP_TOKEN={TOKEN}\n")),
        "{}",
        run.env
    );
    let r = result(&run.message);
    assert_eq!(
        (r.subtype.as_deref(), r.is_error),
        (Some("success"), Some(false))
    );
    // Two turns: input 100 + 50 of which 20 + 10 cached.
    assert_eq!(
        counts(&r),
        [Some(2), Some(120), Some(10), Some(30), Some(5)]
    );
    assert_eq!(r.cost_usd, None, "Codex reports no cost");
    assert_eq!(
        r.session_id.as_deref(),
        Some("01a229f4-cc97-79d3-94b5-c0d078ad420c")
    );
}

#[test]
fn a_failed_codex_turn_is_an_error_with_its_message() {
    let printed = r#"{"type":"thread.started","thread_id":"t"}
{"type":"turn.started"}
{"type":"error","message":"Reconnecting... 1/5"}
{"type":"turn.failed","error":{"message":"stream disconnected: budget exceeded: outputTokens would be 210 of 200"}}"#;
    let run = output(CODEX, printed, 1);
    assert_eq!(run.code, Some(1));
    let r = result(&run.message);
    assert_eq!(
        (r.subtype.as_deref(), r.is_error, r.turns),
        (Some("error_during_execution"), Some(true), Some(1))
    );
    assert_eq!(
        r.text.as_deref(),
        Some("stream disconnected: budget exceeded: outputTokens would be 210 of 200")
    );
}

#[test]
fn gemini_gets_the_policy_the_model_and_the_key_and_its_json_becomes_the_report() {
    let run = output(
        GEMINI,
        include_str!("../src/render/runtime/testdata/gemini.json"),
        0,
    );
    assert_eq!(run.code, Some(0));
    assert_eq!(run.stdout, "FINAL ANSWER\n");
    assert_eq!(run.stdin, "# the task");
    assert_eq!(run.args[0], "-p");
    assert_eq!(
        &run.args[2..7],
        ["-m", "model-x", "-o", "json", "--admin-policy"]
    );
    assert!(
        run.args[7].ends_with("orchestrator_gemini_policy"),
        "{:?}",
        run.args
    );
    for var in [
        format!("GEMINI_API_KEY={TOKEN}"),
        format!("ORCHESTRATOR_MCP_TOKEN={TOKEN}"),
        "GEMINI_CLI_SYSTEM_SETTINGS_PATH=".to_string(),
        "GEMINI_CLI_HOME=".to_string(),
        "GEMINI_CLI_NO_RELAUNCH=true".to_string(),
    ] {
        assert!(run.env.contains(&var), "{var} in {}", run.env);
    }
    assert_eq!(run.home, "", "its GEMINI_CLI_HOME starts empty");
    let r = result(&run.message);
    assert_eq!(
        (r.subtype.as_deref(), r.is_error),
        (Some("success"), Some(false))
    );
    // The main role's 3 requests; the tokens of the model (main and router together).
    assert_eq!(counts(&r), [Some(3), Some(640), Some(56), Some(160), None]);
    assert_eq!(
        r.session_id.as_deref(),
        Some("44da2926-5705-445b-8f24-930a9b4b9550")
    );
}

/// Gemini CLI reads system settings only from root's directories, so in a pod they are the
/// image's: an image whose settings are not the operator's (another release's, or none) is
/// refused before Gemini CLI runs, naming both files and the fix.
#[test]
fn gemini_does_not_start_with_system_settings_that_are_not_the_operators() {
    for image_settings in [Some("{\"mcpServers\": {\"elsewhere\": {}}}\n"), None] {
        let (dir, mut command) = setup(
            GEMINI,
            include_str!("../src/render/runtime/testdata/gemini.json"),
            0,
            None,
        );
        let system = dir.join("system-settings.json");
        match image_settings {
            Some(text) => std::fs::write(&system, text).expect("settings"),
            None => std::fs::remove_file(&system).expect("no settings"),
        }
        let Output { status, .. } = command.output().expect("sh runs");
        let message = std::fs::read_to_string(dir.join("termination-log")).unwrap_or_default();
        let ran = dir.join("args").exists();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(status.code(), Some(1), "{image_settings:?}");
        assert!(!ran, "Gemini CLI did not run: {image_settings:?}");
        let r = result(&message);
        let text = r.text.unwrap_or_default();
        assert!(
            text.contains("system-settings.json is missing or not the operator's")
                && text.contains("orchestrator_gemini_settings")
                && text.contains("agent-gemini image"),
            "{text}"
        );
        assert_eq!(r.is_error, Some(true));
    }
}

#[test]
fn gemini_errors_and_its_turn_limit_are_errors() {
    let printed = r#"{"session_id":"s","error":{"type":"FatalAuthenticationError","message":"API key not valid","code":41}}"#;
    let run = output(GEMINI, printed, 1);
    let r = result(&run.message);
    assert_eq!(
        (r.subtype.as_deref(), r.is_error, r.text.as_deref()),
        (
            Some("error_during_execution"),
            Some(true),
            Some("API key not valid")
        )
    );
    let printed = r#"{"session_id":"s","response":"partial","stats":{"models":{"a":{"tokens":{"input":5,"candidates":1,"thoughts":2,"cached":0},"roles":{"main":{"totalRequests":50}}},"b":{"tokens":{"input":7,"candidates":3}}}}}"#;
    let run = output(GEMINI, printed, 53);
    assert_eq!(run.code, Some(53));
    let r = result(&run.message);
    assert_eq!(
        (r.subtype.as_deref(), r.is_error, r.turns),
        (Some("error_max_turns"), Some(true), Some(50))
    );
    assert_eq!((r.input_tokens, r.output_tokens), (Some(12), Some(6)));
}

#[test]
fn opencode_gets_its_config_and_private_dirs_and_its_events_become_the_report() {
    let run = output(
        OPENCODE,
        include_str!("../src/render/runtime/testdata/opencode.jsonl"),
        0,
    );
    assert_eq!(run.code, Some(0));
    assert_eq!(run.stdout, "FINAL ANSWER\n");
    assert_eq!(
        &run.args[..5],
        ["run", "--format", "json", "-m", "anthropic/model-x"]
    );
    assert_eq!(run.args[5], "-f");
    assert!(run.args[6].ends_with("task.md"), "{:?}", run.args);
    assert_eq!(
        run.args[7..],
        ["--", "Carry out the task in the attached file."]
    );
    for var in [
        format!("ORCHESTRATOR_MCP_TOKEN={TOKEN}"),
        "OPENCODE_CONFIG=".into(),
        "OPENCODE_DISABLE_PROJECT_CONFIG=1".into(),
        "OPENCODE_DISABLE_CLAUDE_CODE=1".into(),
        "OPENCODE_DISABLE_DEFAULT_PLUGINS=1".into(),
        "OPENCODE_DISABLE_MODELS_FETCH=1".into(),
        "OPENCODE_DISABLE_AUTOUPDATE=1".into(),
        "OPENCODE_DISABLE_EXTERNAL_SKILLS=1".into(),
        "OPENCODE_DISABLE_LSP_DOWNLOAD=1".into(),
        "OPENCODE_DISABLE_SHARE=1".into(),
        "XDG_CONFIG_HOME=".into(),
        "XDG_DATA_HOME=".into(),
    ] {
        assert!(run.env.contains(&var), "{var} in {}", run.env);
    }
    let r = result(&run.message);
    assert_eq!(
        (r.subtype.as_deref(), r.is_error),
        (Some("success"), Some(false))
    );
    // Three steps of 100 input and 7 output tokens, 0.000405 USD each.
    assert_eq!(counts(&r), [Some(3), Some(300), Some(21), Some(0), Some(0)]);
    assert_eq!(r.cost_usd.as_deref(), Some("0.001215"));
    assert_eq!(r.duration_ms, None);
    assert_eq!(
        r.session_id.as_deref(),
        Some("ses_dd60901d9ffe6G2fFOhMPJ16qp")
    );
}

#[test]
fn an_opencode_error_event_is_an_error_with_its_message() {
    let printed = r#"{"type":"step_start","timestamp":1,"sessionID":"s","part":{}}
{"type":"error","timestamp":2,"sessionID":"s","error":{"name":"APIError","data":{"message":"model \"claude-haiku\" is not allowed for this task"}}}"#;
    let run = output(OPENCODE, printed, 1);
    let r = result(&run.message);
    assert_eq!(
        (r.subtype.as_deref(), r.is_error),
        (Some("error_during_execution"), Some(true))
    );
    assert_eq!(
        r.text.as_deref(),
        Some("model \"claude-haiku\" is not allowed for this task")
    );
}

/// What the stand-in prints, and the text each runtime's report leads with.
fn answer(rt: &str, text: &str) -> String {
    let quoted = serde_json::to_string(text).unwrap_or_default();
    match rt {
        "claude" => format!(
            r#"{{"type":"result","subtype":"success","is_error":false,"num_turns":1,"result":{quoted}}}"#
        ),
        "codex" => format!(
            "{{\"type\":\"item.completed\",\"item\":{{\"type\":\"agent_message\",\"text\":{quoted}}}}}\n{{\"type\":\"turn.completed\",\"usage\":{{}}}}\n"
        ),
        "gemini" => format!(r#"{{"session_id":"s","response":{quoted},"stats":{{}}}}"#),
        _ => format!(
            "{{\"type\":\"text\",\"part\":{{\"text\":{quoted}}}}}\n{{\"type\":\"step_finish\",\"part\":{{\"tokens\":{{}}}}}}\n"
        ),
    }
}

#[test]
fn a_long_answer_is_clipped_to_fit_never_inside_an_escape_or_a_character() {
    // Multi-byte characters and escapes across the cut: the message stays valid JSON.
    let long = "é✓\n\"😀\u{1b}".repeat(2000);
    for rt in ALL {
        let run = output(rt, &answer(rt.binary, &long), 1);
        assert_eq!(run.code, Some(1), "{}", rt.binary);
        let r = result(&run.message);
        assert!(r.text_truncated, "{}", rt.binary);
        // Claude Code says whether it failed; the others' exit code does.
        assert_eq!(r.is_error, Some(rt.binary != "claude"), "{}", rt.binary);
        let text = r.text.unwrap_or_default();
        assert!(
            text.starts_with("é✓\n\"😀\u{1b}é"),
            "{}: {text:.40}",
            rt.binary
        );
        assert!(text.len() > 2000, "{}: {}", rt.binary, text.len());
        assert_eq!(
            run.stdout,
            format!("{long}\n"),
            "{}: the log has all of it",
            rt.binary
        );
    }
}

#[test]
fn output_that_is_no_result_is_logged_as_it_was_and_reported_as_an_error() {
    let deep = format!("{}1{}", "{\"a\":".repeat(100), "}".repeat(100));
    for rt in ALL {
        for (printed, code) in [
            ("Error: Invalid API key · Please run /login\n", 1),
            ("", 137),
            (r#"{"result": "unterminated"#, 1),
            ("[1, 2, 3]", 0),
            (r#"{"a":1} trailing"#, 0),
            (r#"{"type":"turn.started"}"#, 0),
            (deep.as_str(), 0),
        ] {
            let run = output(rt, printed, code);
            assert_eq!(run.code, Some(code), "{}: {printed}", rt.binary);
            assert_eq!(
                run.stdout.trim_end(),
                printed.trim_end(),
                "{}: the output is logged as it was",
                rt.binary
            );
            let r = result(&run.message);
            assert_eq!(
                (r.subtype.as_deref(), r.is_error),
                (Some("error_no_result"), Some(true)),
                "{}: {printed}",
                rt.binary
            );
            let text = r.text.unwrap_or_default();
            assert!(
                text.contains(&format!("exited with code {code} without a JSON result")),
                "{}: {text}",
                rt.binary
            );
        }
    }
}

#[test]
fn hostile_lines_among_the_events_are_skipped_and_counts_that_are_no_counts_are_left_out() {
    let junk = format!(
        "{}\nnot json\n{{\"type\":\"turn.completed\",\"usage\":{{\"input_tokens\":-5,\"output_tokens\":\"7\",\"cached_input_tokens\":1e3}}}}\n{}\n",
        "x".repeat(1_000_000),
        r#"{"type":"item.completed","item":{"type":"agent_message","text":"ok"}}"#
    );
    let run = output(CODEX, &junk, 0);
    assert_eq!(run.stdout, "ok\n");
    let r = result(&run.message);
    assert_eq!(counts(&r), [Some(1), Some(0), Some(0), Some(0), Some(0)]);
    let junk = format!(
        "{{\"type\":\"step_finish\",\"part\":{{\"cost\":\"1; rm -rf /\",\"tokens\":{{\"input\":2}}}}}}\n{{\"type\":\"text\",\"part\":{{\"text\":{}}}}}\n",
        serde_json::to_string(&"y".repeat(2_000_000)).unwrap_or_default()
    );
    let run = output(OPENCODE, &junk, 0);
    let r = result(&run.message);
    assert_eq!(r.cost_usd, None, "a cost that is no number is left out");
    assert_eq!((r.input_tokens, r.text_truncated), (Some(2), true));
}

#[test]
fn without_the_credential_the_runtime_does_not_start() {
    // Sidecar mode: the helper refuses (the proxy's port is held by another uid).
    let helper = "echo '127.0.0.1:8080 is held by uid 65532, not the MCP proxy' >&2; exit 1\n";
    for rt in [CODEX, GEMINI, OPENCODE] {
        let run = run_with(rt, "never printed", 0, Some(helper));
        assert!(run.args.is_empty(), "{} started", rt.binary);
        assert_eq!(run.code, Some(1), "{}", rt.binary);
        let r = result(&run.message);
        assert_eq!(r.subtype.as_deref(), Some("error_no_result"));
        assert!(
            r.text
                .as_deref()
                .is_some_and(|t| t.contains("credential for the proxy could not be read")),
            "{}: {:?}",
            rt.binary,
            r.text
        );
    }
    // With the helper's answer: the token it prints, not the file's.
    let run = run_with(
        CODEX,
        include_str!("../src/render/runtime/testdata/codex.jsonl"),
        0,
        Some("printf from-helper\n"),
    );
    assert!(
        run.env.contains("ORCHESTRATOR_MCP_TOKEN=from-helper\n"),
        "{}",
        run.env
    );
}

#[test]
fn sigterm_reaches_the_runtime_and_the_shell_exits_with_its_code() {
    for rt in ALL {
        let (dir, mut command) = setup(rt, "", 0, None);
        // A stand-in that runs until it is told to stop (10 s at most), and says it was.
        std::fs::write(
            dir.join("bin").join(rt.binary),
            format!(
                "#!/bin/sh\ntrap 'echo stopped > {0}/told; exit 143' TERM\n\
                 echo $$ > {0}/started\ni=0; while [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done\n",
                dir.display()
            ),
        )
        .expect("the stand-in");
        let mut shell = command
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("sh runs");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !dir.join("started").exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "{}: the stand-in never started",
                rt.binary
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
        let message = std::fs::read_to_string(dir.join("termination-log")).unwrap_or_default();
        let left = std::fs::read_dir(dir.join("tmp"))
            .map(|d| d.count())
            .unwrap_or(1);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(
            told.trim(),
            "stopped",
            "{}: the shell passed SIGTERM on",
            rt.binary
        );
        assert_eq!(status.code(), Some(143), "{}: {status:?}", rt.binary);
        assert_eq!(left, 0, "{}: nothing left in $TMPDIR", rt.binary);
        let r = result(&message);
        assert_eq!(
            r.subtype.as_deref(),
            Some("error_no_result"),
            "{}",
            rt.binary
        );
    }
}

/// An image without the helper (an image of the user's own for the default script): the
/// runtime's output is logged as it was, and the report says what is missing and the fix.
#[test]
fn without_the_helper_the_output_is_logged_and_the_report_names_what_is_missing() {
    for rt in ALL {
        let (dir, mut command) = setup(rt, "the runtime's own output\n", 0, None);
        std::fs::remove_file(dir.join("bin").join("orchestrator-agent")).expect("no helper");
        let Output { stdout, status, .. } = command.output().expect("sh runs");
        let message = std::fs::read_to_string(dir.join("termination-log")).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(
            status.code(),
            Some(0),
            "{}: the runtime's exit code",
            rt.binary
        );
        assert_eq!(
            String::from_utf8_lossy(&stdout),
            "the runtime's own output\n"
        );
        let r = result(&message);
        assert_eq!(
            (r.subtype.as_deref(), r.is_error),
            (Some("error_no_result"), Some(true))
        );
        let text = r.text.unwrap_or_default();
        assert!(
            text.contains("orchestrator-agent is not in the agent image")
                && text.contains("/usr/local/bin/orchestrator-agent"),
            "{text}"
        );
    }
}
