"""The agent loop's hard caps: its configuration section, and what one run spends against it.

Caps are hard: before each call the loop projects its tokens (the last prompt plus what was
added since, plus the call's completion limit) and prices them at the tier's dearest rates.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, Field

from backends.llm.base import Usage
from backends.sections import SECTION
from routers.agent_tools import MAX_SEARCH_K
from routers.types import Cap

# For text the upstream has not counted yet. English runs ~4 characters a token; 3 leaves a
# margin for code and identifiers (not for CJK text, which can run near 1).
CHARS_PER_TOKEN = 3


class AgentConfig(BaseModel):
    """The `agent:` section: the loop's hard caps and its tools' limits."""

    model_config = SECTION

    max_steps: int = Field(default=4, ge=1, le=20, description="model turns that may use tools")
    max_tool_calls: int = Field(default=12, ge=1, le=100)
    max_tokens: int = Field(default=24_000, ge=100, description="prompt + completion, all calls")
    deadline_s: float = Field(default=30.0, gt=0)
    max_cost_usd: float = Field(default=0.10, ge=0)
    # Completion limit of each model call of the loop, the forced final answer included.
    step_max_tokens: int = Field(default=512, ge=16)
    # Share of the deadline kept for the forced final answer.
    final_share: float = Field(default=0.25, gt=0, lt=1)
    tool_timeout_s: float = Field(default=5.0, gt=0)
    search_k: int = Field(default=6, ge=1, le=MAX_SEARCH_K)
    read_max_chunks: int = Field(default=4, ge=1, le=20)
    min_similarity: float = Field(default=0.3, ge=-1, le=1)


@dataclass(slots=True)
class Budget:
    """What one run has spent against its caps, and the cap a next call would break."""

    config: AgentConfig
    # USD per (prompt, completion) token of the tier.
    prices: tuple[float, float]
    started: float
    tool_turns: int = 0
    tool_calls: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    last_prompt_tokens: int = 0
    # Characters appended to the conversation since the last call was counted.
    pending_chars: int = 0

    def charge(self, usage: Usage) -> None:
        self.tokens += usage.prompt_tokens + usage.completion_tokens
        self.cost_usd += usage.cost_usd
        self.last_prompt_tokens = usage.prompt_tokens
        self.pending_chars = 0

    def breaks(self, prompt_tokens: int, prices: tuple[float, float] | None = None) -> Cap | None:
        """The cap a call with this prompt (and the step completion limit) could break, at the
        loop tier's prices or those given (another tier's)."""
        completion = self.config.step_max_tokens
        if self.tokens + prompt_tokens + completion > self.config.max_tokens:
            return "tokens"
        prompt_price, completion_price = prices or self.prices
        cost = prompt_tokens * prompt_price + completion * completion_price
        if self.cost_usd + cost > self.config.max_cost_usd:
            return "cost"
        return None

    def next_prompt_tokens(self) -> int:
        return self.last_prompt_tokens + self.pending_chars // CHARS_PER_TOKEN

    def cap_reached(self) -> Cap | None:
        if self.tool_turns >= self.config.max_steps:
            return "steps"
        if self.tool_calls >= self.config.max_tool_calls:
            return "tool_calls"
        return self.breaks(self.next_prompt_tokens())
