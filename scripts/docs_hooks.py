"""MkDocs hook (``hooks:`` in mkdocs.yml): the configuration reference, generated from ``trainer/config.py``.

Every key of ``trainer.config.Config`` (nested sections included) becomes a row with its type, default and
help text, so the page cannot drift from the code. A field without help text stops the build, naming it.

    python scripts/docs_hooks.py    # print the page
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # mkdocs loads hooks by path; trainer/ must be importable from the checkout
    sys.path.insert(0, str(ROOT))

PAGE = "reference/config.md"

INTRO = """# Configuration reference

Generated from the dataclasses in `trainer/config.py` when the site is built; do not edit by hand.
A run's YAML fills these (`agentfly train CONFIG.yaml`), `--set key=value` overrides one
(`--set algorithm.name=rloo`, `--set rollout.tools=[my_tools:lookup]`), and `agentfly train --help-config`
prints the same list in a terminal. Loading refuses an unknown key (naming the nearest one), a value of the
wrong type, outside its choices or its bounds (in brackets after the help, with where the web app's launch
form or REST API takes the setting), and a combination that cannot work, saying which key to change.
"""


def _fields(cls: type, prefix: str = "") -> list[tuple[str, Any, dataclasses.Field[Any]]]:
    hints = typing.get_type_hints(cls)
    return [(f"{prefix}{f.name}", hints[f.name], f) for f in dataclasses.fields(cls)]


def _section_type(tp: Any) -> type | None:
    """The dataclass a field opens a section of: itself, the values of a ``dict[str, <dataclass>]``
    (``resources.<name>``), or an optional one (``resources.<name>.api``)."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return tp
    if typing.get_origin(tp) is dict:
        value = typing.get_args(tp)[1]
        if isinstance(value, type) and dataclasses.is_dataclass(value):
            return value
    if typing.get_origin(tp) in (types.UnionType, typing.Union):
        found = [a for a in typing.get_args(tp) if isinstance(a, type) and dataclasses.is_dataclass(a)]
        if len(found) == 1:
            return found[0]
    return None


def _section_key(key: str, tp: Any) -> str:
    return f"{key}.<name>" if typing.get_origin(tp) is dict else key


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if callable(f.default_factory) else None


def _yaml(value: Any) -> str:
    import yaml

    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("\n...").removesuffix(" ...")


def sections(cls: type | None = None, prefix: str = "", title: str = "Top level"
             ) -> list[tuple[str, str, list[tuple[str, str, str, str]]]]:
    """``[(title, help, [(key, type, default, help), ...]), ...]``: one section per dataclass, depth first."""
    from trainer.config import Config, _type_name, field_notes

    cls = cls or Config
    rows: list[tuple[str, str, str, str]] = []
    nested: list[tuple[str, str, list[tuple[str, str, str, str]]]] = []
    for key, tp, f in _fields(cls, prefix):
        help_text = str(f.metadata.get("help", "")).strip()
        section = _section_type(tp)
        if section is not None:
            if not isinstance(tp, type):  # a mapping of sections: its own row too (default {})
                rows.append((key, _type_name(tp), _yaml(_default(f)), help_text))
            sub_key = _section_key(key, tp)
            for sub_title, sub_help, sub_rows in sections(section, f"{sub_key}.", sub_key):
                nested.append((sub_title, sub_help or help_text, sub_rows))
            continue
        rows.append((key, _type_name(tp), _yaml(_default(f)), field_notes(f.metadata)))
    return [(title, "", rows), *nested]


def missing_help() -> list[str]:
    """Dotted keys (sections included) whose field has no help text."""
    from trainer.config import Config

    def walk(cls: type, prefix: str) -> list[str]:
        out = []
        for key, tp, f in _fields(cls, prefix):
            if not str(f.metadata.get("help", "")).strip():
                out.append(key)
            section = _section_type(tp)
            if section is not None:
                out += walk(section, f"{_section_key(key, tp)}.")
        return out

    return walk(Config, "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    missing = missing_help()
    if missing:
        raise ValueError(f"trainer/config.py: fields without help text: {', '.join(missing)}; give each a help "
                         "string (the second argument of _f)")
    parts = [INTRO]
    for title, help_text, rows in sections():
        parts.append(f"\n## `{title}`\n" if title != "Top level" else "\n## Top level\n")
        if help_text:
            parts.append(f"{help_text}\n")
        if rows:
            parts.append("\n| key | type | default | help |\n| --- | --- | --- | --- |")
            parts += [f"| `{key}` | {_cell(tp)} | `{_cell(default)}` | {_cell(help_)} |"
                      for key, tp, default, help_ in rows]
        parts.append("")
    return "\n".join(parts) + "\n"


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render()))
    return files


if __name__ == "__main__":
    print(render())
