# Gemini CLI (`gemini -p ... -o json`): the system settings (they win over a workspace's
# .gemini/settings.json) and the rendered admin policy (not --yolo), a GEMINI_CLI_HOME of its own
# (no user settings or policies the agent could have written), the task on stdin. Gemini CLI
# reads system settings only through directories that are root's and writable by nobody else, so
# they are the image's /etc/gemini-cli/settings.json, which must be the operator's (the
# ConfigMap's copy): an image of another release would run with settings nobody rendered. Gemini
# CLI reads its key and the MCP token from the environment once, at start: both are the agent's
# credential, which the model gateway accepts as the API key.
# GEMINI_CLI_NO_RELAUNCH: one process, which gets the SIGTERM (no child Node.js it relaunches).
system=${GEMINI_CLI_SYSTEM_SETTINGS_PATH:-/etc/gemini-cli/settings.json}
export GEMINI_CLI_HOME="$work/gemini" GEMINI_CLI_SYSTEM_SETTINGS_PATH="$system" GEMINI_CLI_NO_RELAUNCH=true
if [ ! -f "$system" ] || [ "$(cat "$system")" != "$(cat "$ORCHESTRATOR_GEMINI_SETTINGS")" ]; then
  code=1 note="Gemini CLI did not start: $system is missing or not the operator's Gemini CLI settings ($ORCHESTRATOR_GEMINI_SETTINGS): run the agent-gemini image of the operator's release (spec.agent.image)"
elif mkdir "$GEMINI_CLI_HOME" && ORCHESTRATOR_MCP_TOKEN=$(credential); then
  export ORCHESTRATOR_MCP_TOKEN GEMINI_API_KEY="$ORCHESTRATOR_MCP_TOKEN"
  run "$ORCHESTRATOR_TASK_FILE" gemini -p "Carry out the task above." -m "$ORCHESTRATOR_MODEL" \
    -o json --admin-policy "$ORCHESTRATOR_GEMINI_POLICY"
else
  code=1 note="Gemini CLI did not start: the agent's credential for the proxy could not be read (see the log)"
fi
