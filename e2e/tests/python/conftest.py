"""The set-up the e2e Python tests share.

`sys.path` gets, once for every module: e2e/story (the story and its helpers: `from story import
...`, `shared_mode`, `host_agent`, `bench`, `scripted_agent`), e2e/model (the scripted model
stand-in) and this directory (a module may use another's helpers: `from test_real_node import
running_pod`).

Fixtures:
- `story` (per module): the chart installed and the operator running, as in the story
  (`Story.prepare`: the real node, the binaries, the node's images), in namespaces of the
  module's own; torn down after the module. `story.prepare_s` is how long that took.
- `installed_story` (per module): the same without the real node and its images, for modules in
  which no pod is pulled (they run on kwok nodes, or no Job is made): the images are names that
  do not exist. A module uses it as its `story` with
  `@pytest.fixture(scope="module") def story(installed_story): return installed_story`.
- `chart_values` (per module): more `--set` values for the chart of both; none here, a module
  overrides the fixture to set its own.
- `work` (per test): a directory for Claude Code run on this machine as the pod's uid, which must
  reach its home below it (mode 755), removed afterwards.

A module whose set-up differs (other chart values computed from its namespaces, a shared proxy, a
step before the install) keeps its own fixture; one that only adds to the story overrides `story`
with a fixture of the same name that takes it (`def story(story): ...`).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
E2E = HERE.parents[1]
for path in (HERE, E2E / "model", E2E / "story"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


# ./test runs this suite as two pytest processes side by side (ORCH_E2E_GROUP a and b; b with its
# own chart release name and host ports: ORCH_E2E_RELEASE, ORCH_E2E_MODEL_PORT_OFFSET, story.py),
# after the modules that must run alone first and before those that must run alone last. Without
# ORCH_E2E_GROUP a run takes every module, one after the other.
GROUPS = {
    # It installs the chart's previous version: its CRDs (without status.result, refusing phase
    # Cancelled) and cluster-wide admission policies for the time it runs.
    "first": {"test_chart_upgrade.py"},
    # It restarts the API server; operators of other modules lose their leases meanwhile.
    "last": {"test_live_control.py"},
    # The real node's longer modules, balanced against the rest (group a).
    "b": {"test_model_key.py", "test_runtimes.py", "test_trust_zones.py", "test_real_node.py",
          "test_release.py", "test_lifecycle.py", "test_zone_auth.py"},
}


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    group = os.environ.get("ORCH_E2E_GROUP")
    if not group or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    if group not in ("a", *GROUPS):
        raise pytest.UsageError(f"ORCH_E2E_GROUP={group}: one of a, {', '.join(GROUPS)}")
    named = {n for g in GROUPS.values() for n in g}
    mine = GROUPS.get(group, set()) if group != "a" else None
    return (collection_path.name not in mine) if mine is not None else collection_path.name in named


# Image names for pods that are never pulled (kwok nodes, or no Job at all).
NO_IMAGES = {"agent": "example.invalid/agent:none", "mcp-proxy": "example.invalid/proxy:none"}


@pytest.fixture(scope="module")
def chart_values() -> list[str]:
    """More `--set` values for the chart (a module overrides this fixture to set some)."""
    return []


@pytest.fixture(scope="module")
def story(chart_values):
    """The chart installed and the operator running (as in the story), for this module's tasks."""
    from story import Story  # here, not at the top: modules without a cluster need none of it

    began = time.monotonic()
    story = Story(say=lambda *_: None, helm_values=list(chart_values))
    with ExitStack() as cleanup:
        story.prepare(cleanup)
        story.prepare_s = time.monotonic() - began
        yield story


@pytest.fixture(scope="module")
def installed_story(chart_values):
    """The chart installed and the operator running with its ServiceAccount, in namespaces of this
    module's own (the story's prepare without the real node and its images: no pod is pulled)."""
    from story import Story, cargo_binaries

    story = Story(say=lambda *_: None, helm_values=list(chart_values))
    with ExitStack() as cleanup:
        story.cleanup = cleanup
        story.binaries = cargo_binaries()
        story.images = dict(NO_IMAGES)
        story.install()
        yield story


@pytest.fixture
def work(request):
    """A directory for the agent run on this machine, named after the module (claude-code-...)."""
    prefix = request.module.__name__.removeprefix("test_").replace("_", "-") + "-"
    d = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(d, 0o755)  # the agent runs as the pod's uid and needs to reach its home below
    yield d
    shutil.rmtree(d, ignore_errors=True)
