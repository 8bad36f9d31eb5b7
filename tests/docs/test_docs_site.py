"""The documentation site: it builds in strict mode (no broken link, no missing API reference), its
configuration reference is the config dataclasses, and its quickstart is the README's."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
import typing
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def docs_hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_site_builds_in_strict_mode_with_the_api_and_config_references(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNING" not in done.stderr, done.stderr[-3000:]
    api = (site / "reference" / "agentfly.html").read_text()
    # mkdocstrings rendered the docstrings themselves, not just the headings
    assert 'id="agentfly.tools.tool.tool"' in api and "A parameter named" in api
    assert 'id="agentfly.rewards.reward.reward"' in api and 'id="agentfly.resources.ResourceSpec"' in api
    trainer_api = (site / "reference" / "trainer.html").read_text()
    assert 'id="trainer.trackers.MLflowSink"' in trainer_api and 'id="trainer.events.EventStream"' in trainer_api
    config = (site / "reference" / "config.html").read_text()
    assert "tracker_options.mlflow.tracking_uri" in config and "algorithm.clip_high" in config
    for page in ("quickstart", "guides/algorithms", "guides/webapp", "architecture", "security", "benchmarks"):
        assert (site / f"{page}.html").is_file(), page
    # Offline, and telling no third party who reads it: no page asks Google Fonts for anything.
    asking = [p.name for p in site.rglob("*.html") if "fonts.googleapis.com" in p.read_text() or "fonts.gstatic.com" in p.read_text()]
    assert asking == [], asking


def test_the_site_folder_is_git_ignored() -> None:
    done = subprocess.run(["git", "check-ignore", "-q", "site/index.html"], cwd=ROOT)
    assert done.returncode == 0, "add site/ to .gitignore: mkdocs build writes the site there"


def _config_classes() -> list[type]:
    from trainer.config import Config

    seen: list[type] = []

    def walk(cls: type) -> None:
        seen.append(cls)
        for tp in typing.get_type_hints(cls).values():
            args = [tp, *typing.get_args(tp)]
            for arg in args:
                if isinstance(arg, type) and dataclasses.is_dataclass(arg) and arg not in seen:
                    walk(arg)

    walk(Config)
    return seen


def test_every_config_field_has_help_text() -> None:
    missing = [f"{cls.__name__}.{f.name}" for cls in _config_classes() for f in dataclasses.fields(cls)
               if not str(f.metadata.get("help", "")).strip()]
    assert not missing, f"config fields without help (give each _f(default, 'help')): {missing}"
    assert docs_hooks().missing_help() == []


def test_the_config_reference_lists_every_key_with_its_type_default_and_help() -> None:
    from trainer.config import Config

    page = docs_hooks().render()
    rows = dict(re.findall(r"^\| `([^`]+)` \| (.+?) \|$", page, flags=re.M))
    assert rows["algorithm.name"].startswith("'grpo' | 'dr_grpo'".replace("|", "\\|"))
    assert "`0.2` | Lower clip" in rows["algorithm.clip_low"]
    assert "`[]` | Experiment trackers" in rows["trackers"]
    assert "resources.<name>.max" in rows and "model.lora.r" in rows
    # every leaf field of every section is a row
    leaves = 0
    for cls in _config_classes():
        leaves += sum(1 for f in dataclasses.fields(cls)
                      if not (isinstance(typing.get_type_hints(cls)[f.name], type)
                              and dataclasses.is_dataclass(typing.get_type_hints(cls)[f.name])))
    assert len(rows) == leaves
    assert Config.__dataclass_fields__["steps"].metadata["help"] in rows["steps"]


def test_a_field_without_help_stops_the_build_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.config import OptimConfig

    field = OptimConfig.__dataclass_fields__["eps"]
    monkeypatch.setattr(field, "metadata", {})
    with pytest.raises(ValueError, match=r"fields without help text: optim\.eps"):
        docs_hooks().render()


def _bash_blocks(markdown: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", markdown, flags=re.S)


def test_the_quickstart_runs_the_readmes_commands() -> None:
    readme = _bash_blocks((ROOT / "README.md").read_text())[0]
    quickstart = (ROOT / "docs" / "quickstart.md").read_text()
    commands = [line for line in readme.splitlines() if line.strip() and not line.startswith("#")]
    assert commands, "the README's first bash block has no command"
    for command in commands:
        assert command in quickstart, f"docs/quickstart.md lacks the README's command {command!r}"


def test_the_readme_names_mkdocs_serve() -> None:
    assert "mkdocs serve" in (ROOT / "README.md").read_text()
