//! Turning `--enable-tools` / `--disable-tools` into a new `toolConfig.mcpServers` (pure).
//!
//! The rule every case follows: with E the tools the enable patterns match and D the tools the
//! disable patterns match, the tools the agent sees afterwards are `(before ∪ E) \ D`, and
//! nothing else changes. The filter model (deny wins over allow; an empty allow list allows
//! all; a disabled server exposes nothing) shapes how that is written:
//!
//! - enable on a server not in the task: the server is added with `allow: [pattern]`.
//! - enable on a disabled server: it is switched on exposing only the pattern (its old allow
//!   list is replaced; `server:*` switches it on with everything).
//! - enable on an enabled server: the pattern joins `allow` (unless the list is empty, i.e.
//!   all, or already covers it), and deny patterns it covers are removed (an exact match, a
//!   tool name it matches, or all of them for `*`). A deny *glob* that would still hide the tool
//!   is refused: removing it would expose more than asked, and deny wins. The message says how
//!   to lift the glob itself.
//! - disable `server:*`: the server is switched off (its lists are kept for a later enable).
//! - disable on an enabled server: allow entries it covers are removed, and the pattern joins
//!   `deny` if anything left could still expose a tool it matches. If that empties a non-empty
//!   allow list (which would mean "all"), the server is switched off instead.
//! - disable on a server not in the task or switched off: nothing to do (a note says so).
//!
//! Enables are applied before disables, so `--enable-tools 'git:*' --disable-tools git:git_push`
//! means "all of git except git_push". Asking to enable a tool and to disable it (or a pattern
//! matching it) in one command is refused.

use orchestrator_crds::catalog::Catalog;
use orchestrator_crds::taskrun::{McpServer, ToolConfig};

use crate::error::{Error, Result};
use crate::toolspec::{ToolSpec, glob_matches, is_literal, is_match_all};

/// What add-context (or submit) asks for.
#[derive(Clone, Debug, Default)]
pub struct Request {
    pub enable: Vec<ToolSpec>,
    pub disable: Vec<ToolSpec>,
}

/// The new tool config, and notes for the user about requests that changed nothing.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub config: ToolConfig,
    pub notes: Vec<String>,
}

/// Refuses a request that enables and disables the same tool (checked before any API call).
pub fn check_contradictions(req: &Request) -> Result<()> {
    let mut clashes = Vec::new();
    for e in &req.enable {
        for d in &req.disable {
            if e.server != d.server {
                continue;
            }
            // An enable glob with a narrower disable is "all but these": allowed. An enable
            // that the disable fully overrides (same pattern, or a name the disable matches)
            // would be a no-op at best and a mistake at worst.
            let clash = e.pattern == d.pattern
                || is_match_all(&d.pattern)
                || (e.is_literal() && glob_matches(&d.pattern, &e.pattern));
            if clash {
                clashes.push(format!("  {e} (enabled) vs {d} (disabled)"));
            }
        }
    }
    if clashes.is_empty() {
        Ok(())
    } else {
        Err(Error::Usage(format!(
            "the same tool is both enabled and disabled:\n{}\nremove it from one of \
             --enable-tools / --disable-tools",
            clashes.join("\n")
        )))
    }
}

/// Applies the request to `config`. `catalog` is used only to judge whether a deny glob still
/// hides tools an enable glob asks for (over the tools the catalog lists).
pub fn apply(config: &ToolConfig, req: &Request, catalog: &Catalog) -> Result<Outcome> {
    let mut config = config.clone();
    let mut notes = Vec::new();
    let mut blocked = Vec::new();
    for spec in &req.enable {
        if let Err(why) = enable(&mut config, spec, catalog) {
            blocked.push(why);
        }
    }
    if !blocked.is_empty() {
        return Err(Error::Usage(blocked.join("\n")));
    }
    for spec in &req.disable {
        if let Some(note) = disable(&mut config, spec) {
            notes.push(note);
        }
    }
    Ok(Outcome { config, notes })
}

/// Whether no server of `config` can expose any tool: every one is disabled or denies
/// everything. The task is then offered no MCP tool (the proxy serves the empty set).
pub fn nothing_enabled(config: &ToolConfig) -> bool {
    !config
        .mcp_servers
        .iter()
        .any(|s| s.enabled && !s.tools.deny.iter().any(|d| is_match_all(d)))
}

