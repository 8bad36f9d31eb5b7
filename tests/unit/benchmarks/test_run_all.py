"""``benchmarks/run_all.py``: each script runs in its own subprocess with a limit, its table is kept and the
page is written with the machine, the versions and the owners' notes."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "run_all.py"


@pytest.fixture
def run_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("run_all_under_test", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "REPO", tmp_path)
    monkeypatch.setattr(module, "LOGS", tmp_path / "runs" / "logs")
    return module


def write_script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_it_keeps_the_table_and_drops_progress_bars_and_library_chatter(run_all: ModuleType, tmp_path: Path
                                                                         ) -> None:
    script = write_script(tmp_path, "fake", '''
        """Fake: a question. More text."""
        import sys
        print("Loading weights: 100%|####| 50/50 [00:00<00:00, 4243.10it/s]")
        print("setting      seconds")
        print("baseline        1.00")
        print("Timeout is disabled as parsing_timeout is None")
        print("[2026-12-03 07:24:10,756] [WARNING] [real_accelerator.py:213:get_accelerator] Setting accelerator")
        print("warming up", file=sys.stderr)
        print("ratio ours/baseline: 0.50")
    ''')
    result = run_all.run_script(script, timeout=60)
    assert result.status == "ok"
    assert result.question == "Fake: a question"
    assert result.table == ["setting      seconds", "baseline        1.00", "ratio ours/baseline: 0.50"]
    assert result.headline == "ratio ours/baseline: 0.50"
    assert "warming up" in (tmp_path / result.log).read_text()


def test_a_failing_script_is_reported_with_its_exit_code_and_log(run_all: ModuleType, tmp_path: Path) -> None:
    script = write_script(tmp_path, "broken", '''
        """Broken."""
        raise SystemExit(3)
    ''')
    result = run_all.run_script(script, timeout=60)
    assert result.status.startswith("failed (exit 3")
    assert result.headline == result.status


def test_a_script_past_its_limit_is_stopped_and_reported(run_all: ModuleType, tmp_path: Path) -> None:
    script = write_script(tmp_path, "slow", '''
        """Slow."""
        import time
        print("first row", flush=True)
        time.sleep(30)
    ''')
    result = run_all.run_script(script, timeout=1)
    assert result.status == "timed out after 1 s"
    assert result.seconds < 20


@pytest.mark.skipif("torch" in sys.modules and __import__("torch").cuda.is_available(), reason="has a GPU")
def test_a_gpu_script_is_listed_as_not_run_on_a_machine_without_cuda(run_all: ModuleType, tmp_path: Path) -> None:
    script = write_script(tmp_path, "gpu", '''
        """GPU run."""
        REQUIRES_GPU = True
        raise SystemExit("must not run")
    ''')
    result = run_all.run_script(script, timeout=60)
    assert result.status.startswith("not run")


def test_the_page_names_the_machine_and_versions_and_merges_the_owners_notes(run_all: ModuleType, tmp_path: Path
                                                                            ) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "benchmarks-zeta.md").write_text("## Zeta notes\nsecond")
    (tmp_path / "docs" / "benchmarks-alpha.md").write_text("## Alpha notes\nfirst")
    results = [run_all.Result("fake", "Fake: a question", "python benchmarks/fake.py", "ok", 2.0,
                              ["a | b", "ratio: 0.50"])]
    import datetime as dt

    page = run_all.render(results, "python benchmarks/run_all.py", dt.datetime(2026, 1, 1), (1.0, 2.0, 3.0))
    assert "CPU: " in page and "cores" in page and "torch " in page and "transformers " in page
    assert "Load average when the run started: 1.0" in page
    assert "| `fake` | Fake: a question | ratio: 0.50 |" in page  # the summary row
    assert "a \\| b" not in page.split("## fake")[1] and "a | b" in page  # tables verbatim in code blocks
    assert page.index("Alpha notes") < page.index("Zeta notes")


def test_notes_can_be_remerged_without_rerunning_the_benchmarks(run_all: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    note = tmp_path / "docs" / "benchmarks-alpha.md"
    note.write_text("old note")
    import datetime as dt

    page = tmp_path / "docs" / "benchmarks.md"
    results = [run_all.Result("fake", "Fake", "python benchmarks/fake.py", "ok", 1.0, ["ratio: 0.50"])]
    page.write_text(run_all.render(results, "cmd", dt.datetime(2026, 1, 1), None))
    note.write_text("new note")
    assert run_all.main(["--notes-only", "--out", str(page)]) == 0
    text = page.read_text()
    assert "new note" in text and "old note" not in text
    assert "ratio: 0.50" in text and text.count(run_all.NOTES_HEADING) == 1


def test_scripts_that_failed_timed_out_or_did_not_run_are_listed_apart_as_not_measured_with_why(
        run_all: ModuleType) -> None:
    import datetime as dt

    results = [
        run_all.Result("good", "Good: a question", "python benchmarks/good.py", "ok", 3.0, ["ratio: 2.00"]),
        run_all.Result("broken", "Broken: a question", "python benchmarks/broken.py",
                       "failed (exit 2; see runs/logs/broken.log)", 1.0, ["partial row 0.01"], "runs/logs/broken.log"),
        run_all.Result("slow", "Slow: a question", "python benchmarks/slow.py", "timed out after 600 s", 600.0,
                       ["half a table 9.99"], "runs/logs/slow.log"),
        run_all.Result("gpu", "GPU: a question", "python benchmarks/gpu.py", "not run: needs a CUDA GPU"),
    ]
    page = run_all.render(results, "python benchmarks/run_all.py", dt.datetime(2026, 1, 1), None)
    summary, rest = page.split("## Summary", 1)[1].split(run_all.NOT_MEASURED_HEADING, 1)
    assert "| `good` | Good: a question | ratio: 2.00 | 3 |" in summary
    assert not any(name in summary for name in ("broken", "slow", "gpu"))
    not_measured = rest.split("\n## ", 1)[0]
    assert "| `broken` | Broken: a question | failed (exit 2; see runs/logs/broken.log) | 1 |" in not_measured
    assert ("| `slow` | Slow: a question | timed out after 600 s; its standard error is in `runs/logs/slow.log` | 600 |"
            in not_measured)
    assert "| `gpu` | GPU: a question | not run: needs a CUDA GPU | 0 |" in not_measured
    # What a stopped script printed is no result: it appears nowhere, and only measured scripts get a section.
    assert "partial row" not in page and "half a table" not in page
    assert "## good: Good: a question" in page and "## broken:" not in page and "## slow:" not in page


def test_a_run_where_every_script_was_measured_has_no_not_measured_list(run_all: ModuleType) -> None:
    import datetime as dt

    results = [run_all.Result("good", "Good", "python benchmarks/good.py", "ok", 1.0, ["ratio: 1.00"])]
    page = run_all.render(results, "cmd", dt.datetime(2026, 1, 1), None)
    assert run_all.NOT_MEASURED_HEADING not in page and "| `good` | Good | ratio: 1.00 | 1 |" in page
