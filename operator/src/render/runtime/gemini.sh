# Gemini CLI (`gemini -p ... -o json`): the rendered system settings (they win over a
# workspace's .gemini/settings.json) and admin policy (not --yolo), a GEMINI_CLI_HOME of its own
# (no user settings or policies the agent could have written), the task on stdin. Gemini CLI
# reads its key and the MCP token from the environment once, at start: both are the agent's
# credential, which the model gateway accepts as the API key.
# GEMINI_CLI_NO_RELAUNCH: one process, which gets the SIGTERM (no child Node.js it relaunches).
export GEMINI_CLI_HOME="$work/gemini" GEMINI_CLI_SYSTEM_SETTINGS_PATH="$ORCHESTRATOR_GEMINI_SETTINGS" \
  GEMINI_CLI_NO_RELAUNCH=true
if mkdir "$GEMINI_CLI_HOME" && ORCHESTRATOR_MCP_TOKEN=$(credential); then
  export ORCHESTRATOR_MCP_TOKEN GEMINI_API_KEY="$ORCHESTRATOR_MCP_TOKEN"
  run "$ORCHESTRATOR_TASK_FILE" gemini -p "Carry out the task above." -m "$ORCHESTRATOR_MODEL" \
    -o json --admin-policy "$ORCHESTRATOR_GEMINI_POLICY"
else
  code=1 note="Gemini CLI did not start: the agent's credential for the proxy could not be read (see the log)"
fi