fn enable(config: &mut ToolConfig, spec: &ToolSpec, catalog: &Catalog) -> Result<(), String> {
    let p = spec.pattern.as_str();
    let Some(server) = config
        .mcp_servers
        .iter_mut()
        .find(|s| s.name == spec.server)
    else {
        config
            .mcp_servers
            .push(McpServer::new(spec.server.clone(), &[p], &[]));
        return Ok(());
    };
    let was_enabled = server.enabled;

    // Deny patterns wholly inside what is being enabled go; they would hide part of it.
    server.tools.deny.retain(|d| !covers(p, d));
    let known: Vec<&str> = catalog
        .get(&spec.server)
        .map(|c| c.tools.iter().map(|t| t.name.as_str()).collect())
        .unwrap_or_default();
    let blockers: Vec<&String> = server
        .tools
        .deny
        .iter()
        .filter(|d| {
            if is_literal(p) {
                glob_matches(d, p)
            } else {
                known
                    .iter()
                    .any(|t| glob_matches(p, t) && glob_matches(d, t))
            }
        })
        .collect();
    if let Some(d) = blockers.first() {
        return Err(format!(
            "cannot enable {spec}: the deny pattern {d:?} of server {0} hides it, and deny wins \
             over allow. Enabling it alone would mean deleting {d:?}, which exposes more than \
             you asked. To lift the pattern itself, enable \"{0}:{d}\" (and disable in the same \
             command what must stay hidden), or edit the TaskRun.",
            spec.server
        ));
    }

    if !was_enabled {
        server.enabled = true;
        server.tools.allow = vec![p.to_string()];
    } else if server.tools.allow.is_empty() {
        // An empty allow list already allows everything.
    } else if is_match_all(p) {
        server.tools.allow = vec![p.to_string()];
    } else {
        let covered = server
            .tools
            .allow
            .iter()
            .any(|a| a == p || is_match_all(a) || (is_literal(p) && glob_matches(a, p)));
        if !covered {
            server.tools.allow.push(p.to_string());
        }
    }
    Ok(())
}

/// Whether enabling `p` makes deny pattern `d` pointless: everything `d` hides is in `p`.
fn covers(p: &str, d: &str) -> bool {
    p == d || is_match_all(p) || (is_literal(d) && glob_matches(p, d))
}

