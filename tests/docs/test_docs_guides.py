"""Every guide's commands run, as written, on the tiny model, so the guides cannot rot.

A guide marks what this test runs with an HTML comment before a fenced block (invisible on the site):

    <!-- docs-test: file my_tools.py -->   the next block is written to my_tools.py first
    <!-- docs-test: run -->                the next ```bash block is run with bash -euo pipefail

Each guide runs in its own folder that looks like a checkout (every top-level entry of the repository
linked in, so `examples/...` and `PYTHONPATH=.` work as they do from the repository root), with the
project's venv first on PATH; what the commands write stays in that folder.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MARK = re.compile(r"<!-- docs-test: (run|file (\S+)) -->\s*\n```[^\n]*\n(.*?)```", re.S)


def blocks(page: Path) -> list[tuple[str, str | None, str]]:
    """``[(kind, file name or None, text), ...]`` of a page's marked blocks, in order."""
    return [("file" if name else "run", name or None, text) for _, name, text in MARK.findall(page.read_text())]


GUIDES = sorted(p for p in DOCS.rglob("*.md") if "<!-- docs-test:" in p.read_text())


def test_every_guide_ends_in_a_command_the_tests_run() -> None:
    guides = sorted((DOCS / "guides").glob("*.md"))
    assert guides
    for page in [*guides, DOCS / "quickstart.md"]:
        marked = blocks(page)
        assert marked and marked[-1][0] == "run", f"{page.relative_to(ROOT)} does not end in a marked command"


def checkout_like(folder: Path) -> None:
    for entry in ROOT.iterdir():
        if entry.name not in {"runs", "site", ".git", ".venv"} and not entry.name.startswith("."):
            (folder / entry.name).symlink_to(entry)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", GUIDES, ids=[str(p.relative_to(DOCS)) for p in GUIDES])
def test_the_guides_commands_run(page: Path, tmp_path: Path) -> None:
    checkout_like(tmp_path)
    bin_dir = Path(sys.executable).parent
    # A reader's shell: no test database (the web app's demo then uses its own SQLite file), and a Redis
    # namespace of its own, so the test session's worker never takes the demo's tasks (nor the demo its).
    clean = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "CHANNEL_LAYER_PREFIX"}}
    env = dict(clean, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", OMP_NUM_THREADS="1",
               PYTHONPATH=str(tmp_path), WANDB_SILENT="true", NO_MKDOCS_2_WARNING="1",
               AGENTFLY_REDIS_PREFIX=f"docs-guide-{uuid.uuid4().hex[:8]}:")
    for kind, name, text in blocks(page):
        if kind == "file":
            assert name is not None
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text(text)
            continue
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", text], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, f"{page.name}: `{text.strip()}` failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
