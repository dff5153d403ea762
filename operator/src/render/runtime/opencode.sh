# OpenCode (`opencode run --format json`): the rendered config only (no project config, no
# Claude Code files or outside skills, no default plugins, no models.dev fetch, no update check,
# no sharing, no LSP server downloads), its config,
# data, state and cache directories of its own, the task as an attached file. OpenCode reads the
# MCP token and the model key ({env:ORCHESTRATOR_MCP_TOKEN} in its config) once, at start.
export OPENCODE_CONFIG="$ORCHESTRATOR_OPENCODE_CONFIG" OPENCODE_DISABLE_PROJECT_CONFIG=1 \
  OPENCODE_DISABLE_CLAUDE_CODE=1 OPENCODE_DISABLE_EXTERNAL_SKILLS=1 OPENCODE_DISABLE_DEFAULT_PLUGINS=1 \
  OPENCODE_DISABLE_MODELS_FETCH=1 OPENCODE_DISABLE_AUTOUPDATE=1 OPENCODE_DISABLE_SHARE=1 \
  OPENCODE_DISABLE_LSP_DOWNLOAD=1 \
  XDG_CONFIG_HOME="$work/config" XDG_DATA_HOME="$work/data" XDG_STATE_HOME="$work/state" \
  XDG_CACHE_HOME="$work/cache"
if ORCHESTRATOR_MCP_TOKEN=$(credential); then
  export ORCHESTRATOR_MCP_TOKEN
  run /dev/null opencode run --format json -m "anthropic/$ORCHESTRATOR_MODEL" \
    -f "$ORCHESTRATOR_TASK_FILE" -- "Carry out the task in the attached file."
else
  code=1 note="OpenCode did not start: the agent's credential for the proxy could not be read (see the log)"
fi
