"""Methods a vLLM server's workers gain with ``--worker-extension-cls agentfly.engines.remote_worker.WeightSync``.

A server's ``/collective_rpc`` endpoint (``VLLM_SERVER_DEV_MODE=1``) calls a worker method by name with string
arguments only, so the weight sync of ``RemoteEngine`` is one method here that takes a path: it reloads the
model in place from the safetensors the trainer saved there, then rebuilds what the CPU backend derived from
the old weights (a tied ``lm_head``'s packed GEMM handle; see ``agentfly.engines.vllm._refresh_tied_head``).
This module is imported inside the server process only; it never imports vLLM at the top.
"""

from __future__ import annotations

from typing import Any


class WeightSync:
    """Mixed into the vLLM worker class by vLLM itself (so ``self`` is the worker)."""

    model_runner: Any

    def agentfly_reload(self, weights_path: str) -> str:
        """Load every tensor of the ``*.safetensors`` files in ``weights_path`` into the live model."""
        from agentfly.engines.vllm import _refresh_tied_head

        self.model_runner.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
        _refresh_tied_head(self.model_runner.get_model())
        return "ok"
