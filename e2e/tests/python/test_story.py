"""The user's story end to end on the real control plane (see e2e/story/story.py for the steps).

Needs the cluster (`e2e/cluster up`) and the test tools (`e2e/setup`); `./test` provides both.
Every step of the story checks what it shows and raises StoryError otherwise; here we also keep
the figures the issue asks for (add-context -> list_changed time).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "story"))

from story import Story  # noqa: E402


def test_the_story_from_helm_install_to_a_garbage_collected_taskrun(capsys):
    lines = []
    figures = Story(say=lines.append).run()
    with capsys.disabled():
        print("\n".join(["", *lines]))
    # The figures are measured, not asserted against a target (speed belongs in benchmarks), but
    # they must exist: each one is a step that really happened.
    assert figures["add_context_to_notification_ms"] > 0
    assert figures["proxy_ready_s"] > 0
