"""LLM tiers (small, large) through litellm: completions, streaming, tool calls, cost."""

from backends.llm.base import (
    LLM,
    Completion,
    Message,
    StreamDelta,
    TierConfig,
    ToolCall,
    Usage,
)

__all__ = ["LLM", "Completion", "Message", "StreamDelta", "TierConfig", "ToolCall", "Usage"]
