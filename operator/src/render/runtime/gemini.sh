# Gemini CLI (`gemini -p ... -o json`): the rendered system settings (they win over a
# workspace's .gemini/settings.json) and admin policy (not --yolo), a GEMINI_CLI_HOME of its own
# (no user settings or policies the agent could have written), the task on stdin. Gemini CLI
# reads its key and the MCP token from the environment once, at start: both are the agent's
# credential, which the model gateway accepts as the API key.
# GEMINI_CLI_NO_RELAUNCH: one process, which gets the SIGTERM (no child Node.js it relaunches).
# It reads system settings and policies only through paths whose every directory is root's and
# writable by nobody else (a ConfigMap's mount is group-writable under the pod's fsGroup, and
# /tmp by all): the image's /etc/gemini-cli holds links to the rendered files (e2e/images/build,
# the Dockerfile's agent-gemini target). ORCHESTRATOR_GEMINI_ETC names another such directory.
etc=${ORCHESTRATOR_GEMINI_ETC:-/etc/gemini-cli}
export GEMINI_CLI_HOME="$work/gemini" GEMINI_CLI_SYSTEM_SETTINGS_PATH="$etc/settings.json" \
  GEMINI_CLI_NO_RELAUNCH=true
if [ "$(readlink "$etc/settings.json")" != "$ORCHESTRATOR_GEMINI_SETTINGS" ] \
  || [ "$(readlink "$etc/policies/orchestrator.toml")" != "$ORCHESTRATOR_GEMINI_POLICY" ]; then
  code=1 note="Gemini CLI did not start: the image has no $etc/settings.json -> $ORCHESTRATOR_GEMINI_SETTINGS and $etc/policies/orchestrator.toml -> $ORCHESTRATOR_GEMINI_POLICY (the agent-gemini image's links to the rendered settings and policy)"
elif mkdir "$GEMINI_CLI_HOME" && ORCHESTRATOR_MCP_TOKEN=$(credential); then
  export ORCHESTRATOR_MCP_TOKEN GEMINI_API_KEY="$ORCHESTRATOR_MCP_TOKEN"
  run "$ORCHESTRATOR_TASK_FILE" gemini -p "Carry out the task above." -m "$ORCHESTRATOR_MODEL" \
    -o json --admin-policy "$etc/policies/orchestrator.toml"
else
  code=1 note="Gemini CLI did not start: the agent's credential for the proxy could not be read (see the log)"
fi
