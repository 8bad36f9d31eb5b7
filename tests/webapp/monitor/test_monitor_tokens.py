"""The token view's per-token texts are decoded on the server with the job's own tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from trainer.events import samples_event
from webapp.monitor.events import append_events
from webapp.monitor.tokens import token_texts, with_token_texts

pytestmark = pytest.mark.django_db


# A real byte-level BPE tokenizer (the tiny model's, as the shipped calculator warm start saved it).
WARM_START = Path(__file__).resolve().parents[3] / "examples" / "calculator" / "warm_start"
MULTI_BYTE = "Le café coûte 3 € · 中文 · 🙂 ok"


def byte_level_tokenizer() -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(WARM_START / "tokenizer.json"))


def test_characters_spanning_several_byte_level_tokens_are_decoded_whole() -> None:
    tok = byte_level_tokenizer()
    ids = tok.encode(MULTI_BYTE).ids
    assert any("\ufffd" in tok.decode([i]) for i in ids), "the string must split characters across tokens"
    texts = token_texts(ids, str(WARM_START))
    assert texts is not None and len(texts) == len(ids)
    assert "".join(texts) == MULTI_BYTE
    assert not any("\ufffd" in t for t in texts)
    assert {"é", "€", "中", "文", "🙂"} <= set(texts), "each character is one token's text, not split"


def test_each_mask_span_is_decoded_on_its_own_and_joins_to_its_segment_text() -> None:
    tok = byte_level_tokenizer()
    prompt, reply = tok.encode("Question: 中文?").ids, tok.encode(" Réponse 🙂").ids
    ids = prompt + reply
    mask = [0] * len(prompt) + [1] * len(reply)
    texts = token_texts(ids, str(WARM_START), mask)
    assert texts is not None
    assert "".join(texts[:len(prompt)]) == tok.decode(prompt)
    assert "".join(texts[len(prompt):]) == tok.decode(reply)
    assert not any("\ufffd" in t for t in texts)


def test_a_reply_cut_inside_a_character_keeps_the_one_incomplete_character_visible() -> None:
    tok = byte_level_tokenizer()
    ids = tok.encode("ok 🙂").ids
    cut = ids[:-1]  # the emoji's last byte never came (max_new_tokens reached)
    texts = token_texts(cut, str(WARM_START))
    assert texts is not None and "".join(texts) == tok.decode(cut)
    assert "".join(texts).startswith("ok ")


def test_a_trajectory_without_a_local_model_is_served_unchanged(tmp_path: Any) -> None:
    message = {"type": "samples", "seq": 1, "data": {"trajectories": [{"token_ids": [1, 2, 3]}]}}
    assert with_token_texts(message, str(tmp_path / "nowhere"))["data"]["trajectories"][0].get("tokens") is None


@pytest.mark.slow
def test_events_json_adds_token_texts_to_trainer_samples_from_the_jobs_model(alice: Any, alice_job: Any,
                                                                            tiny_model_dir: Any) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tokenizer.encode("2 + 2 = 4")
    alice_job.config = {"model": {"path": str(tiny_model_dir)}}
    alice_job.save(update_fields=["config"])
    # As the trainer's EventStream makes it: trajectories without a model name.
    trajectory = {"token_ids": ids, "loss_mask": [0] * 3 + [1] * (len(ids) - 3), "logprobs": [0.0] * len(ids),
                  "reward": 1.0, "segments": []}
    append_events(alice_job.pk, [samples_event(1, [trajectory], run="r")])
    client = Client()
    client.force_login(alice)
    event = client.get(f"/monitor/jobs/{alice_job.pk}/events.json?types=samples").json()["events"][0]
    served = event["data"]["trajectories"][0]
    assert "".join(served["tokens"][:3]) == tokenizer.decode(ids[:3])
    assert "".join(served["tokens"][3:]) == tokenizer.decode(ids[3:])
    stored = alice_job.events.get(type="samples").data["trajectories"][0]
    assert "tokens" not in stored, "the stored row stays as the trainer wrote it"


@pytest.mark.slow
def test_a_job_that_loads_smollm2_from_its_gguf_file_shows_smollm2s_own_template_token_by_token(
        alice: Any, alice_job: Any, smollm2_gguf: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 12*34?"}], tokenize=False,
                                           add_generation_prompt=True)
    reply = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*34"}}\n</tool_call><|im_end|>'
    ids = tokenizer.encode(prompt + reply, add_special_tokens=False)
    sampled = len(tokenizer.encode(reply, add_special_tokens=False))
    # The job's config as the launch form writes it for SmolLM2: the package folder and the GGUF file in it.
    alice_job.config = {"model": {"path": str(smollm2_gguf.parent), "gguf_file": smollm2_gguf.name}}
    alice_job.save(update_fields=["config"])
    trajectory = {"token_ids": ids, "loss_mask": [0] * (len(ids) - sampled) + [1] * sampled,
                  "logprobs": [0.0] * len(ids), "reward": 1.0, "segments": []}
    append_events(alice_job.pk, [samples_event(1, [trajectory], run="r")])
    client = Client()
    client.force_login(alice)
    event = client.get(f"/monitor/jobs/{alice_job.pk}/events.json?types=samples").json()["events"][0]
    tokens = event["data"]["trajectories"][0]["tokens"]
    assert len(tokens) == len(ids)
    assert tokens[0] == "<|im_start|>" and "".join(tokens[:3]) == "<|im_start|>system\n"
    assert "".join(tokens) == prompt + reply
    assert "You are a helpful AI assistant named SmolLM" in "".join(tokens)  # SmolLM2's template, not a stand-in
    assert "".join(tokens[len(ids) - sampled:]) == reply
