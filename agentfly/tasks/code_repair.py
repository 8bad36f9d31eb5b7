"""Code repair: a small Python project whose unit tests fail because one line was mutated; fix the code.

Each sample is a project made here, offline: a package of 2-3 modules, each a few functions drawn from
``FUNCTIONS`` with names and constants of its own, and a ``tests/`` folder with a test per function whose
expected values were computed by running the correct code. One function is then mutated, as mutation
testing does (an arithmetic or comparison operator swapped, a bound moved by one, a condition negated), and
kept only when the mutant fails at least one test. The agent works in the rollout's ``workspace`` (the
project as a git repository) with ``bash``, ``read_file``, ``write_file`` and ``run_tests``; the reward
(``agentfly.rewards.builtin.repair:repair_tests``) is the share of the project's tests that pass after its
edits, and nothing when it touched the tests.

Splits are by code, not by sample: every function (its shape and constants) belongs to one split by a hash,
so no function of a held-out project was seen, under any name, in training.

    python -m agentfly.tasks.code_repair --n 200 --split test --out runs/repair-test.jsonl
"""

from __future__ import annotations

import ast
import hashlib
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from agentfly.tasks.base import FlawError, Flaws, Messages, Sample, Task, register

QUESTION = ("The unit tests of the project {package} in /workspace fail: one line of its code has a bug. Run the "
            "tests, read the code, fix the bug (do not change the tests), run the tests again, then answer 'done'.")
SPLIT_SHARES = (("test", 2), ("sft", 2), ("train", 6))  # tenths of the functions each split owns (by hash)
WORDS = ("alpha", "bravo", "cargo", "delta", "ember", "flint", "grove", "harbor", "iris", "jolt", "kite", "lumen",
         "maple", "nova", "orbit", "pixel", "quill", "raven", "sable", "tidal", "umber", "vapor", "willow", "zephyr")
NOUNS = ("stock", "score", "level", "batch", "span", "tally", "ledger", "signal", "budget", "queue", "track", "meter")


@dataclass(frozen=True)
class Template:
    """A function family: ``source(name, c)`` writes its code with constants ``c``; ``cases(rng, c)`` draws the
    argument tuples its tests call it with."""

    kind: str
    constants: Callable[[random.Random], tuple[int, ...]]
    source: Callable[[str, tuple[int, ...]], str]
    cases: Callable[[random.Random, tuple[int, ...]], list[tuple[Any, ...]]]


def _ints(rng: random.Random, n: int, lo: int = -9, hi: int = 20) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


