# Codex CLI (`codex exec --json`): a CODEX_HOME of its own holding only the rendered config.toml
# (no user config, and a workspace's .codex/ is not trusted), so no file the agent writes can
# add an MCP server or a model provider. Codex reads the MCP token from the environment once, at
# start (it has no helper for MCP headers); the model key comes from the rendered helper.
export CODEX_HOME="$work/codex"
if mkdir "$CODEX_HOME" && cp "$ORCHESTRATOR_CODEX_CONFIG" "$CODEX_HOME/config.toml" && ORCHESTRATOR_MCP_TOKEN=$(credential); then
  export ORCHESTRATOR_MCP_TOKEN
  run "$ORCHESTRATOR_TASK_FILE" codex exec --json --ephemeral --skip-git-repo-check \
    --enable mcp_tool_list_changed -m "$ORCHESTRATOR_MODEL" -
else
  code=1 note="Codex did not start: its config or the agent's credential for the proxy could not be read (see the log)"
fi
