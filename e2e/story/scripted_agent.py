"""The MCP client of a scripted agent: Python source that tests and benches put in front of their
own script and run with `python3 -c` in the agent container (the image's Python, no model). It
exits 0 on SIGTERM (as the kubelet stops the pod), takes the proxy's URL from the env the
operator renders (`ORCHESTRATOR_MCP_URL`; in shared mode also `ORCHESTRATOR_MCP_TOKEN_FILE`, whose
token it sends as `Authorization: Bearer`, read again for each request as the kubelet renews it), and defines `post(body, session)` -> (session, the
JSON-RPC messages of the answer, plain JSON or SSE) and `connect(name)` -> a session opened with
initialize (2025-11-25) and `notifications/initialized`."""

CLIENT = r"""
import json, os, signal, sys, urllib.request
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
url = os.environ["ORCHESTRATOR_MCP_URL"]
token_file = os.environ.get("ORCHESTRATOR_MCP_TOKEN_FILE")

def post(body, session=None):
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if token_file:
        with open(token_file) as f:
            headers["Authorization"] = "Bearer " + f.read().strip()
    if session:
        headers.update({"Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"})
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    with urllib.request.urlopen(request, timeout=60) as response:
        text = response.read().decode()
        session = response.headers.get("Mcp-Session-Id") or session
    lines = [l[5:] for l in text.splitlines() if l.startswith("data:") and l[5:].strip()]
    return session, [json.loads(l) for l in lines] or ([json.loads(text)] if text.strip() else [])

def connect(name):
    session, _ = post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": name, "version": "1"}}})
    post({"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
    return session
"""