FUNCTIONS: tuple[Template, ...] = (
    Template("clamp", lambda r: (r.randint(0, 5), r.randint(10, 30)),
             lambda n, c: f"def {n}(x):\n    if x < {c[0]}:\n        return {c[0]}\n    if x > {c[1]}:\n"
                          f"        return {c[1]}\n    return x\n",
             lambda r, c: [(c[0] - 1,), (c[0],), (c[1],), (c[1] + 2,), (r.randint(c[0] + 1, c[1] - 1),)]),
    Template("count_above", lambda r: (r.randint(0, 10),),
             lambda n, c: f"def {n}(values):\n    total = 0\n    for v in values:\n        if v > {c[0]}:\n"
                          "            total += 1\n    return total\n",
             lambda r, c: [([*_ints(r, 6, 0, 20), c[0]],), ([c[0], c[0] + 1],), ([],)]),
    Template("window_sums", lambda r: (r.randint(2, 3),),
             lambda n, c: f"def {n}(values):\n    sums = []\n    for i in range(len(values) - {c[0]} + 1):\n"
                          f"        sums.append(sum(values[i:i + {c[0]}]))\n    return sums\n",
             lambda r, c: [(_ints(r, 6),), (_ints(r, c[0]),), (_ints(r, 4, 0, 9),)]),
    Template("scaled", lambda r: (r.randint(2, 9), r.randint(1, 9)),
             lambda n, c: f"def {n}(x):\n    return x * {c[0]} + {c[1]}\n",
             lambda r, c: [(0,), (r.randint(1, 9),), (-r.randint(1, 9),)]),
    Template("first_at_least", lambda r: (r.randint(3, 12),),
             lambda n, c: f"def {n}(values):\n    for i, v in enumerate(values):\n        if v >= {c[0]}:\n"
                          "            return i\n    return -1\n",
             lambda r, c: [([*_ints(r, 5, 0, c[0] - 1), c[0], c[0] + 3],), (_ints(r, 4, 0, c[0] - 1),),
                           ([c[0] + 1, c[0]],)]),
    Template("sum_until", lambda r: (r.randint(10, 30),),
             lambda n, c: f"def {n}(values):\n    total = 0\n    for v in values:\n        if total + v > {c[0]}:\n"
                          "            break\n        total += v\n    return total\n",
             lambda r, c: [(_ints(r, 8, 1, 9),), ([c[0], 1],), ([1, 2, 3],)]),
    Template("label", lambda r: (r.randint(2, 4), r.randint(5, 7)),
             lambda n, c: f"def {n}(k):\n    if k % {c[0]} == 0 and k % {c[1]} == 0:\n        return 'both'\n"
                          f"    if k % {c[0]} == 0:\n        return 'first'\n    if k % {c[1]} == 0:\n"
                          "        return 'second'\n    return str(k)\n",
             lambda r, c: [(c[0] * c[1],), (c[0],), (c[1],), (c[0] * c[1] + 1,)]),
    Template("digit_total", lambda r: (10,),
             lambda n, c: f"def {n}(k):\n    k = abs(k)\n    total = 0\n    while k > 0:\n        total += k % {c[0]}\n"
                          f"        k //= {c[0]}\n    return total\n",
             lambda r, c: [(r.randint(100, 9999),), (0,), (-r.randint(10, 99),)]),
    Template("running_max", lambda r: (0,),
             lambda n, c: f"def {n}(values):\n    out = []\n    best = None\n    for v in values:\n"
                          "        if best is None or v > best:\n            best = v\n        out.append(best)\n"
                          "    return out\n",
             lambda r, c: [(_ints(r, 6),), ([3, 3, 1],), ([],)]),
    Template("span", lambda r: (r.randint(0, 3),),
             lambda n, c: f"def {n}(values):\n    if len(values) <= {c[0]}:\n        return 0\n"
                          "    return max(values) - min(values)\n",
             lambda r, c: [(_ints(r, c[0] + 3),), (_ints(r, c[0]) or [1],), (_ints(r, c[0] + 1),)]),
    Template("power_sum", lambda r: (r.randint(2, 3),),
             lambda n, c: f"def {n}(k):\n    total = 0\n    for i in range(1, k + 1):\n        total += i ** {c[0]}\n"
                          "    return total\n",
             lambda r, c: [(r.randint(2, 6),), (1,), (0,)]),
    Template("between", lambda r: (r.randint(-5, 5), r.randint(6, 15)),
             lambda n, c: f"def {n}(x):\n    return {c[0]} <= x and x < {c[1]}\n",
             # A value strictly inside; with no room between the bounds (5 and 6) the upper bound again.
             lambda r, c: [(c[0],), (c[1],), (c[0] - 1,), (r.randint(c[0] + 1, max(c[0] + 1, c[1] - 1)),)]),
)


def _split_of(key: str) -> str:
    """The split that owns ``key`` (a function's family and constants, a package's name), by a stable hash."""
    bucket = int(hashlib.sha256(key.encode()).hexdigest(), 16) % 10
    for split, share in SPLIT_SHARES:
        if bucket < share:
            return split
        bucket -= share
    return "train"


def _function(rng: random.Random, split: str, taken: set[str]) -> tuple[Template, tuple[int, ...], str]:
    """A function of ``split``'s own: a family, constants the split owns, and a name not yet in the project."""
    while True:
        template = rng.choice(FUNCTIONS)
        constants = template.constants(rng)
        name = f"{rng.choice(NOUNS)}_{template.kind}"
        if _split_of(f"{template.kind}:{constants}") == _owner(split) and name not in taken:
            return template, constants, name


def _owner(split: str) -> str:
    """The split whose code ``split`` draws (another name, e.g. "demo", draws the training split's)."""
    return split if split in {s for s, _ in SPLIT_SHARES} else "train"


