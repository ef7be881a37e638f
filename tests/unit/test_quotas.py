"""Rate limits and budgets: the bucket and budget maths on a fake clock, refusals, tenant
isolation, the per-process fallback while the shared store is down, and the LLM seam."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator, Callable, Coroutine
from types import SimpleNamespace
from typing import Any, cast

import pytest
from pydantic import ValidationError

from backends.errors import BackendUnavailable, UpstreamError
from backends.llm.base import Completion, LLMCall, Message, StreamDelta, Tier, Usage
from backends.quotas.memory import MemoryQuotaStore, refill_and_take
from backends.redis_client import RequestBudgetSpent, RequestSpend
from gateway.core.health import probes
from gateway.core.services import Services
from gateway.limits.budget import BudgetedLLM
from gateway.limits.metering import MeteredLLM, estimate_usage
from gateway.limits.quotas import (
    BudgetExceeded,
    Quotas,
    RateLimited,
    retry_after,
    seconds_to_midnight,
    warn_if_per_worker,
)
from gateway.limits.shared_store import SharedStore, utc_day
from gateway.obs.metrics import MULTIPROC_ENV, Metrics
from gateway.settings import QuotasConfig, TenantConfig
from tests.metrics import Scrape

DIGEST = "0" * 64
NOON = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC).timestamp()


class Clock:
    def __init__(self, now: float = NOON) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def tenant(
    name: str = "acme",
    rate: float | None = None,
    burst: int = 1,
    budget: float | None = None,
) -> TenantConfig:
    fields: dict[str, Any] = {"id": name, "api_key_sha256": DIGEST if name == "acme" else "1" * 64}
    if rate is not None:
        fields["rate_limit"] = {"requests_per_s": rate, "burst": burst}
    if budget is not None:
        fields["daily_budget_usd"] = budget
    return TenantConfig.model_validate(fields)


def quotas(clock: Clock, shared: Any = None, metrics: Metrics | None = None) -> Quotas:
    return Quotas(shared, metrics or Metrics(), retry_s=1.0, clock=clock, monotonic=clock)


# -- the maths --------------------------------------------------------------------------------


def test_a_full_bucket_gives_burst_tokens_then_says_when_the_next_comes() -> None:
    tokens, now, waits = 3.0, 0.0, []
    for _ in range(4):
        tokens, wait = refill_and_take(tokens, now, now, rate_per_s=0.5, burst=3)
        waits.append(wait)
    assert waits == [0.0, 0.0, 0.0, 2.0]


def test_a_bucket_refills_at_its_rate_and_never_above_burst() -> None:
    assert refill_and_take(0.0, 0.0, 1.0, rate_per_s=0.5, burst=3) == (0.5, 1.0)
    assert refill_and_take(0.0, 0.0, 2.0, rate_per_s=0.5, burst=3) == (0.0, 0.0)
    assert refill_and_take(0.0, 0.0, 1000.0, rate_per_s=0.5, burst=3) == (2.0, 0.0)


def test_a_clock_that_goes_backwards_refills_nothing() -> None:
    assert refill_and_take(0.0, 10.0, 5.0, rate_per_s=1.0, burst=3) == (0.0, 1.0)


async def test_the_memory_store_shares_one_bucket_per_tenant_on_its_clock() -> None:
    clock = Clock(0.0)
    store = MemoryQuotaStore(clock)
    assert [await store.take("acme", 1.0, 2) for _ in range(3)] == [0.0, 0.0, 1.0]
    assert await store.take("globex", 1.0, 2) == 0.0  # its own bucket
    clock.now = 0.25
    assert await store.take("acme", 1.0, 2) == pytest.approx(0.75)
    clock.now = 1.0
    assert await store.take("acme", 1.0, 2) == 0.0


async def test_the_memory_store_adds_spend_per_tenant_and_day() -> None:
    store = MemoryQuotaStore()
    assert await store.add_spend("acme", "2026-11-30", 0.25) == 0.25
    assert await store.add_spend("acme", "2026-11-30", 0.5) == 0.75
    assert await store.spent("globex", "2026-11-30") == 0.0
    await store.add_spend("acme", "2026-12-01", 0.1)
    assert await store.spent("acme", "2026-12-01") == 0.1
    assert await store.spent("acme", "2026-11-30") == 0.0  # the day is over: dropped


def test_retry_after_is_whole_seconds_and_never_zero() -> None:
    assert [retry_after(w) for w in (0.001, 0.5, 1.0, 1.01, 2.5)] == [1, 1, 1, 2, 3]


def test_the_budget_day_is_the_utc_day_and_resets_at_utc_midnight() -> None:
    assert utc_day(NOON) == "2026-11-30"
    assert seconds_to_midnight(NOON) == 12 * 3600
    assert seconds_to_midnight(NOON + 12 * 3600 - 0.2) == 1
    assert utc_day(NOON + 12 * 3600) == "2026-12-01"


# -- configuration ---------------------------------------------------------------------------


def test_limits_are_optional_and_off_by_default() -> None:
    config = tenant()
    assert config.rate_limit is None
    assert config.daily_budget_usd is None


@pytest.mark.parametrize(
    "fields",
    [
        {"rate_limit": {"requests_per_s": 0, "burst": 1}},
        {"rate_limit": {"requests_per_s": 0.00001, "burst": 1}},
        {"rate_limit": {"requests_per_s": 1, "burst": 2_000_000}},
        {"rate_limit": {"requests_per_s": float("nan"), "burst": 1}},
        {"rate_limit": {"requests_per_s": 1, "burst": 0}},
        {"rate_limit": {"requests_per_s": 1}},
        {"rate_limit": {"requests_per_s": 1, "burst": 2, "per": "minute"}},
        {"daily_budget_usd": 0},
        {"daily_budget_usd": -1},
        {"daily_budget_usd": float("inf")},
    ],
)
def test_bad_limits_are_refused_naming_the_field(fields: dict[str, Any]) -> None:
    field = next(iter(fields))
    with pytest.raises(ValidationError, match=field):
        TenantConfig.model_validate({"id": "acme", "api_key_sha256": DIGEST, **fields})


@pytest.mark.parametrize(
    ("backend", "cache", "uses"),
    [("auto", "redis", True), ("auto", "memory", False), ("auto", "off", False),
     ("redis", "memory", True), ("memory", "redis", False)],
)  # fmt: skip
def test_quotas_follow_the_cache_to_redis_unless_told(backend: str, cache: str, uses: bool) -> None:
    assert QuotasConfig.model_validate({"backend": backend}).uses_redis(cache) is uses


# -- refusals -------------------------------------------------------------------------------


async def test_over_the_rate_limit_is_429_with_whole_second_retry_after_and_counted() -> None:
    clock, metrics = Clock(), Metrics()
    q = quotas(clock, metrics=metrics)
    acme = tenant(rate=0.4, burst=2)
    for _ in range(2):
        await q.admit(acme, answering=True)
    with pytest.raises(RateLimited) as refused:
        await q.admit(acme, answering=True)
    assert refused.value.status == 429
    assert refused.value.retry_after_s == 3  # 2.5 s until a token is back
    assert "rate limit of 0.4 requests/s (burst 2)" in refused.value.message
    assert Scrape.of(metrics).get("querygate_quota_refusals_total", reason="rate_limit") == 1.0
    clock.now += 2.5
    await q.admit(acme, answering=True)


async def test_a_spent_budget_is_429_naming_it_until_utc_midnight() -> None:
    clock, metrics = Clock(), Metrics()
    q = quotas(clock, metrics=metrics)
    acme = tenant(budget=1.0)
    await q.record_spend(acme, 0.6)
    await q.admit(acme, answering=True)  # 0.6 of 1.0: still allowed
    await q.record_spend(acme, 0.4)
    with pytest.raises(BudgetExceeded) as refused:
        await q.admit(acme, answering=True)
    assert refused.value.status == 429
    assert refused.value.type == "budget_exceeded"
    assert "daily budget of $1 (daily_budget_usd) for 2026-11-30 UTC" in refused.value.message
    assert refused.value.retry_after_s == 12 * 3600
    assert Scrape.of(metrics).get("querygate_quota_refusals_total", reason="budget") == 1.0
    clock.now += 12 * 3600  # the next UTC day
    await q.admit(acme, answering=True)


async def test_the_budget_is_not_checked_for_endpoints_that_call_no_model() -> None:
    q = quotas(Clock())
    acme = tenant(budget=0.5)
    await q.record_spend(acme, 0.5)
    await q.admit(acme, answering=False)
    with pytest.raises(BudgetExceeded):
        await q.admit(acme, answering=True)


async def test_one_tenant_at_its_limits_never_limits_another() -> None:
    q = quotas(Clock())
    acme = tenant("acme", rate=1.0, burst=1, budget=0.1)
    globex = tenant("globex", rate=1.0, burst=1, budget=0.1)
    await q.admit(acme, answering=True)
    await q.record_spend(acme, 0.2)
    with pytest.raises(RateLimited):
        await q.admit(acme, answering=False)
    with pytest.raises(BudgetExceeded):
        await q.check_budget(acme)
    await q.admit(globex, answering=True)  # neither its bucket nor its budget was touched


# -- the shared store down --------------------------------------------------------------------


class FlakyStore(MemoryQuotaStore):
    """A shared store (a second memory store) that can be switched off like a dead Redis."""

    name = "flaky"

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.down = False
        self.calls = 0

    async def take(
        self, tenant: str, rate_per_s: float, burst: float, *, spend: RequestSpend | None = None
    ) -> float:
        self._use()
        return await super().take(tenant, rate_per_s, burst)

    async def spent(self, tenant: str, day: str, *, spend: RequestSpend | None = None) -> float:
        self._use()
        return await super().spent(tenant, day)

    async def add_spend(self, tenant: str, day: str, usd: float, amount_id: str = "") -> float:
        self._use()
        return await super().add_spend(tenant, day, usd, amount_id)

    async def take_and_spent(
        self,
        tenant: str,
        rate_per_s: float,
        burst: float,
        day: str,
        *,
        spend: RequestSpend | None = None,
    ) -> tuple[float, float]:
        self._use()  # one call, as Redis's one script
        self.calls -= 2  # the two below are part of it
        return await super().take_and_spent(tenant, rate_per_s, burst, day)

    async def ping(self) -> None:
        self._use()

    def _use(self) -> None:
        self.calls += 1
        if self.down:
            raise BackendUnavailable("redis", "connection refused")


async def test_store_down_limits_hold_per_process_counted_and_recover_by_themselves(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, metrics = Clock(), Metrics()
    shared = FlakyStore(clock)
    q = quotas(clock, shared, metrics)
    acme = tenant(rate=1.0, burst=2)
    await q.admit(acme, answering=False)
    shared.down = True
    await q.admit(acme, answering=False)  # the local bucket, full: allowed
    await q.admit(acme, answering=False)
    with pytest.raises(RateLimited):  # the local bucket enforces the same limit
        await q.admit(acme, answering=False)
    scrape = Scrape.of(metrics)
    assert scrape.get("querygate_quota_store_degraded") == 1.0
    assert scrape.get("querygate_quota_local_decisions_total", check="rate_limit") == 3.0
    assert "quota store unavailable" in caplog.text
    asked = shared.calls
    clock.now += 0.5  # within redis_retry_s: the store is not asked again
    with pytest.raises(RateLimited):
        await q.admit(acme, answering=False)
    assert shared.calls == asked
    shared.down = False
    clock.now += 1.0
    await q.admit(acme, answering=False)  # asked again, and it answers
    assert Scrape.of(metrics).get("querygate_quota_store_degraded") == 0.0
    assert not q.degraded


async def test_store_down_budgets_count_from_the_last_total_seen_and_replay_the_spend() -> None:
    clock, metrics = Clock(), Metrics()
    shared = FlakyStore(clock)
    q = quotas(clock, shared, metrics)
    acme = tenant(budget=1.0)
    await shared.add_spend("acme", "2026-11-30", 0.5)  # another replica's spend
    await q.check_budget(acme)  # reads 0.5
    shared.down = True
    await q.record_spend(acme, 0.3)  # kept here: 0.8 as far as this process knows
    await q.check_budget(acme)
    await q.record_spend(acme, 0.3)
    with pytest.raises(BudgetExceeded):  # 0.5 seen + 0.6 since: over, without the store
        await q.check_budget(acme)
    assert (
        Scrape.of(metrics).get("querygate_quota_local_decisions_total", check="budget") == 2.0
    )  # both checks made while it was down
    assert (
        Scrape.of(metrics).get("querygate_quota_local_decisions_total", check="spend") == 2.0
    )  # each cost kept here once, however often it is tried again
    shared.down = False
    clock.now += 1.0
    with pytest.raises(BudgetExceeded):  # 0.5 read + 0.6 still kept here
        await q.check_budget(acme)
    assert await shared.spent("acme", "2026-11-30") == pytest.approx(0.5)  # a check sends none
    await q.ping()  # the probe sends it
    assert await shared.spent("acme", "2026-11-30") == pytest.approx(1.1)  # replayed, once
    await q.ping()
    await q.check_budget(tenant(budget=2.0))
    assert await shared.spent("acme", "2026-11-30") == pytest.approx(1.1)


# -- the LLM seam -----------------------------------------------------------------------------


class PricedLLM:
    """A fake tier: every call costs `cost`."""

    def __init__(self, cost: float) -> None:
        self.cost = cost
        self.calls = 0
        self.tenants: list[str] = []  # whom each call was made for

    def has_tier(self, tier: Tier) -> bool:
        return True

    def prices(self, tier: Tier) -> tuple[float, float]:
        return (0.0, 0.0)

    async def complete(self, call: LLMCall) -> Completion:
        self.calls += 1
        self.tenants.append(call.tenant)
        return Completion("ok", call.tier, "fake", Usage(1, 1, self.cost))

    async def stream(self, call: LLMCall) -> AsyncIterator[StreamDelta]:
        self.calls += 1
        self.tenants.append(call.tenant)
        yield StreamDelta(text="o")
        yield StreamDelta(done=True, usage=Usage(1, 1, self.cost), model="fake")

    async def warm_up(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


async def test_every_call_is_checked_before_and_recorded_after() -> None:
    clock = Clock()
    q = quotas(clock)
    inner = PricedLLM(cost=0.4)
    llm = BudgetedLLM(inner, q, tenant(budget=1.0))
    await llm.complete(LLMCall("small", ()))
    _ = [d async for d in llm.stream(LLMCall("small", ()))]
    await llm.complete(LLMCall("small", ()))  # 0.8 spent before it: allowed, 1.2 after
    with pytest.raises(BudgetExceeded):
        await llm.complete(LLMCall("small", ()))
    with pytest.raises(BudgetExceeded):
        _ = [d async for d in llm.stream(LLMCall("small", ()))]
    assert inner.calls == 3  # the refused calls never reached the model
    assert inner.tenants == ["acme"] * 3  # each made for the request's tenant
    assert await q._local.spent("acme", "2026-11-30") == pytest.approx(1.2)


async def test_without_quotas_the_calls_are_made_for_the_tenant_and_not_budgeted() -> None:
    inner = PricedLLM(cost=5.0)
    llm = BudgetedLLM(inner, None, tenant(budget=1.0))
    await llm.complete(LLMCall("small", ()))
    await llm.complete(LLMCall("small", ()))
    _ = [d async for d in llm.stream(LLMCall("small", ()))]
    await llm.check_before_stream()
    assert inner.calls == 3
    assert inner.tenants == ["acme"] * 3


async def test_the_arrival_check_stands_for_one_call_only_even_a_free_one() -> None:
    q = quotas(Clock())
    acme = tenant(budget=1.0)
    arrival = await q.admit(acme, answering=True)
    assert arrival is not None
    reads = 0
    check_budget = q.check_budget

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal reads
        reads += 1
        return await check_budget(*args, **kwargs)

    q.check_budget = counted  # type: ignore[method-assign]
    llm = BudgetedLLM(PricedLLM(cost=0.0), q, acme, arrival)
    await llm.complete(LLMCall("small", ()))  # a free call (a rewrite) uses the arrival's check
    assert reads == 0
    await llm.check_before_stream()  # the stream to come gets a check of its own
    assert reads == 1
    _ = [d async for d in llm.stream(LLMCall("small", ()))]  # which stands for it
    assert reads == 1


# -- calls cut before their usage arrived (H3) --------------------------------------------------

MESSAGES = (Message("system", "Answer from the sources. " * 20), Message("user", "Where is Acme?"))
TODAY = "2026-11-30"


class CutLLM(PricedLLM):
    """A priced tier whose stream sends some text, then hangs (a client hang-up cancels it) or
    fails; its completion hangs."""

    def __init__(self, fail: BaseException | None = None, text: str = "Acme is in") -> None:
        super().__init__(cost=1.0)
        self.fail = fail
        self.text = text
        self.started = asyncio.Event()

    def prices(self, tier: Tier) -> tuple[float, float]:
        return (1e-3, 2e-3)

    async def complete(self, call: LLMCall) -> Completion:
        self.started.set()
        await asyncio.Event().wait()
        raise AssertionError("never answers")

    async def stream(self, call: LLMCall) -> AsyncIterator[StreamDelta]:
        if self.text:
            yield StreamDelta(text=self.text, model="fake-model")
        self.started.set()
        if self.fail is not None:
            raise self.fail
        await asyncio.Event().wait()
        yield StreamDelta(done=True, usage=Usage(1, 1, 1.0))


async def hang_up(work: Callable[[], Coroutine[Any, Any, Any]], inner: CutLLM) -> None:
    """Run `work` as a request's task, cancel it mid-call (what aiohttp does when the client
    goes, handler_cancellation=True), and let its recording run."""
    task = asyncio.create_task(work())
    await inner.started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0)


async def test_a_stream_cut_by_a_hang_up_is_charged_its_prompt_and_the_text_so_far() -> None:
    q, inner = quotas(Clock()), CutLLM()
    llm = BudgetedLLM(inner, q, tenant(budget=100.0))
    await hang_up(lambda: consume(llm.stream(LLMCall("small", MESSAGES))), inner)
    expected = estimate_usage(inner, "small", MESSAGES, "Acme is in", "fake-model")
    assert expected.prompt_tokens > 50 and expected.completion_tokens > 0
    assert await q._local.spent("acme", TODAY) == pytest.approx(expected.cost_usd)


async def test_a_stream_that_fails_after_some_text_is_charged_and_one_before_any_is_not() -> None:
    q = quotas(Clock())
    acme = tenant(budget=100.0)
    inner = CutLLM(fail=UpstreamError("llm", "stream interrupted"))
    with pytest.raises(UpstreamError):
        await consume(BudgetedLLM(inner, q, acme).stream(LLMCall("small", MESSAGES)))
    charged = await q._local.spent("acme", TODAY)
    assert charged == pytest.approx(estimate_usage(inner, "small", MESSAGES, "Acme is in").cost_usd)
    nothing = CutLLM(fail=BackendUnavailable("llm", "refused"), text="")
    with pytest.raises(BackendUnavailable):
        await consume(BudgetedLLM(nothing, q, acme).stream(LLMCall("small", MESSAGES)))
    assert await q._local.spent("acme", TODAY) == pytest.approx(charged)


async def test_a_completion_cancelled_while_it_waits_is_charged_its_prompt() -> None:
    q, inner = quotas(Clock()), CutLLM()
    llm = BudgetedLLM(inner, q, tenant(budget=100.0))
    await hang_up(lambda: llm.complete(LLMCall("small", MESSAGES)), inner)
    expected = estimate_usage(inner, "small", MESSAGES, "")
    assert expected.cost_usd > 0
    assert await q._local.spent("acme", TODAY) == pytest.approx(expected.cost_usd)


async def test_a_cut_stream_is_charged_to_the_shared_store_too() -> None:
    clock = Clock()
    shared = FlakyStore(clock)
    q, inner = quotas(clock, shared), CutLLM()
    llm = BudgetedLLM(inner, q, tenant(budget=100.0))
    await hang_up(lambda: consume(llm.stream(LLMCall("small", MESSAGES))), inner)
    for _ in range(3):
        await asyncio.sleep(0)  # the task that sends it
    expected = estimate_usage(inner, "small", MESSAGES, "Acme is in", "fake-model").cost_usd
    assert await shared.spent("acme", TODAY) == pytest.approx(expected)


async def test_metered_llm_costs_a_cut_stream_and_a_cancelled_completion() -> None:
    metrics = Metrics()
    inner = CutLLM()
    llm = MeteredLLM(inner, metrics)
    await hang_up(lambda: consume(llm.stream(LLMCall("small", MESSAGES, route="direct"))), inner)
    cost = Scrape.of(metrics).get(
        "querygate_llm_cost_usd_total", tier="small", model="fake-model", route="direct"
    )
    expected = estimate_usage(inner, "small", MESSAGES, "Acme is in", "fake-model").cost_usd
    assert cost == pytest.approx(expected)
    inner.started.clear()
    await hang_up(lambda: llm.complete(LLMCall("small", MESSAGES, route="direct")), inner)
    cost = Scrape.of(metrics).get(
        "querygate_llm_cost_usd_total", tier="small", model="-", route="direct"
    )
    assert cost == pytest.approx(estimate_usage(inner, "small", MESSAGES, "").cost_usd)


async def consume(stream: AsyncIterator[StreamDelta]) -> list[StreamDelta]:
    return [d async for d in stream]


# -- one tenant's unusable keys (M2) ----------------------------------------------------------


class CorruptStore(FlakyStore):
    """A shared store where the tenant `bad`'s keys hold garbage until repaired."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.corrupt = {"bad"}
        self.repaired: list[tuple[str, str, float]] = []

    async def take(
        self, tenant: str, rate_per_s: float, burst: float, *, spend: RequestSpend | None = None
    ) -> float:
        self._garbage(tenant)
        return await super().take(tenant, rate_per_s, burst)

    async def spent(self, tenant: str, day: str, *, spend: RequestSpend | None = None) -> float:
        self._garbage(tenant)
        return await super().spent(tenant, day)

    async def repair(
        self, tenant: str, day: str, usd: float, *, spend: RequestSpend | None = None
    ) -> None:
        self.repaired.append((tenant, day, usd))
        self.corrupt.discard(tenant)

    def _garbage(self, tenant: str) -> None:
        if tenant in self.corrupt:
            raise UpstreamError("redis", "a quota key is unusable: WRONGTYPE")


