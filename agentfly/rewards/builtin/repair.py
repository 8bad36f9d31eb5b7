"""``repair_tests``: the code-repair task's reward, the share of the project's tests that pass in the rollout's
workspace after the agent's edits; nothing when the agent changed the tests or pytest's configuration.

The tests run in the workspace itself (the rollout's own copy), after the agent's last turn, with pytest's
junit report read back, so what counts is pytest's verdict per test, not text the project's code could print.
A rollout that never touched its workspace is scored by the sample's ``baseline`` (the share that passes in
the project as given), computed when the project was generated. The diff of the agent's edits and the test
report go on the trajectory's ``artifacts`` (``diff``, ``tests``), which the rollout viewer shows.
"""

from __future__ import annotations

import hashlib
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any

from agentfly.resources.workspace import RESOURCE
from agentfly.rewards.reward import reward

# Files that change how pytest collects or runs the tests: a new one is an edit of the tests.
CONFIG_FILES = ("conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "sitecustomize.py",
                "usercustomize.py")
REPORT = "/tmp/af-junit.xml"


def _sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def count_passed(junit: str) -> tuple[int, int]:
    """(passed, collected) from a pytest junit XML report."""
    root = ET.fromstring(junit)
    cases = root.findall(".//testcase")
    failed = [c for c in cases if c.find("failure") is not None or c.find("error") is not None
              or c.find("skipped") is not None]
    return len(cases) - len(failed), len(cases)


@reward
async def repair_tests(final_answer: str | None, test_files: Mapping[str, str], n_tests: int, baseline: float,
                       context: Any, trajectory: Any = None) -> dict[str, float]:
    """Share of the ``n_tests`` tests that pass; 0 when a test file or pytest's configuration was changed."""
    if context is None or not context.holds(RESOURCE):
        return {"reward": float(baseline), "passed": round(baseline * n_tests), "edited_tests": 0.0, "edits": 0.0,
                "test_runs": 0.0, "commands": 0.0}
    ws = await context.resource(RESOURCE)
    counts = await ws.tally()  # a method: the workspace may be a handle of an instance on Ray
    usage = {k: float(counts.get(k, 0)) for k in ("edits", "test_runs", "commands")}
    listing = await ws.sh("cd /workspace && find . -path ./.git -prune -o -type f -print0 | xargs -0 sha256sum",
                          timeout=30)
    present = {}
    for line in listing.text.splitlines():
        digest, _, path = line.partition("  ")
        present[path.removeprefix("./")] = digest
    touched = [p for p, text in test_files.items() if present.get(p) != _sha(text)]
    touched += [p for p in present if p.rsplit("/", 1)[-1] in CONFIG_FILES or p.endswith(".pth")]
    diff = await ws.diff()
    artifacts = getattr(trajectory, "artifacts", None)
    if isinstance(artifacts, dict):
        artifacts["diff"] = diff[-20_000:]
    if touched:
        if isinstance(artifacts, dict):
            artifacts["tests"] = "not run: the agent changed " + ", ".join(sorted(touched))
        return {"reward": 0.0, "passed": 0.0, "edited_tests": 1.0, **usage}
    run = await ws.sh(f"cd /workspace && {ws.test_command} -o addopts= --junitxml={REPORT} > /tmp/af-out.txt 2>&1; "
                      f"tail -c 4000 /tmp/af-out.txt > /tmp/af-tail.txt; cat {REPORT}; printf '\\0'; "
                      "cat /tmp/af-tail.txt", timeout=120)
    report, _, output = run.text.partition("\0")
    if isinstance(artifacts, dict):
        artifacts["tests"] = output
    try:
        passed, _ = count_passed(report)
    except ET.ParseError:
        passed = 0  # no report: pytest could not even start (a syntax error in conftest, a timeout)
    return {"reward": min(passed, n_tests) / n_tests, "passed": float(passed), "edited_tests": 0.0, **usage}
