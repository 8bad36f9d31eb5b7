"""Generation engines behind one interface: ``HFEngine`` (transformers) and ``VLLMEngine`` (vLLM)."""

from agentfly.engines.base import Engine, Generation, Sampling
from agentfly.engines.replay import ReplayEngine

__all__ = ["Engine", "Generation", "HFEngine", "ReplayEngine", "Sampling", "VLLMEngine"]


def __getattr__(name: str) -> type[Engine]:  # heavy engines import torch/vllm only when asked for
    if name == "HFEngine":
        from agentfly.engines.hf import HFEngine

        return HFEngine
    if name == "VLLMEngine":
        from agentfly.engines.vllm import VLLMEngine

        return VLLMEngine
    raise AttributeError(name)
