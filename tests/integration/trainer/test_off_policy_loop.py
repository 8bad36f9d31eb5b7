"""The off-policy correction in the training loop (sync mode): its metrics are events, and a bad band is refused."""

from __future__ import annotations

import pytest

from trainer.config import ConfigError, load_config
from trainer.events import CallbackSink
from trainer.loop import Trainer

REWARD = "rollout.reward=rewards_for_tests:answer_length"


@pytest.mark.parametrize(("kind", "fraction"), [("tis", "off_policy/truncated_fraction"),
                                                ("mis", "off_policy/masked_fraction")])
def test_a_sync_step_weighs_tokens_by_the_engines_behaviour_logprobs_and_reports_the_weights(
    tiny_model_dir, tmp_path, tiny_overrides, kind, fraction
):
    events: list[dict] = []
    config = load_config(None, tiny_overrides(tiny_model_dir, tmp_path / kind, REWARD, "steps=1",
                                              f"algorithm.off_policy_correction={kind}"))
    Trainer(config, sinks=[CallbackSink(events.append)]).train()
    step = next(e["data"] for e in events if e["type"] == "metrics" and "time/rollout" in e["data"])
    # The HF engine samples with the trainer's own module: the behaviour policy is the trainer's, so every
    # weight is 1 up to numerics (a vLLM engine's mismatch is what this corrects).
    assert step["off_policy/weight_mean"] == pytest.approx(1.0, abs=1e-3)
    assert step["off_policy/weight_max"] == pytest.approx(1.0, abs=1e-2)
    assert step[fraction] == 0.0


def test_an_mis_band_without_the_on_policy_ratio_names_the_setting(tiny_model_dir, tmp_path, tiny_overrides):
    with pytest.raises(ConfigError, match=r"algorithm\.mis_band=\[1\.5, 2\.0\] must be \[low, high\] with low <= 1"):
        load_config(None, tiny_overrides(tiny_model_dir, tmp_path, "algorithm.mis_band=[1.5, 2.0]"))
