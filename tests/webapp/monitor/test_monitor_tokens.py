"""The token view's per-token texts are decoded on the server with the job's own tokenizer."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from webapp.monitor.events import append_events
from webapp.monitor.tokens import token_texts, with_token_texts

pytestmark = pytest.mark.django_db


@pytest.mark.slow  # builds the tiny model once per session (~7 s, more on a busy machine)
def test_each_token_id_is_decoded_on_its_own_with_the_models_tokenizer(tiny_model_dir: Any) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tokenizer.encode("What is 17 * 23? Use the calculator.")
    texts = token_texts(ids, str(tiny_model_dir))
    assert texts == [tokenizer.decode([i], skip_special_tokens=False) for i in ids]
    assert "".join(texts) == tokenizer.decode(ids, skip_special_tokens=False)


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
    # The trainer's EventStream shape: the payload nested under "data", trajectories without a model name.
    trajectory = {"token_ids": ids, "loss_mask": [0] * 3 + [1] * (len(ids) - 3), "logprobs": [0.0] * len(ids),
                  "reward": 1.0, "segments": []}
    append_events(alice_job.pk, [{"type": "samples", "step": 1, "run": "r", "data": {"trajectories": [trajectory]}}])
    client = Client()
    client.force_login(alice)
    event = client.get(f"/monitor/jobs/{alice_job.pk}/events.json?types=samples").json()["events"][0]
    served = event["data"]["trajectories"][0]
    assert served["tokens"] == [tokenizer.decode([i]) for i in ids]
    stored = alice_job.events.get(type="samples").data["trajectories"][0]
    assert "tokens" not in stored, "the stored row stays as the trainer wrote it"
