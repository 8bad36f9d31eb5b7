"""The command line silences known third-party notices, and only those: AgentFly's own warnings still show."""

from __future__ import annotations

import logging
import warnings

from trainer.cli import quiet_third_party


def test_third_party_deprecations_are_silenced_and_agentflys_own_warnings_are_not() -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_third_party()
        warnings.warn_explicit("old api", FutureWarning, "x.py", 1, module="transformers.modeling_utils")
        warnings.warn_explicit("old api", DeprecationWarning, "x.py", 1, module="torch.distributed")
        warnings.warn_explicit("ours", FutureWarning, "x.py", 1, module="agentfly.rollout.loop")
        warnings.warn_explicit("ours", UserWarning, "x.py", 1, module="trainer.loop")
        warnings.warn_explicit("a real problem", UserWarning, "x.py", 1, module="transformers.generation")
    assert sorted(str(w.message) for w in seen) == ["a real problem", "ours", "ours"]


def test_math_verifys_timeout_notice_and_deepspeeds_cpu_guess_are_dropped() -> None:
    quiet_third_party()
    assert not logging.getLogger("math_verify.parser").isEnabledFor(logging.WARNING)
    record = logging.LogRecord("DeepSpeed", logging.WARNING, "real_accelerator.py", 213,
                               "Setting accelerator to CPU. If you have GPU ...", None, None)
    assert not logging.getLogger("DeepSpeed").filter(record)
    other = logging.LogRecord("DeepSpeed", logging.WARNING, "x.py", 1, "ZeRO stage 3 needs ...", None, None)
    assert logging.getLogger("DeepSpeed").filter(other)
