"""A minimal Kubernetes API client for the tests (no client library: the admin kubeconfig's
token or client certificate, its CA, JSON over HTTPS), and a TCP relay whose connections a test
can cut, to stand between the proxy and the API server."""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import tempfile
import threading
import urllib.error
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]


def kubeconfig_path() -> Path:
    """$KUBECONFIG, else the one ./test's cluster writes (<repo>/e2e/.cluster/kubeconfig)."""
    return Path(os.environ.get("KUBECONFIG") or REPO / "e2e/.cluster/kubeconfig")


class Kube:
    def __init__(self, path: Path):
        self.path = path
        config = yaml.safe_load(path.read_text())
        context_name = config["current-context"]
        context = next(c["context"] for c in config["contexts"] if c["name"] == context_name)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
        self.config = config
        self.server = cluster["server"].rstrip("/")
        self.ssl = ssl.create_default_context()
        self._files = tempfile.TemporaryDirectory(prefix="kubeapi-")
        if "certificate-authority-data" in cluster:
            self.ssl.load_verify_locations(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
        elif "certificate-authority" in cluster:
            self.ssl.load_verify_locations(cafile=cluster["certificate-authority"])
        self.headers = {}
        if "token" in user:
            self.headers["Authorization"] = f"Bearer {user['token']}"
        cert, key = user.get("client-certificate"), user.get("client-key")
        if "client-certificate-data" in user:
            cert, key = self._write("cert", user["client-certificate-data"]), self._write("key", user["client-key-data"])
        if cert:
            self.ssl.load_cert_chain(cert, key)

    def _write(self, name: str, data: str) -> str:
        path = Path(self._files.name) / name
        path.write_bytes(base64.b64decode(data))
        return str(path)

    def request(self, method: str, path: str, body: dict | None = None, content_type: str = "application/json") -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {**self.headers, "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        request = urllib.request.Request(f"{self.server}{path}", data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, context=self.ssl, timeout=10) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def ok(self, method: str, path: str, body: dict | None = None, content_type: str = "application/json") -> dict:
        status, answer = self.request(method, path, body, content_type)
        assert 200 <= status < 300, f"{method} {path}: {status} {answer}"
        return answer

    def merge_patch(self, path: str, body: dict) -> dict:
        return self.ok("PATCH", path, body, "application/merge-patch+json")

    def with_server(self, server: str, directory: Path) -> Path:
        """A copy of this kubeconfig whose cluster is at `server` (same credentials and CA)."""
        config = json.loads(json.dumps(self.config))
        for cluster in config["clusters"]:
            cluster["cluster"]["server"] = server
        path = directory / "kubeconfig"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path


class Relay:
    """Forwards 127.0.0.1:<port> to `target`; `cut()` drops every connection, `pause()` makes
    it drop new ones at once (an unreachable server) until `resume()`."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.paused = threading.Event()
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        self.accepted = 0
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.accepted += 1
            if self.paused.is_set() or self.closed:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> int:
        """Closes every connection (as an API server restart would); returns how many."""
        with self.lock:
            sockets, self.sockets = self.sockets, []
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        return len(sockets) // 2

    def pause(self) -> None:
        self.paused.set()

    def resume(self) -> None:
        self.paused.clear()

    def close(self) -> None:
        self.closed = True
        self.listener.close()
        self.cut()
