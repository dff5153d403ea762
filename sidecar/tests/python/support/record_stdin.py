"""Runs an MCP server with its stdin recorded: every line the proxy sends is appended to LOGFILE
before it is passed on unchanged. Lets a test prove what an upstream did (or did not) receive.

usage: record_stdin.py LOGFILE COMMAND [ARGS...]
"""

import subprocess
import sys


def main() -> int:
    log_path, command = sys.argv[1], sys.argv[2:]
    child = subprocess.Popen(command, stdin=subprocess.PIPE)
    assert child.stdin is not None
    with open(log_path, "ab", buffering=0) as log:
        for line in sys.stdin.buffer:
            log.write(line)
            try:
                child.stdin.write(line)
                child.stdin.flush()
            except BrokenPipeError:
                break
    try:
        child.stdin.close()
    except BrokenPipeError:
        pass
    return child.wait()


if __name__ == "__main__":
    sys.exit(main())