fn disable(config: &mut ToolConfig, spec: &ToolSpec) -> Option<String> {
    let p = spec.pattern.as_str();
    let Some(server) = config
        .mcp_servers
        .iter_mut()
        .find(|s| s.name == spec.server)
    else {
        return Some(format!(
            "{spec}: server {} is not in this task; nothing to disable",
            spec.server
        ));
    };
    if !server.enabled {
        return Some(format!(
            "{spec}: server {} is already switched off; nothing to disable",
            spec.server
        ));
    }
    if is_match_all(p) {
        server.enabled = false;
        return None;
    }
    let already_hidden = server
        .tools
        .deny
        .iter()
        .any(|d| d == p || is_match_all(d) || (is_literal(p) && glob_matches(d, p)));
    if already_hidden {
        return Some(format!("{spec} is already hidden by a deny pattern"));
    }
    let allow = &server.tools.allow;
    if is_literal(p) && !allow.is_empty() && !allow.iter().any(|a| glob_matches(a, p)) {
        return Some(format!("{spec} is not exposed; nothing to disable"));
    }

    let before = server.tools.allow.clone();
    server
        .tools
        .allow
        .retain(|a| !(a == p || (is_literal(a) && glob_matches(p, a))));
    if !before.is_empty() && server.tools.allow.is_empty() {
        // An empty allow list means "all": switch the server off instead, and keep its lists
        // (with the pattern denied) so switching it on by hand does not bring the tool back.
        server.tools.allow = before;
        server.tools.deny.push(p.to_string());
        server.enabled = false;
        return None;
    }
    let allow = &server.tools.allow;
    let still_exposed = allow.is_empty()
        || if is_literal(p) {
            allow.iter().any(|a| glob_matches(a, p))
        } else {
            // Literal entries it matched are gone; a glob left may overlap it.
            allow.iter().any(|a| !is_literal(a))
        };
    if still_exposed {
        server.tools.deny.push(p.to_string());
    } else if server.tools.allow == before {
        return Some(format!(
            "{spec} matches no allowed tool; nothing to disable"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::toolspec::parse_specs;

    fn catalog() -> Catalog {
        Catalog::parse(
            r#"
servers:
  - name: github
    stdio: {command: gh}
    tools: [{name: create_issue}, {name: close_issue}, {name: merge_pr}, {name: delete_branch}, {name: delete_repo}]
  - name: filesystem
    stdio: {command: fs}
    tools: [{name: read_file}, {name: write_file}, {name: delete_file}]
  - name: memory
    stdio: {command: mem}
"#,
        )
        .expect("valid catalog")
    }

    fn req(enable: &str, disable: &str) -> Request {
        Request {
            enable: parse_specs("--enable-tools", &[enable.into()]).expect("enable"),
            disable: parse_specs("--disable-tools", &[disable.into()]).expect("disable"),
        }
    }

    fn server(name: &str, enabled: bool, allow: &[&str], deny: &[&str]) -> McpServer {
        let mut s = McpServer::new(name, allow, deny);
        s.enabled = enabled;
        s
    }

    fn config(servers: Vec<McpServer>) -> ToolConfig {
        ToolConfig {
            mcp_servers: servers,
            ..Default::default()
        }
    }

    fn run(before: Vec<McpServer>, enable: &str, disable: &str) -> Outcome {
        apply(&config(before), &req(enable, disable), &catalog()).expect("applies")
    }

    #[test]
    fn enabling_on_a_server_not_in_the_task_adds_it_with_just_that_tool() {
        let out = run(vec![], "github:merge_pr,github:close_issue", "");
        assert_eq!(
            out.config.mcp_servers,
            [server("github", true, &["merge_pr", "close_issue"], &[])]
        );
    }

    #[test]
    fn enabling_joins_the_allow_list_unless_already_covered() {
        let out = run(
            vec![server("github", true, &["create_*"], &[])],
            "github:create_issue,github:merge_pr",
            "",
        );
        assert_eq!(
            out.config.mcp_servers[0].tools.allow,
            ["create_*", "merge_pr"]
        );
        // An empty allow list (all) stays empty.
        let out = run(
            vec![server("github", true, &[], &[])],
            "github:merge_pr",
            "",
        );
        assert!(out.config.mcp_servers[0].tools.allow.is_empty());
    }

    #[test]
    fn enabling_a_tool_denied_by_name_lifts_that_deny() {
        let out = run(
            vec![server(
                "filesystem",
                true,
                &["read_file", "delete_file"],
                &["delete_file"],
            )],
            "filesystem:delete_file",
            "",
        );
        assert_eq!(
            out.config.mcp_servers,
            [server(
                "filesystem",
                true,
                &["read_file", "delete_file"],
                &[]
            )]
        );
    }

    #[test]
    fn enabling_a_tool_a_deny_glob_covers_is_refused_with_the_way_out() {
        let before = config(vec![server("github", true, &["*"], &["delete_*"])]);
        let err = apply(&before, &req("github:delete_branch", ""), &catalog())
            .expect_err("deny glob wins")
            .to_string();
        assert!(
            err.contains("the deny pattern \"delete_*\" of server github hides it"),
            "{err}"
        );
        assert!(err.contains("enable \"github:delete_*\""), "{err}");

        // The way out: enable the glob itself, disable what must stay hidden.
        let out = apply(
            &before,
            &req("github:delete_*", "github:delete_repo"),
            &catalog(),
        )
        .expect("lifting the glob works");
        assert_eq!(
            out.config.mcp_servers,
            [server("github", true, &["*"], &["delete_repo"])]
        );
    }

    #[test]
    fn enabling_a_glob_overlapping_a_deny_glob_is_judged_on_catalog_tools() {
        let before = config(vec![server(
            "github",
            true,
            &["create_issue"],
            &["*_branch"],
        )]);
        let err = apply(&before, &req("github:delete_*", ""), &catalog()).expect_err("overlap");
        assert!(err.to_string().contains("\"*_branch\""), "{err}");
        // No listed tool is in both: allowed.
        let out = apply(&before, &req("github:close_*", ""), &catalog()).expect("no overlap");
        assert_eq!(
            out.config.mcp_servers[0].tools.allow,
            ["create_issue", "close_*"]
        );
    }

    #[test]
    fn enabling_server_star_exposes_everything_and_clears_denies() {
        let out = run(
            vec![server(
                "github",
                true,
                &["create_issue"],
                &["delete_*", "merge_pr"],
            )],
            "github:*",
            "",
        );
        assert_eq!(
            out.config.mcp_servers,
            [server("github", true, &["*"], &[])]
        );
    }

    #[test]
    fn enabling_on_a_switched_off_server_exposes_only_what_was_asked() {
        let out = run(
            vec![server("github", false, &["*"], &["delete_repo"])],
            "github:merge_pr",
            "",
        );
        assert_eq!(
            out.config.mcp_servers,
            [server("github", true, &["merge_pr"], &["delete_repo"])]
        );
    }

    #[test]
    fn disabling_a_tool_an_allow_glob_covers_denies_it() {
        let out = run(
            vec![server("filesystem", true, &["*"], &[])],
            "",
            "filesystem:delete_file",
        );
        assert_eq!(
            out.config.mcp_servers,
            [server("filesystem", true, &["*"], &["delete_file"])]
        );
        // Same with an empty allow list (all).
        let out = run(
            vec![server("filesystem", true, &[], &[])],
            "",
            "filesystem:delete_file",
        );
        assert_eq!(out.config.mcp_servers[0].tools.deny, ["delete_file"]);
    }

    #[test]
    fn disabling_a_listed_tool_removes_it_from_allow() {
        let out = run(
            vec![server(
                "filesystem",
                true,
                &["read_file", "write_file"],
                &[],
            )],
            "",
            "filesystem:write_file",
        );
        assert_eq!(
            out.config.mcp_servers,
            [server("filesystem", true, &["read_file"], &[])]
        );
    }

    #[test]
    fn disabling_a_listed_tool_still_covered_by_a_glob_also_denies_it() {
        let out = run(
            vec![server("filesystem", true, &["write_file", "*_file"], &[])],
            "",
            "filesystem:write_file",
        );
        assert_eq!(
            out.config.mcp_servers,
            [server("filesystem", true, &["*_file"], &["write_file"])]
        );
    }

    #[test]
    fn disabling_the_last_allowed_tool_switches_the_server_off_never_to_all() {
        let out = run(
            vec![server("github", true, &["merge_pr"], &[])],
            "",
            "github:merge_pr",
        );
        assert_eq!(
            out.config.mcp_servers,
            [server("github", false, &["merge_pr"], &["merge_pr"])]
        );
    }

    #[test]
    fn disabling_server_star_switches_it_off_keeping_its_lists() {
        let out = run(
            vec![server("github", true, &["a", "b"], &["c"])],
            "",
            "github:*",
        );
        assert_eq!(
            out.config.mcp_servers,
            [server("github", false, &["a", "b"], &["c"])]
        );
    }

    #[test]
    fn disabling_what_is_not_there_changes_nothing_and_says_so() {
        let before = vec![
            server("filesystem", true, &["read_file"], &[]),
            server("github", false, &["*"], &[]),
            server("memory", true, &["*"], &["delete_*"]),
        ];
        let out = run(
            before.clone(),
            "",
            "time:now,filesystem:write_file,github:merge_pr,memory:delete_entities,filesystem:x*",
        );
        assert_eq!(out.config.mcp_servers, before, "nothing changed");
        assert_eq!(out.notes.len(), 5, "{:?}", out.notes);
        assert!(out.notes[0].contains("time is not in this task"));
        assert!(out.notes[1].contains("not exposed"));
        assert!(out.notes[2].contains("already switched off"));
        assert!(out.notes[3].contains("already hidden"));
        assert!(out.notes[4].contains("matches no allowed tool"));
    }

    #[test]
    fn enables_apply_before_disables_so_a_glob_can_have_exceptions() {
        let out = run(vec![], "github:delete_*", "github:delete_repo");
        assert_eq!(
            out.config.mcp_servers,
            [server("github", true, &["delete_*"], &["delete_repo"])]
        );
    }

    #[test]
    fn enabling_and_disabling_the_same_tool_is_refused() {
        for (e, d) in [
            ("github:merge_pr", "github:merge_pr"),
            ("github:merge_pr", "github:merge_*"),
            ("github:create_*", "github:*"),
        ] {
            let err = check_contradictions(&req(e, d)).expect_err(e).to_string();
            assert!(err.contains("both enabled and disabled"), "{err}");
            assert!(err.contains(e), "{err}");
        }
        check_contradictions(&req("github:merge_pr", "filesystem:merge_pr")).expect("other server");
        check_contradictions(&req("github:delete_*", "github:delete_repo")).expect("exception");
    }

    #[test]
    fn a_config_with_no_enabled_server_is_nothing_enabled() {
        let off = run(
            vec![server("github", true, &["merge_pr"], &[])],
            "",
            "github:merge_pr",
        );
        assert!(nothing_enabled(&off.config));
        assert!(nothing_enabled(&config(vec![server(
            "x",
            true,
            &[],
            &["*"]
        )])));
        assert!(nothing_enabled(&config(vec![server(
            "x",
            true,
            &[],
            &["**"]
        )])));
        assert!(nothing_enabled(&ToolConfig::default()));
        let on = run(
            vec![server("github", true, &["a", "b"], &[])],
            "",
            "github:a",
        );
        assert!(!nothing_enabled(&on.config), "b is left");
    }

    #[test]
    fn other_servers_and_internal_tools_are_untouched() {
        let mut before = config(vec![
            server("filesystem", true, &["read_file"], &[]),
            server("memory", true, &[], &[]),
        ]);
        before.internal_tools.permissions.deny = vec!["WebFetch".into()];
        let out = apply(&before, &req("github:merge_pr", ""), &catalog()).expect("applies");
        assert_eq!(out.config.internal_tools, before.internal_tools);
        assert_eq!(out.config.mcp_servers[..2], before.mcp_servers[..]);
    }
}
