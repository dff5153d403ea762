#!/usr/bin/env bash
# Runs the official MCP conformance suite (@modelcontextprotocol/conformance, server scenarios)
# against @modelcontextprotocol/server-everything twice, in the same run:
#   1. directly (server-everything's own streamable-HTTP transport), and
#   2. through the proxy (toolPrefix: none; server-everything as a stdio upstream),
# then compares check by check. Exits non-zero if any check that passes directly fails through
# the proxy. Results stay in $CONFORMANCE_WORK (default: a new temp dir), printed at the end.
#
# Needs the tools from e2e/setup ($ORCH_TOOLS, default ~/.cache/orchestrator/tools). Uses
# $MCP_PROXY_BIN if set, else builds the proxy (debug) into $CARGO_TARGET_DIR.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
tools=${ORCH_TOOLS:-$HOME/.cache/orchestrator/tools}
bin=$tools/node/node_modules/.bin
everything=$tools/node/node_modules/@modelcontextprotocol/server-everything/dist/index.js
python=$tools/venv/bin/python
for f in "$bin/node" "$bin/conformance" "$everything" "$python"; do
  [ -e "$f" ] || { echo "missing $f: run e2e/setup to install the MCP test tools" >&2; exit 2; }
done
# The suite needs Node >= 22; the one e2e/setup installed comes first.
export PATH="$bin:$PATH"

proxy=${MCP_PROXY_BIN:-}
if [ -z "$proxy" ]; then
  export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$("$repo/scripts/target-dir")}
  (cd "$repo" && cargo build -q -p orchestrator-mcp-proxy --bins)
  proxy=$CARGO_TARGET_DIR/debug/orchestrator-mcp-proxy
fi

work=${CONFORMANCE_WORK:-$(mktemp -d -t mcp-conformance.XXXXXX)}
mkdir -p "$work"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

free_port() { "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() {
  for _ in $(seq 300); do
    if curl -s -o /dev/null "$1"; then return 0; fi
    sleep 0.1
  done
  echo "timed out waiting for $1" >&2
  exit 1
}

direct_port=$(free_port)
PORT=$direct_port node "$everything" streamableHttp >"$work/everything-direct.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$direct_port/mcp"

proxy_port=$(free_port)
mkdir -p "$work/config"
cat >"$work/config/proxy.yaml" <<EOF
task: {name: conformance}
toolPrefix: none
servers:
  - name: everything
    stdio:
      command: "$bin/node"
      args: ["$everything", "stdio"]
EOF
"$proxy" --config "$work/config/proxy.yaml" --listen "127.0.0.1:$proxy_port" \
  --cache-dir "$work/cache" >"$work/proxy.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$proxy_port/readyz"

echo "conformance: direct run (server-everything on :$direct_port)"
conformance server --url "http://127.0.0.1:$direct_port/mcp" -o "$work/direct" >"$work/direct.out" 2>&1 || true
echo "conformance: through the proxy (:$proxy_port)"
conformance server --url "http://127.0.0.1:$proxy_port/mcp" -o "$work/proxied" >"$work/proxied.out" 2>&1 || true

"$python" - "$work" <<'PY'
import json, re, sys
from pathlib import Path

work = Path(sys.argv[1])

def results(run):
    out = {}
    for checks in sorted((work / run).glob("*/checks.json")):
        scenario = re.sub(r"^server-|-\d{4}-\d\d-\d\dT.*$", "", checks.parent.name)
        for c in json.loads(checks.read_text()):
            if c["status"] in ("SUCCESS", "FAILURE", "WARNING"):
                out[(scenario, c["id"])] = (c["status"], c.get("errorMessage") or "")
    return out

direct, proxied = results("direct"), results("proxied")
if not direct or not proxied:
    sys.exit(f"no results: see {work}/direct.out and {work}/proxied.out")

def count(r):
    return sum(s == "SUCCESS" for s, _ in r.values()), sum(s != "SUCCESS" for s, _ in r.values())

print(f"{'scenario / check':62} {'direct':8} {'proxied':8}")
for key in sorted(set(direct) | set(proxied)):
    d = direct.get(key, ("-", ""))[0]
    p = proxied.get(key, ("-", ""))[0]
    mark = "  LOST" if d == "SUCCESS" and p != "SUCCESS" else ("  gained" if p == "SUCCESS" and d != "SUCCESS" else "")
    print(f"{key[0] + ' / ' + key[1]:62} {d:8} {p:8}{mark}")
dp, df = count(direct)
pp, pf = count(proxied)
print(f"\ndirect:  {dp} passed, {df} failed")
print(f"proxied: {pp} passed, {pf} failed")
lost = [k for k in direct if direct[k][0] == "SUCCESS" and proxied.get(k, ("-",))[0] != "SUCCESS"]
print(f"results: {work}")
if lost:
    for k in lost:
        print(f"LOST: {k[0]} / {k[1]}: {proxied.get(k, ('missing', ''))[1]}")
    sys.exit(1)
print("the proxy loses no check that passes directly")
PY
