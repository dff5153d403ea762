"""A stand-in for the kubelet, for one container: the task pod's MCP proxy sidecar.

kwok plays the nodes and runs no containers. For the end-to-end story we need the proxy to
really run, so this does what the kubelet would do for that one container, and nothing else:

- reads the pod from the API and finds the proxy: the native sidecar (an init container with
  `restartPolicy: Always`);
- materializes its volumes in a local directory: ConfigMap volumes exactly as the kubelet's
  AtomicWriter lays them out (a timestamped data directory, a `..data` symlink swapped
  atomically, one symlink per key), emptyDirs as empty directories; mount paths in the
  container's args, env and working directory are mapped to those directories;
- resolves the container's env from the API (`value`, `secretKeyRef`, `configMapKeyRef`,
  `fieldRef`); the process gets that env and nothing else of ours but PATH;
- runs the image's binary (`orchestrator-mcp-proxy`, the one cargo built) with the container's
  command and args, and waits for its startup probe;
- keeps the ConfigMap volumes in sync: when a ConfigMap changes it writes the new data and swaps
  `..data`, as the kubelet's periodic sync does (the kubelet may take up to a minute; we do it as
  soon as the watch reports the change);
- stops the container (TERM, then KILL after 10 s) when asked, as the kubelet does when the
  pod's main containers have finished.

The agent container is not run: the test plays the agent with the official MCP Python SDK.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

# The binary the proxy image runs (its ENTRYPOINT); the pod's command names it.
PROXY_BINARY = "orchestrator-mcp-proxy"


class KubeletError(RuntimeError):
    pass


def atomic_write(directory: Path, files: dict[str, bytes]) -> None:
    """Writes `files` into a ConfigMap volume directory the way the kubelet's AtomicWriter does."""
    directory.mkdir(parents=True, exist_ok=True)
    data_link = directory / "..data"
    old = os.readlink(data_link) if data_link.is_symlink() else None
    stamp = time.strftime("%Y_%m_%d_%H_%M_%S", time.gmtime())
    new = f"..{stamp}.{uuid.uuid4().hex[:9]}"
    for key, content in files.items():
        path = directory / new / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    tmp = directory / "..data_tmp"
    if tmp.is_symlink():
        tmp.unlink()
    os.symlink(new, tmp)
    os.rename(tmp, data_link)  # the atomic swap
    top_level = {key.split("/")[0] for key in files}
    for name in top_level:
        link = directory / name
        if not link.is_symlink():
            os.symlink(f"..data/{name}", link)
    for entry in directory.iterdir():
        if entry.is_symlink() and not entry.name.startswith("..") and entry.name not in top_level:
            entry.unlink()  # keys that left the ConfigMap
    if old:
        shutil.rmtree(directory / old, ignore_errors=True)


@dataclass
class ConfigMapVolume:
    name: str
    config_map: str
    items: list[dict] | None
    directory: Path
    resource_version: str = ""

    def files(self, data: dict[str, str], binary: dict[str, str]) -> dict[str, bytes]:
        all_data = {k: v.encode() for k, v in data.items()}
        all_data.update({k: base64.b64decode(v) for k, v in binary.items()})
        if self.items is None:
            return all_data
        return {item["path"]: all_data[item["key"]] for item in self.items if item["key"] in all_data}


