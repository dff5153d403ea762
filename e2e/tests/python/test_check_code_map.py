"""scripts/check-code-map, the docs check ./test runs beside the generated files: it passes on our
tree, and on a tiny fake workspace it fails, naming the module and the doc, when a module is added
without a line in the docs' code maps."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "check-code-map"

ARCHITECTURE = """# Architecture

## Crates (dependencies point one way)

- **`sidecar`** — `config` (the parsed config), `zone/` (a server's own container).
  - a nested bullet belongs to the crate's bullet.

## Invariants

- `stray` named here is outside the code map.
"""

PROXY = """# The proxy

## Code map (`sidecar/src`)

1. `config.rs` (the parsed config);
2. `zone/` (the `zone` subcommand:
   `protocol.rs` the socket protocol).

## Tests

`frames.rs` named here is outside the code map.
"""

CRATE = {
    "Cargo.toml": '[workspace]\nmembers = ["sidecar"]\n',
    "docs/architecture.md": ARCHITECTURE,
    "docs/proxy.md": PROXY,
    "sidecar/src/lib.rs": "pub mod config;\npub mod zone;\n#[cfg(test)]\nmod tests;\n",
    "sidecar/src/main.rs": "fn main() {}\n",
    "sidecar/src/config.rs": "pub struct Config;\n",
    "sidecar/src/tests.rs": "",
    "sidecar/src/zone/mod.rs": "pub mod protocol;\n",
    "sidecar/src/zone/protocol.rs": "",
}


def workspace(tmp_path):
    for name, text in CRATE.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def check(root=None):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *([str(root)] if root else [])],
        capture_output=True, text=True, timeout=60,
    )


def test_our_docs_name_every_module():
    result = check()
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_fake_workspace_whose_docs_name_every_module_passes(tmp_path):
    result = check(workspace(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_top_level_module_added_without_a_line_fails_naming_both_docs(tmp_path):
    root = workspace(tmp_path)
    (root / "sidecar/src/lib.rs").write_text(CRATE["sidecar/src/lib.rs"] + "pub mod stray;\n")
    (root / "sidecar/src/stray.rs").write_text("")
    result = check(root)
    assert result.returncode == 1
    assert ("MISSING docs/architecture.md (## Crates, the sidecar bullet): no line names sidecar/src/stray"
            in result.stdout), result.stdout
    assert "MISSING docs/proxy.md (## Code map (`sidecar/src`)): no line names sidecar/src/stray" in result.stdout
    # A line in each code map is the fix.
    (root / "docs/architecture.md").write_text(ARCHITECTURE.replace("`zone/`", "`stray` (strays), `zone/`"))
    (root / "docs/proxy.md").write_text(PROXY.replace("1. `config.rs`", "1. `stray.rs` (strays), `config.rs`"))
    result = check(root)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_nested_module_added_without_a_line_under_its_parent_fails(tmp_path):
    root = workspace(tmp_path)
    (root / "sidecar/src/zone/mod.rs").write_text("pub mod protocol;\npub mod frames;\n")
    (root / "sidecar/src/zone/frames.rs").write_text("")
    result = check(root)
    assert result.returncode == 1
    assert ("no line names sidecar/src/zone/frames after `zone/` in its list item (sidecar/src/zone/frames.rs)"
            in result.stdout), result.stdout
    assert "architecture.md" not in result.stdout  # only top-level modules are mapped there
    # Named in another list item, before its parent: still missing.
    (root / "docs/proxy.md").write_text(PROXY.replace("1. `config.rs`", "1. `frames.rs`, `config.rs`"))
    assert check(root).returncode == 1
    # Named after its parent in the parent's item: found; so is the whole path anywhere.
    (root / "docs/proxy.md").write_text(PROXY.replace("`protocol.rs` the", "`frames.rs` the frames, `protocol.rs` the"))
    assert check(root).returncode == 0
    (root / "docs/proxy.md").write_text(PROXY.replace("1. `config.rs`", "1. `zone/frames.rs` the frames, `config.rs`"))
    assert check(root).returncode == 0
