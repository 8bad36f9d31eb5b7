"""``trackers`` and ``tracker_options`` in the config: checked when loaded, with errors that name the fix."""

from __future__ import annotations

import pytest

from trainer.config import ConfigError, load_config


def test_a_misspelt_tracker_is_refused_with_the_name_it_is_close_to() -> None:
    with pytest.raises(ConfigError, match=r"trackers\[1\]: 'wandbb' is not one of .*did you mean 'wandb'"):
        load_config(None, ["trackers=[tensorboard, wandbb]"])


def test_a_tracker_named_twice_is_refused() -> None:
    with pytest.raises(ConfigError, match="trackers lists mlflow twice; name each tracker once"):
        load_config(None, ["trackers=[mlflow, mlflow]"])


def test_options_of_a_tracker_that_is_not_on_name_the_trackers_line_to_write() -> None:
    with pytest.raises(ConfigError, match=r"tracker_options.wandb is set but wandb is not in trackers; add it "
                                          r"\(trackers: \[mlflow, wandb\]\)"):
        load_config(None, ["trackers=[mlflow]", "tracker_options.wandb.project=calc"])


def test_an_unknown_tracker_option_names_the_key_it_is_close_to() -> None:
    with pytest.raises(ConfigError, match=r"unknown config key 'tracker_options\.mlflow\.tracking_url'; did you "
                                          r"mean 'tracker_options\.mlflow\.tracking_uri'"):
        load_config(None, ["trackers=[mlflow]", "tracker_options.mlflow.tracking_url=file:/tmp/x"])


def test_the_older_tensorboard_switch_still_turns_tensorboard_on() -> None:
    assert load_config(None, ["tensorboard=true", "trackers=[wandb]"]).resolved_trackers == ["tensorboard", "wandb"]
    config = load_config(None, ["tensorboard=true", "tracker_options.tensorboard.logdir=/tmp/tb"])
    assert config.resolved_trackers == ["tensorboard"]