@dataclass
class ProxyContainer:
    """The proxy container of a pod, running as a local process."""

    kubectl: Callable[..., str]
    namespace: str
    pod: dict
    proxy_binary: Path
    root: Path
    cwd: Path | None = None
    process: subprocess.Popen | None = None
    volumes: list[ConfigMapVolume] = field(default_factory=list)
    mounts: list[tuple[str, Path]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    container: dict = field(default_factory=dict)
    swaps: list[tuple[float, str, str]] = field(default_factory=list)  # (time, volume, resourceVersion)
    _watchers: list[subprocess.Popen] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def from_pod(cls, kubectl, namespace: str, pod_name: str, proxy_binary: Path, cwd: Path | None = None):
        pod = json.loads(kubectl("get", "pod", pod_name, "-n", namespace, "-o", "json"))
        root = Path(tempfile.mkdtemp(prefix=f"kubelet-{pod_name}-"))
        self = cls(kubectl=kubectl, namespace=namespace, pod=pod, proxy_binary=proxy_binary, root=root, cwd=cwd)
        sidecars = [c for c in pod["spec"].get("initContainers", []) if c.get("restartPolicy") == "Always"]
        if len(sidecars) != 1:
            raise KubeletError(f"pod {pod_name}: expected one native sidecar, found {[c['name'] for c in sidecars]}")
        self.container = sidecars[0]
        self._mount_volumes()
        self._resolve_env()
        command = self.container.get("command") or [PROXY_BINARY]
        if Path(command[0]).name != PROXY_BINARY:
            raise KubeletError(f"the sidecar runs {command[0]!r}, not {PROXY_BINARY}: this stand-in only runs the proxy")
        self.argv = [str(proxy_binary)] + [self.map_path(a) for a in command[1:] + self.container.get("args", [])]
        return self

    # --- volumes -------------------------------------------------------------------------------

    def _mount_volumes(self) -> None:
        volumes = {v["name"]: v for v in self.pod["spec"].get("volumes", [])}
        for mount in self.container.get("volumeMounts", []):
            volume = volumes.get(mount["name"])
            if volume is None:
                raise KubeletError(f"volumeMount {mount['name']} names no volume")
            if mount.get("subPath"):
                raise KubeletError(f"volumeMount {mount['name']} uses subPath, which the kubelet never updates")
            directory = self.root / "volumes" / mount["name"]
            if "configMap" in volume:
                cm = ConfigMapVolume(
                    name=mount["name"],
                    config_map=volume["configMap"]["name"],
                    items=volume["configMap"].get("items"),
                    directory=directory,
                )
                self._sync(cm)
                self.volumes.append(cm)
            elif "emptyDir" in volume:
                directory.mkdir(parents=True, exist_ok=True)
            else:
                raise KubeletError(f"volume {mount['name']}: only configMap and emptyDir volumes are supported")
            self.mounts.append((mount["mountPath"].rstrip("/"), directory))
        # Longest mount path first, so /etc/a/b wins over /etc/a.
        self.mounts.sort(key=lambda m: len(m[0]), reverse=True)

    def map_path(self, value: str) -> str:
        for mount_path, directory in self.mounts:
            if value == mount_path or value.startswith(mount_path + "/"):
                return str(directory) + value[len(mount_path) :]
        return value

    def _sync(self, volume: ConfigMapVolume, cm: dict | None = None) -> bool:
        if cm is None:
            cm = json.loads(self.kubectl("get", "configmap", volume.config_map, "-n", self.namespace, "-o", "json"))
        version = cm["metadata"]["resourceVersion"]
        with self._lock:
            if version == volume.resource_version:
                return False
            atomic_write(volume.directory, volume.files(cm.get("data", {}), cm.get("binaryData", {})))
            volume.resource_version = version
            self.swaps.append((time.monotonic(), volume.name, version))
        return True

    # --- env -----------------------------------------------------------------------------------

    def _resolve_env(self) -> None:
        env: dict[str, str] = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        # In the pod /tmp is the container's own (an emptyDir): point the process's temp dir at
        # the mapped one, so nothing it keeps there (the proxy's tool-list cache) is shared with
        # other processes on this host.
        tmp = self.map_path("/tmp")
        env["TMPDIR"] = tmp if tmp != "/tmp" else str(self.root / "tmp")
        Path(env["TMPDIR"]).mkdir(parents=True, exist_ok=True)
        for var in self.container.get("env", []):
            if "value" in var:
                env[var["name"]] = self.map_path(var["value"])
                continue
            source = var.get("valueFrom", {})
            if "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                value = self._key("secret", ref)
                if value is not None:
                    env[var["name"]] = base64.b64decode(value).decode()
            elif "configMapKeyRef" in source:
                value = self._key("configmap", source["configMapKeyRef"])
                if value is not None:
                    env[var["name"]] = value
            elif "fieldRef" in source:
                path = source["fieldRef"]["fieldPath"]
                fields = {
                    "metadata.name": self.pod["metadata"]["name"],
                    "metadata.namespace": self.namespace,
                    "status.podIP": "127.0.0.1",
                }
                if path not in fields:
                    raise KubeletError(f"env {var['name']}: fieldRef {path} is not supported by the stand-in")
                env[var["name"]] = fields[path]
            else:
                raise KubeletError(f"env {var['name']}: unsupported valueFrom {list(source)}")
        self.env = env

    def _key(self, kind: str, ref: dict) -> str | None:
        try:
            obj = json.loads(self.kubectl("get", kind, ref["name"], "-n", self.namespace, "-o", "json"))
        except subprocess.CalledProcessError:
            if ref.get("optional"):
                return None
            raise KubeletError(f"{kind} {ref['name']} not found (the kubelet would not start the container)")
        value = obj.get("data", {}).get(ref["key"])
        if value is None and not ref.get("optional"):
            raise KubeletError(f"{kind} {ref['name']} has no key {ref['key']}")
        return value

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self, log: Path, timeout: float = 60) -> None:
        cwd = self.map_path(self.container["workingDir"]) if self.container.get("workingDir") else self.cwd
        self.process = subprocess.Popen(
            self.argv,
            env=self.env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for volume in self.volumes:
            self._watch(volume)
        self._wait_for_probe(timeout)

    def _wait_for_probe(self, timeout: float) -> None:
        """Runs the container's startup probe (exec) until it passes, as the kubelet does."""
        probe = self.container.get("startupProbe") or self.container.get("readinessProbe")
        if not probe or "exec" not in probe:
            return
        command = probe["exec"]["command"]
        argv = [str(self.proxy_binary) if Path(command[0]).name == PROXY_BINARY else command[0]]
        argv += [self.map_path(a) for a in command[1:]]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise KubeletError(f"the proxy exited with {self.process.returncode} before its startup probe passed")
            if subprocess.run(argv, env=self.env, capture_output=True).returncode == 0:
                return
            time.sleep(probe.get("periodSeconds", 1) / 10)
        raise KubeletError(f"the proxy's startup probe did not pass within {timeout}s")

    def _watch(self, volume: ConfigMapVolume) -> None:
        """Follows the ConfigMap with `kubectl get --watch` and swaps the volume on each change."""
        watcher = self.kubectl_popen(
            "get", "configmap", volume.config_map, "-n", self.namespace,
            "--watch", "--output-watch-events", "-o", "json",
        )
        self._watchers.append(watcher)

        def follow():
            decoder = json.JSONDecoder()
            buffer = ""
            for chunk in iter(lambda: watcher.stdout.readline(), ""):
                buffer += chunk
                while buffer.strip():
                    try:
                        event, end = decoder.raw_decode(buffer.lstrip())
                    except json.JSONDecodeError:
                        break
                    buffer = buffer.lstrip()[end:]
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self._sync(volume, event["object"])

        threading.Thread(target=follow, daemon=True).start()

    def kubectl_popen(self, *args: str) -> subprocess.Popen:
        return self.kubectl(*args, popen=True)

    def descendants(self) -> list[int]:
        """Every live process below the proxy (its upstream MCP servers and theirs)."""
        if self.process is None:
            return []
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
        found, todo = [], [self.process.pid]
        while todo:
            for child in children.get(todo.pop(), []):
                found.append(child)
                todo.append(child)
        return found

    def stop(self, grace: float = 10) -> int | None:
        """TERM, then KILL after `grace` seconds; returns the exit code."""
        for watcher in self._watchers:
            watcher.terminate()
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
