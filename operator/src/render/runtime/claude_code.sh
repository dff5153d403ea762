# Claude Code, headless (`claude -p --output-format json`): the proxy its only MCP server
# (--strict-mcp-config), the rendered permission settings, the task on stdin.
run "$ORCHESTRATOR_TASK_FILE" claude -p --output-format json --strict-mcp-config \
  --mcp-config "$ORCHESTRATOR_MCP_CONFIG" --settings "$ORCHESTRATOR_SETTINGS"
