# The default agent (operator/src/render/agent.rs): Claude Code, headless, the task on stdin.
umask 002
# Where it writes comes from its environment: its own temporary file for Claude Code's JSON (in
# $TMPDIR, removed at the end), and the termination log (the pod's /dev/termination-log unless
# ORCHESTRATOR_TERMINATION_LOG names another file: a run on a host gives its own).
tl=${ORCHESTRATOR_TERMINATION_LOG:-/dev/termination-log}
out=$(mktemp "${TMPDIR:-/tmp}/claude-result.XXXXXX") || exit 1
# Shared mode: the shared proxy serves this pod's token once the operator has bound the pod (its
# uid and IP on the task's proxy config), a moment after the pod starts; wait for that (30 s at
# most) so that Claude Code's first connection is served. (In sidecar mode the pod's proxy is
# ready before this container starts.)
if [ "${ORCHESTRATOR_PROXY_MODE:-}" = shared ] && [ -n "${ORCHESTRATOR_MCP_TOKEN_FILE:-}" ]; then
  # Python: the agent image has no Node.js (Claude Code is its native binary).
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
  else echo "no python3 in the agent image: Claude Code starts without waiting for the shared proxy" >&2; fi
fi
claude -p --output-format json --strict-mcp-config --mcp-config "$ORCHESTRATOR_MCP_CONFIG" \
  --settings "$ORCHESTRATOR_SETTINGS" < "$ORCHESTRATOR_TASK_FILE" > "$out" &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null' TERM INT HUP
wait "$pid"; code=$?
while kill -0 "$pid" 2>/dev/null; do wait "$pid"; code=$?; done
LC_ALL=C awk -v code="$code" -v tl="$tl" '
function ws() { while (p <= n && index(" \t\r\n", substr(s, p, 1))) p++ }
function str(   q, c) {
  q = p; p++
  while (p <= n) {
    c = substr(s, p, 1)
    if (c == "\\") p += 2
    else if (c == "\"") { p++; return substr(s, q, p - q) }
    else p++
  }
  bad = 1; return ""
}
function value(path, d,   c, t, k, kp) {
  if (d > 64) { bad = 1; return }
  ws(); c = substr(s, p, 1)
  if (c == "\"") { t = str(); if (path != "") V[path] = t; return }
  if (c == "{" || c == "[") {
    p++; ws()
    if (substr(s, p, 1) == (c == "{" ? "}" : "]")) { p++; return }
    while (!bad) {
      kp = ""
      if (c == "{") {
        ws(); if (substr(s, p, 1) != "\"") { bad = 1; return }
        k = str(); k = substr(k, 2, length(k) - 2)
        ws(); if (substr(s, p, 1) != ":") { bad = 1; return }
        p++
        if (d == 0) kp = k; else if (d == 1 && path != "") kp = path "." k
      }
      value(kp, d + 1); ws(); t = substr(s, p, 1); p++
      if (t == (c == "{" ? "}" : "]")) return
      if (t != ",") { bad = 1; return }
    }
    return
  }
  t = ""
  while (p <= n && index(" \t\r\n,}]", substr(s, p, 1)) == 0) { t = t substr(s, p, 1); p++ }
  if (t == "") bad = 1; else if (path != "") V[path] = t
}
function unit(raw, i,   c) {
  c = substr(raw, i, 1)
  if (c == "\\") return substr(raw, i + 1, 1) == "u" ? 6 : 2
  if (c < "\300") return 1
  if (c < "\340") return 2
  if (c < "\360") return 3
  return 4
}
function clip(raw, max,   i, u) {
  if (length(raw) <= max) return raw
  i = 2
  while (i < length(raw)) { u = unit(raw, i); if (i + u > max) break; i += u }
  cut = 1
  return substr(raw, 1, i - 1) "\""
}
function hex(h,   i, v) {
  v = 0
  for (i = 1; i <= length(h); i++) v = v * 16 + index("0123456789abcdef", tolower(substr(h, i, 1))) - 1
  return v
}
function utf8(cp) {
  if (cp < 128) return sprintf("%c", cp)
  if (cp < 2048) return sprintf("%c%c", 192 + int(cp / 64), 128 + cp % 64)
  if (cp < 65536) return sprintf("%c%c%c", 224 + int(cp / 4096), 128 + int(cp / 64) % 64, 128 + cp % 64)
  return sprintf("%c%c%c%c", 240 + int(cp / 262144), 128 + int(cp / 4096) % 64, 128 + int(cp / 64) % 64, 128 + cp % 64)
}
function say(raw,   parts, m, j, x, e, cp, lo) {
  m = split(substr(raw, 2, length(raw) - 2), parts, "\\")
  printf "%s", parts[1]
  for (j = 2; j <= m; j++) {
    x = parts[j]
    if (x == "") { printf "\\"; if (++j <= m) printf "%s", parts[j]; continue }
    e = substr(x, 1, 1); x = substr(x, 2)
    if (e == "n") e = "\n"; else if (e == "t") e = "\t"; else if (e == "r") e = "\r"
    else if (e == "b") e = "\b"; else if (e == "f") e = "\f"
    else if (e == "u") {
      cp = hex(substr(x, 1, 4)); x = substr(x, 5)
      if (cp >= 55296 && cp < 56320 && x == "" && j < m && parts[j + 1] ~ /^u[dD][c-fC-F]/) {
        lo = hex(substr(parts[j + 1], 2, 4))
        cp = 65536 + (cp - 55296) * 1024 + (lo - 56320)
        x = substr(parts[++j], 6)
      }
      if (cp >= 55296 && cp < 57344) cp = 65533
      e = utf8(cp)
    }
    printf "%s%s", e, x
  }
  printf "\n"
}
function add(key, v) { if (v != "") o = o (o == "" ? "" : ",") "\"" key "\":" v }
function count(v) { return v ~ /^[0-9]+$/ ? v : "" }
{ s = s $0 "\n" }
END {
  n = length(s); p = 1; ws()
  if (substr(s, p, 1) == "{") { value("", 0); ws(); if (p <= n) bad = 1 } else bad = 1
  if (bad || !("subtype" in V || "result" in V || "is_error" in V)) {
    printf "%s", s
    o = "{\"subtype\":\"error_no_result\",\"isError\":true,\"text\":\"Claude Code exited with code " code " without a JSON result (its output is in the log)\"}"
  } else {
    if (substr(V["result"], 1, 1) == "\"") say(V["result"])
    if (substr(V["subtype"], 1, 1) == "\"") add("subtype", clip(V["subtype"], 256))
    if (V["is_error"] == "true" || V["is_error"] == "false") add("isError", V["is_error"])
    add("turns", count(V["num_turns"]))
    add("inputTokens", count(V["usage.input_tokens"]))
    add("outputTokens", count(V["usage.output_tokens"]))
    add("cacheReadInputTokens", count(V["usage.cache_read_input_tokens"]))
    add("cacheCreationInputTokens", count(V["usage.cache_creation_input_tokens"]))
    if (V["total_cost_usd"] ~ /^[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$/) add("costUsd", V["total_cost_usd"])
    add("durationMs", count(V["duration_ms"]))
    if (substr(V["session_id"], 1, 1) == "\"") add("sessionId", clip(V["session_id"], 256))
    if (substr(V["result"], 1, 1) == "\"") {
      cut = 0; add("text", clip(V["result"], 4000 - length(o) - 40))
      if (cut) add("textTruncated", "true")
    }
    o = "{" o "}"
  }
  printf "%s", o > tl
}' "$out"
rm -f "$out"
exit "$code"
