"""An MCP server (official Python SDK, stdio) with one faulty habit, chosen by the first argument:

  hang            never answers `initialize` (reads stdin, says nothing); keeps a helper process
                  of its own (`sleep`) in its process group, as `npx` keeps `node`
  helper          a working server (tool `ping`) whose helper process (`sleep`, started at launch)
                  ignores SIGTERM and never reads stdin: it outlives its parent unless its whole
                  process group is killed
  stderr-garbage  a working server that writes a line with bytes that are not UTF-8 to stderr at
                  launch and a line to stderr on every `ping`; it dies on a write to a closed pipe
                  (default SIGPIPE), as most programs do
  stderr-flood    a working server that first writes ARG2 MiB to stderr without a newline, then
                  ARG3 short lines, then serves
  exit            writes a line to stderr and exits at once (status 3), before any handshake; the
                  time of each launch is appended to $FAULTY_TIMES

Every server writes the pids of itself and its helper (if any) to the file named by $FAULTY_PIDS,
so a test can watch processes the proxy does not report.
"""

import os
import signal
import subprocess
import sys
import time


def record(*pids: int) -> None:
    path = os.environ.get("FAULTY_PIDS")
    if path:
        with open(path, "a") as f:
            f.write(" ".join(str(p) for p in pids) + "\n")


def helper(ignore_term: bool) -> int:
    # The helper stays in the server's process group (no new session), reads nothing.
    code = "import signal, time\n"
    if ignore_term:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "time.sleep(3600)\n"
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL).pid


def serve() -> None:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("faulty")

    @server.tool()
    def ping() -> str:
        """Answers pong (and, for stderr-garbage, writes a line to stderr first)."""
        if mode == "stderr-garbage":
            os.write(2, b"ping called\n")
        return "pong"

    server.run("stdio")


mode = sys.argv[1]
if mode == "hang":
    record(os.getpid(), helper(ignore_term=False))
    while sys.stdin.buffer.read(1):
        pass
    time.sleep(3600)
elif mode == "helper":
    record(os.getpid(), helper(ignore_term=True))
    serve()
elif mode == "stderr-garbage":
    record(os.getpid())
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    os.write(2, b"starting \xff\xfe not utf-8 \xc3\n")
    serve()
elif mode == "stderr-flood":
    record(os.getpid())
    chunk = b"x" * (1024 * 1024)
    for _ in range(int(sys.argv[2])):
        os.write(2, chunk)
    os.write(2, b"\n")
    for i in range(int(sys.argv[3])):
        os.write(2, b"noise line %d\n" % i)
    serve()
elif mode == "exit":
    record(os.getpid())
    times = os.environ.get("FAULTY_TIMES")
    if times:
        with open(times, "a") as f:
            f.write(f"{time.time()}\n")
    os.write(2, b"cannot start: the configuration is broken\n")
    sys.exit(3)
else:
    sys.exit(f"unknown mode {mode}")
