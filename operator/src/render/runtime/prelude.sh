# The agent container's default script (operator/src/render/runtime): the runtime below runs
# headless with the task, its final text goes to stdout and its report, as one JSON object under
# 4096 bytes, to the termination log.
umask 002
# Where it writes comes from its environment: a directory of its own in $TMPDIR (the runtime's
# output and private homes, removed at the end), and the termination log (the pod's
# /dev/termination-log unless ORCHESTRATOR_TERMINATION_LOG names another file).
tl=${ORCHESTRATOR_TERMINATION_LOG:-/dev/termination-log}
work=$(mktemp -d "${TMPDIR:-/tmp}/agent.XXXXXX") || exit 1
out=$work/out
: > "$out"
# The runtime's own temporary files (and its commands') go there too.
mkdir "$work/tmp" && export TMPDIR="$work/tmp"
code=0 note=
# Shared mode: the shared proxy serves this pod's token once the operator has bound the pod (its
# uid and IP on the task's proxy config), a moment after the pod starts; wait for that (30 s at
# most) so that the runtime's first connection is served. (In sidecar mode the pod's proxy is
# ready before this container starts.)
if [ "${ORCHESTRATOR_PROXY_MODE:-}" = shared ] && [ -n "${ORCHESTRATOR_MCP_TOKEN_FILE:-}" ]; then
  if command -v python3 >/dev/null; then python3 - <<'PY'
import os, re, sys, time, urllib.error, urllib.request
url, path = os.environ["ORCHESTRATOR_MCP_URL"], os.environ["ORCHESTRATOR_MCP_TOKEN_FILE"]
until = time.monotonic() + 30
while True:
    try:
        with open(path) as f:
            token = f.read().strip()
        request = urllib.request.Request(url, data=b'{"jsonrpc":"2.0","id":0,"method":"ping"}', headers={
            "authorization": "Bearer " + token, "content-type": "application/json",
            "accept": "application/json, text/event-stream"})
        with urllib.request.urlopen(request, timeout=5) as r:
            body = r.read(4096).decode(errors="replace")
    except urllib.error.HTTPError as e:
        body = e.read(4096).decode(errors="replace")
    except OSError as e:
        body = "unreachable: %s" % e
    if not re.search(r"PROXY\.(TASK_NOT_READY|UNKNOWN_TASK)|^unreachable", body):
        break
    if time.monotonic() > until:
        sys.exit("the shared proxy does not serve this task yet: " + body[:300])
    time.sleep(0.2)
PY
  elif command -v node >/dev/null; then node - <<'JS'
const fs = require("fs");
const url = process.env.ORCHESTRATOR_MCP_URL, path = process.env.ORCHESTRATOR_MCP_TOKEN_FILE;
const until = Date.now() + 30000;
(async () => {
  for (;;) {
    let body;
    try {
      const token = fs.readFileSync(path, "utf8").trim();
      const r = await fetch(url, { method: "POST", signal: AbortSignal.timeout(5000),
        headers: { authorization: "Bearer " + token, "content-type": "application/json",
          accept: "application/json, text/event-stream" },
        body: '{"jsonrpc":"2.0","id":0,"method":"ping"}' });
      body = (await r.text()).slice(0, 4096);
    } catch (e) { body = "unreachable: " + e; }
    if (!/PROXY\.(TASK_NOT_READY|UNKNOWN_TASK)|^unreachable/.test(body)) return;
    if (Date.now() > until) {
      console.error("the shared proxy does not serve this task yet: " + body.slice(0, 300));
      process.exit(1);
    }
    await new Promise((r) => setTimeout(r, 200));
  }
})();
JS
  else echo "no python3 or node in the agent image: the runtime starts without waiting for the shared proxy" >&2; fi
fi
# The agent's credential for its proxy (and its model gateway): in sidecar mode the rendered
# helper prints it only while the proxy's uid holds the proxy's port; in shared mode the pod's
# projected token, as it is.
credential() {
  if [ -n "${ORCHESTRATOR_CREDENTIAL_HELPER:-}" ]; then sh "$ORCHESTRATOR_CREDENTIAL_HELPER"
  else cat "${ORCHESTRATOR_MCP_TOKEN_FILE:-/var/run/secrets/orchestrator.io/mcp/token}"; fi
}
# run INPUT COMMAND...: the runtime, its stdin INPUT and its stdout in $out; passes SIGTERM on (a
# cancelled task's pod is stopped: a shell as a container's PID 1 would ignore it) and keeps the
# runtime's exit code in $code.
run() {
  input=$1; shift
  "$@" < "$input" > "$out" &
  pid=$!
  trap 'kill -TERM "$pid" 2>/dev/null' TERM INT HUP
  wait "$pid"; code=$?
  while kill -0 "$pid" 2>/dev/null; do wait "$pid"; code=$?; done
}