async def test_one_tenants_unusable_keys_are_repaired_and_degrade_no_other_tenant(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, metrics = Clock(), Metrics()
    shared = CorruptStore(clock)
    q = quotas(clock, shared, metrics)
    bad, good = tenant("bad", rate=1.0, budget=1.0), tenant("good", rate=1.0, budget=1.0)
    await q.admit(bad, answering=True)  # decided here, this once
    assert not q.degraded
    assert Scrape.of(metrics).get("querygate_quota_store_degraded") == 0.0
    assert shared.repaired == [("bad", TODAY, 0.0)]
    assert "quota keys are unusable" in caplog.text
    calls = shared.calls
    await q.admit(good, answering=True)  # the shared store, at once: no retry interval
    assert shared.calls == calls + 1  # the take and the budget read: one call
    await q.admit(bad, answering=True)  # repaired: shared again
    assert shared.calls == calls + 2
    local = Scrape.of(metrics).get("querygate_quota_local_decisions_total", check="rate_limit")
    assert local == 1.0


# -- shutdown, probe, workers (M3, M4, M10) -----------------------------------------------------


async def test_aclose_sends_the_spend_kept_here_and_closes_the_store() -> None:
    clock = Clock()
    shared = FlakyStore(clock)
    q = quotas(clock, shared)
    shared.down = True
    await q.record_spend(tenant(), 0.25)
    shared.down = False  # back, but no probe or request came since
    await q.aclose()
    assert shared._spend[("acme", TODAY)] == pytest.approx(0.25)
    with pytest.raises(RuntimeError):
        await shared.spent("acme", TODAY)  # closed


async def test_aclose_logs_per_tenant_the_spend_it_could_not_send(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    shared = FlakyStore(clock)
    q = quotas(clock, shared)
    shared.down = True
    await q.record_spend(tenant(), 0.25)
    await q.record_spend(tenant("globex"), 0.5)
    await q.aclose(timeout_s=0.5)
    lost = [r for r in caplog.records if r.getMessage().startswith("spend not added")]
    assert sorted((r.__dict__["tenant"], r.__dict__["usd"]) for r in lost) == [
        ("acme", 0.25),
        ("globex", 0.5),
    ]


async def test_the_probe_clears_the_degraded_gauge_without_traffic() -> None:
    clock, metrics = Clock(), Metrics()
    shared = FlakyStore(clock)
    q = quotas(clock, shared, metrics)
    shared.down = True
    await q.admit(tenant(rate=1.0), answering=False)
    assert Scrape.of(metrics).get("querygate_quota_store_degraded") == 1.0
    with pytest.raises(BackendUnavailable):
        await q.ping()
    shared.down = False
    await q.ping()  # no request since: the probe alone
    assert Scrape.of(metrics).get("querygate_quota_store_degraded") == 0.0
    services = cast(
        Services, SimpleNamespace(retriever=SimpleNamespace(ping=None), cache_store=None, quotas=q)
    )
    assert probes(services)["quotas"] == q.ping
    memory_only = SimpleNamespace(retriever=SimpleNamespace(ping=None), cache_store=None)
    memory_only.quotas = quotas(clock)
    assert "quotas" not in probes(cast(Services, memory_only))


@pytest.mark.parametrize(
    ("workers", "shared", "warned"),
    [(True, False, True), (False, False, False), (True, True, False)],
)
def test_per_worker_limits_are_warned_of_at_start(
    workers: bool,
    shared: bool,
    warned: bool,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if workers:
        monkeypatch.setenv(MULTIPROC_ENV, "/tmp/metrics")
    else:
        monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    q = quotas(Clock(), FlakyStore(Clock()) if shared else None)
    warn_if_per_worker([tenant(budget=1.0), tenant("globex")], q)
    assert ("N times its daily budget" in caplog.text) is warned
    caplog.clear()
    warn_if_per_worker([tenant("globex")], q)  # no limits: nothing to multiply
    assert "per worker" not in caplog.text


async def test_a_stream_checked_by_its_handler_reads_the_budget_once() -> None:
    clock = Clock()
    shared = FlakyStore(clock)
    q = quotas(clock, shared)
    llm = BudgetedLLM(PricedLLM(cost=0.1), q, tenant(budget=1.0))
    await llm.check_before_stream()
    asked = shared.calls
    await consume(llm.stream(LLMCall("small", ())))
    await asyncio.sleep(0.01)  # the cost is sent by a task the answer does not wait for
    assert shared.calls == asked + 1  # the cost sent; no second read
    await consume(llm.stream(LLMCall("small", ())))  # a second call checks again
    await asyncio.sleep(0.01)
    assert shared.calls == asked + 3


async def test_a_closed_shared_store_starts_no_probe_and_its_close_stays_cancellable() -> None:
    """The probe a cut call starts is cancelled by `aclose`, which a caller can still cancel
    while the probe takes its time to end; no probe starts once the store is closed."""
    release, pinged = asyncio.Event(), asyncio.Event()
    pings: list[None] = []

    class Stuck(MemoryQuotaStore):
        async def ping(self) -> None:
            pings.append(None)
            pinged.set()
            while not release.is_set():
                with contextlib.suppress(asyncio.CancelledError):  # slow to give up
                    await release.wait()

    async def cut() -> float:
        raise RequestBudgetSpent(0.25, cut=True)

    shared = SharedStore(Stuck(Clock()), Metrics(), retry_s=1.0)
    assert await shared.ask(cut, "acme", spend=RequestSpend()) is None
    await pinged.wait()
    closing = asyncio.create_task(shared.aclose())
    await asyncio.sleep(0.01)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    release.set()
    await shared.settled()
    assert await shared.ask(cut, "acme", spend=RequestSpend()) is None
    await shared.settled()
    assert len(pings) == 1
