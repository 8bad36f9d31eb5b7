"""Reading and writing task samples as JSONL, one JSON object a line."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any


def save_jsonl(samples: Iterable[dict[str, Any]], path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for sample in samples:
            fh.write(json.dumps(sample, ensure_ascii=False) + "\n")
    return path


def load_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Load samples; a malformed line raises ValueError naming the file and line."""
    samples = []
    with Path(path).open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{lineno}: each line must be a JSON object, got {type(obj).__name__}")
            samples.append(obj)
    return samples


def generator_main(generate: Callable[[int, int, str], list[dict[str, Any]]], description: str,
                   argv: Sequence[str] | None = None) -> None:
    """The command line of a generated task: ``python -m agentfly.tasks.NAME --n 1000 --split test --out F``."""
    import argparse

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--split", default="train")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    print(save_jsonl(generate(args.n, args.seed, args.split), args.out))
