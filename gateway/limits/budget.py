"""One request's view of the LLM seam: every call made for its tenant, inside its budget.

`BudgetedLLM` is built for each request around the process's metered tiers, bound to the
request's tenant: it fills the tenant into every `LLMCall` it passes on (the tiers' breakers
count failures per tenant), so the stages and routers that call it never name the tenant. With
quotas kept, the tenant's daily budget is checked before each call (`Quotas.check_budget`:
BudgetExceeded, a 429) and each call's cost recorded after it (`Quotas.record_spend_nowait`),
whichever stage or route makes the call. The decisions and what a refusal is live in
`gateway.limits.quotas`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import replace

from backends.llm.base import LLM, Completion, LLMCall, StreamDelta, WrappedLLM
from backends.redis_client import RequestSpend
from gateway.limits.metering import estimate_usage, settled
from gateway.limits.quotas import BudgetCheck, Quotas
from gateway.settings import TenantConfig


class BudgetedLLM(WrappedLLM):
    """The LLM seam for one request of `tenant`: every model call of every stage and route
    (rewrite, agent turns, final answers, streams) passes through it. `quotas` None: no
    budget is kept, the calls are only made for the tenant. `arrival` is the budget check the
    request's arrival made (`Quotas.admit`): it stands in for the first call's own. `spend`:
    the request's Redis time budget, which its budget checks share with its other Redis calls.

    A call cut before its usage arrived is charged an estimate (`estimate_usage`, the same
    tokens `MeteredLLM` counts): a stream without its final delta (the client hung up, the
    upstream failed after some text) its prompt plus the text so far; a completion cancelled
    while it waits its prompt. A call that failed with nothing answered is not charged. The
    charge is kept without an await, so the cancellation cannot erase it."""

    def __init__(
        self,
        inner: LLM,
        quotas: Quotas | None,
        tenant: TenantConfig,
        arrival: BudgetCheck | None = None,
        spend: RequestSpend | None = None,
    ) -> None:
        super().__init__(inner)
        self._quotas = quotas
        self._tenant = tenant
        self._spend = spend
        self._standing = arrival  # the check that stands for the next call, if any

    async def check_before_stream(self) -> None:
        """Check the budget now, before a stream's headers (a refusal is then a plain 429, not
        a stream's error event); the check stands for the stream's call: one read, not two.
        The check still standing (the arrival's, unless a call such as the rewrite used it)
        stands in for this one while it is fresh and nothing was spent since."""
        if self._quotas is None:
            return
        if self._quotas.stands(self._standing, self._tenant):
            return  # it goes on standing for the stream's call
        self._standing = await self._quotas.check_budget(self._tenant, spend=self._spend)

    async def complete(self, call: LLMCall) -> Completion:
        call = replace(call, tenant=self._tenant.id)
        quotas = self._quotas
        if quotas is None:
            return await self._inner.complete(call)
        await self._check(quotas)
        try:
            completion = await self._inner.complete(call)
        except asyncio.CancelledError:
            usage = estimate_usage(self._inner, call.tier, call.messages, "")
            quotas.record_spend_nowait(self._tenant, usage.cost_usd)
            raise
        self._record(quotas, completion.usage.cost_usd)
        return completion

    async def stream(self, call: LLMCall) -> AsyncIterator[StreamDelta]:
        call = replace(call, tenant=self._tenant.id)
        quotas = self._quotas
        if quotas is None:
            async for delta in self._inner.stream(call):
                yield delta
            return
        await self._check(quotas)

        async def done(delta: StreamDelta) -> None:
            if delta.usage is not None:
                self._record(quotas, delta.usage.cost_usd)

        def cut(text: str, model: str) -> None:
            usage = estimate_usage(self._inner, call.tier, call.messages, text, model)
            quotas.record_spend_nowait(self._tenant, usage.cost_usd)

        async with aclosing(settled(self._inner.stream(call), done, cut)) as deltas:
            async for delta in deltas:
                yield delta

    async def _check(self, quotas: Quotas) -> None:
        """The budget before a call, unless the check standing for it still stands; a check
        stands for one call only."""
        standing, self._standing = self._standing, None
        if not quotas.stands(standing, self._tenant):
            await quotas.check_budget(self._tenant, spend=self._spend)

    def _record(self, quotas: Quotas, usd: float) -> None:
        # Kept at once, sent by a task of its own that nothing waits for: no answer depends
        # on it (this process's next checks count it while it is unconfirmed), and a client
        # that hangs up while it is being sent does not erase a call that was paid for.
        quotas.record_spend_nowait(self._tenant, usd)
