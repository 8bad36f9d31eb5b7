"""Local models for tests and demos."""

from agentfly.models.tiny import build_tiny, chat_template

__all__ = ["build_tiny", "chat_template"]
