"""Every model call of a request inside its tenant's daily budget (`BudgetedLLM`).

The budget is checked before each call (`Quotas.check_before_call`: BudgetExceeded, a 429) and
each call's cost recorded after it (`Quotas.record_spend_nowait`), whichever stage or route
makes the call. The decisions and what a refusal is live in `gateway.limits.quotas`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from contextvars import ContextVar
from dataclasses import replace

from backends.llm.base import LLM, Completion, LLMCall, StreamDelta, WrappedLLM
from gateway.limits.metering import estimate_usage, settled
from gateway.limits.quotas import Quotas
from gateway.settings import TenantConfig

# The tenant whose request is being served: set by the limits middleware, read before and
# after every model call. None outside a request (the CLI, benchmarks): no budget applies.
current_tenant: ContextVar[TenantConfig | None] = ContextVar("quota_tenant", default=None)


class BudgetedLLM(WrappedLLM):
    """The LLM seam with the current request's tenant's budget around every call: checked
    before it (BudgetExceeded), its cost recorded after it. Built once per process around the
    tiers, so every model call of every stage and route (rewrite, agent turns, final answers,
    streams) passes through it. A call outside a request (no tenant) is not budgeted.

    A call cut before its usage arrived is charged an estimate (`estimate_usage`, the same
    tokens `MeteredLLM` counts): a stream without its final delta (the client hung up, the
    upstream failed after some text) its prompt plus the text so far; a completion cancelled
    while it waits its prompt. A call that failed with nothing answered is not charged. The
    charge is kept without an await, so the cancellation cannot erase it."""

    def __init__(self, inner: LLM, quotas: Quotas) -> None:
        super().__init__(inner)
        self._quotas = quotas

    async def complete(self, call: LLMCall) -> Completion:
        tenant = current_tenant.get()
        if tenant is None:  # outside a request: not budgeted
            return await self._inner.complete(call)
        await self._quotas.check_before_call(tenant)
        call = replace(call, tenant=tenant.id)
        try:
            completion = await self._inner.complete(call)
        except asyncio.CancelledError:
            usage = estimate_usage(self._inner, call.tier, call.messages, "")
            self._quotas.record_spend_nowait(tenant, usage.cost_usd)
            raise
        await self._record(tenant, completion.usage.cost_usd)
        return completion

    async def stream(self, call: LLMCall) -> AsyncIterator[StreamDelta]:
        tenant = current_tenant.get()
        if tenant is None:  # outside a request: not budgeted
            async for delta in self._inner.stream(call):
                yield delta
            return
        await self._quotas.check_before_call(tenant)
        call = replace(call, tenant=tenant.id)
        budgeted = tenant

        async def done(delta: StreamDelta) -> None:
            if delta.usage is not None:
                await self._record(budgeted, delta.usage.cost_usd)

        def cut(text: str, model: str) -> None:
            usage = estimate_usage(self._inner, call.tier, call.messages, text, model)
            self._quotas.record_spend_nowait(budgeted, usage.cost_usd)

        async with aclosing(settled(self._inner.stream(call), done, cut)) as deltas:
            async for delta in deltas:
                yield delta

    async def _record(self, tenant: TenantConfig, usd: float) -> None:
        # Kept at once, sent by a task of its own that nothing waits for: no answer depends
        # on it (this process's next checks count it while it is unconfirmed), and a client
        # that hangs up while it is being sent does not erase a call that was paid for.
        self._quotas.record_spend_nowait(tenant, usd)