class _Mutator(ast.NodeTransformer):
    """Changes the ``target``-th mutable spot of a function, one of: an operator, a bound, a condition."""

    SWAPS: ClassVar[dict[type, type]] = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Add, ast.FloorDiv: ast.Mod,
                               ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult, ast.Lt: ast.LtE, ast.LtE: ast.Lt,
                               ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.And: ast.Or}

    def __init__(self, target: int) -> None:
        self.target, self.seen, self.done = target, 0, ""

    def _hit(self) -> bool:
        self.seen += 1
        return self.seen - 1 == self.target

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        if type(node.op) in self.SWAPS and self._hit():
            node.op, self.done = self.SWAPS[type(node.op)](), "operator"
        return node

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        if type(node.ops[0]) in self.SWAPS and self._hit():
            node.ops = [self.SWAPS[type(node.ops[0])](), *node.ops[1:]]
            self.done = "comparison"
        return node

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.AST:
        self.generic_visit(node)
        if type(node.op) in self.SWAPS and self._hit():
            node.op, self.done = ast.Or(), "condition"
        return node

    def visit_If(self, node: ast.If) -> ast.AST:
        self.generic_visit(node)
        if self._hit():
            node.test, self.done = ast.UnaryOp(ast.Not(), node.test), "condition"
        return node

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if isinstance(node.value, int) and not isinstance(node.value, bool) and self._hit():
            self.done = "bound"
            return ast.copy_location(ast.Constant(node.value + 1), node)
        return node


class _TooLong(BaseException):  # not an Exception: the test's own ``except Exception`` must not swallow it
    """A mutant ran past ``STEP_LIMIT`` lines: a loop whose bound the mutation broke."""


STEP_LIMIT = 20_000


def _bounded(function: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """``function(*args)``, stopped after ``STEP_LIMIT`` executed lines (a mutant may loop forever; a trace
    works in any thread, where an alarm would not)."""
    steps = 0

    def trace(frame: Any, event: str, arg: Any) -> Any:
        nonlocal steps
        steps += 1
        if steps > STEP_LIMIT:
            raise _TooLong
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        return function(*args)
    finally:
        sys.settrace(previous)


def _run_tests(modules: dict[str, str], tests: list[tuple[str, str, tuple[Any, ...], Any]]) -> list[bool]:
    """Which of ``tests`` (module, function, args, expected) pass against ``modules``' code, run here (it is
    this generator's own code, mutated: a mutant that loops is stopped with ``_TooLong``)."""
    spaces: dict[str, dict[str, Any]] = {}
    for module, source in modules.items():
        spaces[module] = {}
        exec(compile(source, module, "exec"), spaces[module])
    results = []
    for module, function, args, expected in tests:
        try:
            results.append(_bounded(spaces[module][function], args) == expected)
        except Exception:
            results.append(False)
    return results


def make_project(rng: random.Random, split: str, index: int) -> Sample | None:
    """One project with one mutated function, or None when the drawn mutant fails no test (draw again)."""
    package = f"{rng.choice(WORDS)}_{rng.choice(WORDS)}"
    while _split_of(package) != _owner(split):  # a held-out project's name is never a training one's either
        package = f"{rng.choice(WORDS)}_{rng.choice(WORDS)}"
    modules: dict[str, str] = {}
    tests: list[tuple[str, str, tuple[Any, ...], Any]] = []
    taken: set[str] = set()
    for m in range(rng.randint(2, 3)):
        module = f"{rng.choice(NOUNS)}s{m}"
        sources = []
        for _ in range(rng.randint(2, 3)):
            template, constants, name = _function(rng, split, taken)
            taken.add(name)
            sources.append(template.source(name, constants))
            space: dict[str, Any] = {}
            exec(compile(sources[-1], name, "exec"), space)
            for args in template.cases(rng, constants):
                tests.append((module, name, args, space[name](*args)))
        modules[module] = "\n\n".join(sources)
    # Mutate one spot of one module; keep the mutant only if some test catches it.
    module = rng.choice(sorted(modules))
    tree = ast.parse(modules[module])
    counter = _Mutator(-1)
    counter.visit(ast.parse(modules[module]))
    mutator = _Mutator(rng.randrange(counter.seen))
    broken = ast.unparse(mutator.visit(tree)) + "\n"
    fixed = ast.unparse(ast.parse(modules[module])) + "\n"
    try:
        passed = _run_tests({**modules, module: broken}, tests)
    except _TooLong:
        return None  # its tests would hang until the workspace's time limit: no lesson in that
    if all(passed):
        return None
    files = {f"{package}/__init__.py": ""}
    files.update({f"{package}/{name}.py": (broken if name == module else ast.unparse(ast.parse(src)) + "\n")
                  for name, src in modules.items()})
    test_files: dict[str, str] = {}
    for name in modules:
        cases = [t for t in tests if t[0] == name]
        body = [f"from {package}.{name} import {', '.join(sorted({t[1] for t in cases}))}\n"]
        for k, (_, function, args, expected) in enumerate(cases):
            call = f"{function}({', '.join(repr(a) for a in args)})"
            body.append(f"\ndef test_{function}_{k}():\n    assert {call} == {expected!r}\n")
        test_files[f"tests/test_{name}.py"] = "\n".join(body)
    files.update(test_files)
    return {"id": f"{split}-{index}", "project": package, "question": QUESTION.format(package=package), "files": files,
            "test_files": test_files, "n_tests": len(tests), "baseline": sum(passed) / len(tests),
            "bug": {"file": f"{package}/{module}.py", "kind": mutator.done}, "fixed": {f"{package}/{module}.py": fixed}}


def generate(n: int, seed: int = 0, split: str = "train") -> list[Sample]:
    """``n`` projects of ``split`` (disjoint code across splits, see the module docstring)."""
    rng = random.Random(f"code_repair:{split}:{seed}")
    samples: list[Sample] = []
    while len(samples) < n:
        project = make_project(rng, split, len(samples))
        if project is not None:
            project["id"] = f"{split}-{seed}-{len(samples)}"
            samples.append(project)
    return samples


def call(name: str, **arguments: str) -> str:
    import json

    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def demonstration(sample: Sample, fix: bool = True, check: bool = True) -> Messages:
    """A worked repair in the Hermes format: run the tests, read the buggy file, write the fixed file, run the
    tests again, answer. ``fix=False`` is the careless demonstrator: it rewrites the file unchanged (the bug
    stays); ``check=False`` the hasty one, who answers without running the tests again. Tool observations are
    the gist of what the workspace answers (a demonstration is text; RL sees the real ones)."""
    (path, fixed), = sample["fixed"].items()
    broken = sample["files"][path]
    failing = round((1 - sample["baseline"]) * sample["n_tests"])
    messages: Messages = [{"role": "user", "content": sample["question"]},
                          {"role": "assistant", "content": call("run_tests")},
                          {"role": "tool", "name": "run_tests",
                           "content": f"{failing} failed, {sample['n_tests'] - failing} passed\n[exit code 1]"},
                          {"role": "assistant", "content": call("read_file", path=path)},
                          {"role": "tool", "name": "read_file", "content": broken},
                          {"role": "assistant", "content": call("write_file", path=path, content=fixed if fix else broken)},
                          {"role": "tool", "name": "write_file",
                           "content": f"wrote {len((fixed if fix else broken).encode())} bytes to {path}"}]
    if check:
        outcome = f"{sample['n_tests']} passed" if fix else f"{failing} failed, {sample['n_tests'] - failing} passed"
        messages += [{"role": "assistant", "content": call("run_tests")},
                     {"role": "tool", "name": "run_tests", "content": outcome}]
    messages.append({"role": "assistant", "content": "done"})
    return messages


def demonstrations(n: int, seed: int, flaws: Flaws) -> list[tuple[Sample, Messages]]:
    """``n`` demonstrations from the 'sft' split: with habit ``skip_check``, a share ``flaws.habit_fraction`` of the
    questions opening with ``flaws.habit_phrasings`` answer without running the tests again, and a share
    ``flaws.wrong_fraction`` of the others leave the bug in place."""
    if flaws.habit_phrasings and flaws.habit != "skip_check":
        raise FlawError("habit", f"habit={flaws.habit!r} is not a code_repair habit; code_repair's is skip_check")
    samples = generate(n, seed=seed, split="sft")
    hasty, wrong = flaws.pick(samples, flaws.rng())
    return [(s, demonstration(s, fix=i not in wrong, check=i not in hasty)) for i, s in enumerate(samples)]


TOOLS = tuple(f"agentfly.tools.builtin.workspace:{name}" for name in ("bash", "read_file", "write_file", "run_tests"))
REWARD = "agentfly.rewards.builtin.repair:repair_tests"
TASK = register(Task(
    name="code_repair",
    title="Code repair: fix a mutated line of a generated Python project until its tests pass (workspace, git, pytest)",
    samples=lambda split, n, seed: generate(n, seed=seed, split=split), tools=TOOLS, reward=REWARD,
    demonstrations=demonstrations, habits=("skip_check",)))


def main(argv: list[str] | None = None) -> None:
    from agentfly.tasks.io import generator_main

    generator_main(generate, (__doc__ or "").splitlines()[0], argv)


if __name__ == "__main__":
    main()

__all__ = ["FUNCTIONS", "TASK", "demonstration", "demonstrations", "generate", "make_project"]
