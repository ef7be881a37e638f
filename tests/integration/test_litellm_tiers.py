"""LiteLLMTiers through litellm's real client path against the fake upstream process.

Nothing here mocks litellm: every call goes over loopback HTTP to `tests.fake_upstream`, scripted
per request by a directive in the last user message. Each test uses its own directive key and
counts the upstream calls that carried it.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from backends.errors import BackendError, BackendUnavailable, UpstreamError
from backends.llm.base import LLMCall, Message, StreamDelta, TierConfig, ToolCall
from backends.llm.tiers import LiteLLMTiers
from tests.fixtures.upstream import calls_for, upstream_stats

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="session"),
    # litellm 1.110 reads pydantic fields off instances; not ours to fix
    pytest.mark.filterwarnings("ignore:Accessing the 'model_:DeprecationWarning"),
]

IN_PRICE = 1e-6
OUT_PRICE = 2e-6
# a hang must fail the test, not the CI job
GUARD_S = 15

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "search the corpus",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
}


def _tier(base_url: str, model: str = "openai/fake-small", **overrides: Any) -> TierConfig:
    settings: dict[str, Any] = {
        "model": model,
        "api_base": base_url,
        "input_cost_per_token": IN_PRICE,
        "output_cost_per_token": OUT_PRICE,
        "timeout_s": 5.0,
        "retries": 2,
    }
    return TierConfig(**(settings | overrides))


# Every test runs on both wires to the OpenAI-compatible fake: the lean aiohttp one (the default
# for `openai/` models) and litellm.acompletion (every other provider's): same semantics.
_WIRE = {"lean_http": True}


@pytest.fixture(autouse=True, params=["lean", "litellm"])
def wire(request: pytest.FixtureRequest) -> Iterator[str]:
    _WIRE["lean_http"] = request.param == "lean"
    yield request.param
    _WIRE["lean_http"] = True


def _llm(small: TierConfig | None, large: TierConfig | None = None, **options: Any) -> LiteLLMTiers:
    # tiny backoff: these tests count attempts, they do not measure waiting
    options = {"lean_http": _WIRE["lean_http"], **options}
    return LiteLLMTiers(small, large, backoff_initial_s=0.01, backoff_max_s=0.05, **options)


async def test_the_lean_wire_serves_openai_compatible_models_without_litellm(
    fake_upstream: str, wire: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if wire != "lean":
        pytest.skip("about the lean wire")

    async def refused(**_: Any) -> None:
        raise AssertionError("litellm.acompletion called for an openai/ model")

    monkeypatch.setattr("litellm.acompletion", refused)
    llm = _llm(_tier(fake_upstream))
    try:
        done = await llm.complete(LLMCall("small", (Message("user", "hello"),)))
        deltas = [d async for d in llm.stream(LLMCall("small", (Message("user", "hello"),)))]
    finally:
        await llm.aclose()
    assert done.text and done.usage.cost_usd > 0
    assert deltas[-1].done and "".join(d.text for d in deltas) == done.text


def _ask(question: str, directive: dict[str, Any]) -> tuple[str, tuple[Message, ...]]:
    key = uuid.uuid4().hex
    content = f"{question} [[fake:{json.dumps(directive | {'key': key})}]]"
    return key, (Message(role="user", content=content),)


async def _drain(stream: Any) -> list[StreamDelta]:
    return [delta async for delta in stream]


async def test_completion_has_text_usage_and_cost_from_tier_prices(fake_upstream: str) -> None:
    usage = {"prompt_tokens": 100, "completion_tokens": 50}
    _, messages = _ask("what is the capital of France", {"usage": usage})
    completion = await _llm(_tier(fake_upstream)).complete(LLMCall("small", messages))
    assert completion.text == "FAKE ANSWER: what is the capital of France"
    assert (completion.tier, completion.model) == ("small", "openai/fake-small")
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (100, 50)
    assert completion.usage.cost_usd == pytest.approx(100 * IN_PRICE + 50 * OUT_PRICE)
    assert completion.usage_estimated is False


async def test_stream_yields_deltas_then_a_final_delta_with_usage_and_cost(
    fake_upstream: str,
) -> None:
    usage = {"prompt_tokens": 30, "completion_tokens": 6}
    # a pause before each chunk: each comes in its own read, so goes on as its own delta
    _, messages = _ask("stream this", {"usage": usage, "chunk_delay_ms": 20})
    deltas = await _drain(_llm(_tier(fake_upstream)).stream(LLMCall("small", messages)))
    *parts, final = deltas
    assert "".join(d.text for d in parts) == "FAKE ANSWER: stream this"
    assert len(parts) > 1 and not any(d.done for d in parts)
    assert final.done and final.usage is not None
    assert (final.usage.prompt_tokens, final.usage.completion_tokens) == (30, 6)
    assert final.usage.cost_usd == pytest.approx(30 * IN_PRICE + 6 * OUT_PRICE)
    assert (final.finish_reason, final.ended, final.usage_estimated) == ("stop", True, False)
    assert final.tool_calls == ()


async def test_stream_without_upstream_usage_estimates_it_and_says_so(fake_upstream: str) -> None:
    _, messages = _ask("no usage from upstream", {"no_usage": True})
    final = (await _drain(_llm(_tier(fake_upstream)).stream(LLMCall("small", messages))))[-1]
    assert final.usage_estimated is True
    assert final.usage is not None
    assert final.usage.prompt_tokens > 0 and final.usage.completion_tokens > 0
    assert final.usage.cost_usd > 0


async def test_completion_without_upstream_usage_is_estimated_not_free(fake_upstream: str) -> None:
    _, messages = _ask("no usage in the body", {"no_usage": True})
    completion = await _llm(_tier(fake_upstream)).complete(LLMCall("small", messages))
    assert completion.usage.prompt_tokens > 0 and completion.usage.completion_tokens > 0
    assert completion.usage.cost_usd > 0
    assert completion.usage_estimated is True


async def test_tool_calls_are_parsed_with_decoded_arguments(fake_upstream: str) -> None:
    calls = [{"id": "c1", "name": "search", "arguments": {"q": "eiffel tower height"}}]
    _, messages = _ask("how tall", {"tool_calls": calls, "answer": ""})
    completion = await _llm(_tier(fake_upstream)).complete(
        LLMCall("small", messages, tools=(SEARCH_TOOL,))
    )
    assert completion.tool_calls == (ToolCall("c1", "search", {"q": "eiffel tower height"}),)
    assert completion.finish_reason == "tool_calls"


async def test_tool_call_results_can_be_sent_back(fake_upstream: str) -> None:
    call = ToolCall("c1", "search", {"q": "x"})
    _, messages = _ask("follow up", {})
    messages += (
        Message(role="assistant", content="", tool_calls=(call,)),
        Message(role="tool", content="result text", tool_call_id="c1"),
    )
    completion = await _llm(_tier(fake_upstream)).complete(
        LLMCall("small", messages, tools=(SEARCH_TOOL,))
    )
    assert completion.text.startswith("FAKE ANSWER: follow up")


@pytest.mark.parametrize(
    ("arguments", "error"), [("{not json", "invalid JSON"), ("[1, 2]", "not a JSON object")]
)
async def test_tool_call_with_unusable_arguments_comes_back_flagged_not_failed(
    fake_upstream: str, arguments: str, error: str
) -> None:
    key, messages = _ask("q", {"tool_calls": [{"name": "search", "arguments": arguments}]})
    completion = await _llm(_tier(fake_upstream)).complete(
        LLMCall("small", messages, tools=(SEARCH_TOOL,))
    )
    assert completion.tool_calls == (ToolCall("call_0", "search", {}, error=error),)
    # the model's mistake is not the upstream's: no retry, no fallback
    assert await calls_for(fake_upstream, key) == 1


async def test_503_twice_then_success_is_retried_to_success(fake_upstream: str) -> None:
    key, messages = _ask("q", {"fail_first": 2, "status": 503})
    completion = await _llm(_tier(fake_upstream, retries=2)).complete(LLMCall("small", messages))
    assert completion.model == "openai/fake-small"
    assert await calls_for(fake_upstream, key) == 3


async def test_429_is_retried(fake_upstream: str) -> None:
    key, messages = _ask("q", {"fail_first": 1, "status": 429})
    await _llm(_tier(fake_upstream, retries=1)).complete(LLMCall("small", messages))
    assert await calls_for(fake_upstream, key) == 2


async def test_persistent_500_falls_back_to_the_next_model_which_answers(
    fake_upstream: str,
) -> None:
    fallback = _tier(fake_upstream, "openai/fake-fallback", input_cost_per_token=1e-5)
    tier = _tier(fake_upstream, retries=1, fallbacks=(fallback,))
    key, messages = _ask("q", {"status": 500, "models": ["fake-small"]})
    completion = await _llm(tier).complete(LLMCall("small", messages))
    assert completion.model == "openai/fake-fallback"
    used = completion.usage  # the directive, usage script included, applies to fake-small only
    assert used.cost_usd == pytest.approx(
        used.prompt_tokens * 1e-5 + used.completion_tokens * OUT_PRICE
    )
    assert await calls_for(fake_upstream, key) == 2 + 1  # primary tried twice, fallback once


async def test_all_models_down_raises_backend_unavailable_after_bounded_attempts(
    fake_upstream: str,
) -> None:
    fallback = _tier(fake_upstream, "openai/fake-fallback", retries=1)
    tier = _tier(fake_upstream, retries=2, fallbacks=(fallback,))
    key, messages = _ask("q", {"status": 503})
    async with asyncio.timeout(GUARD_S):
        with pytest.raises(BackendUnavailable) as raised:
            await _llm(tier).complete(LLMCall("small", messages))
    assert raised.value.backend == "llm"
    assert await calls_for(fake_upstream, key) == 3 + 2


async def test_400_is_not_retried(fake_upstream: str) -> None:
    key, messages = _ask("q", {"status": 400})
    with pytest.raises(UpstreamError):
        await _llm(_tier(fake_upstream, retries=3)).complete(LLMCall("small", messages))
    assert await calls_for(fake_upstream, key) == 1


# A timeout of 1 s against an upstream 5 s late: a loaded machine (CI at load 10) delivers the
# retry to the upstream well within the second, which 0.2 s did not always leave it.
async def test_timeout_is_retried_then_backend_unavailable(fake_upstream: str) -> None:
    key, messages = _ask("q", {"delay_ms": 5000})
    tier = _tier(fake_upstream, timeout_s=1.0, retries=1)
    async with asyncio.timeout(GUARD_S):
        with pytest.raises(BackendUnavailable):
            await _llm(tier).complete(LLMCall("small", messages))
    assert await calls_for(fake_upstream, key) == 2


async def test_stalled_stream_times_out_instead_of_hanging(fake_upstream: str) -> None:
    key, messages = _ask("q", {"chunk_delay_ms": 5000})
    tier = _tier(fake_upstream, timeout_s=1.0, retries=1)
    async with asyncio.timeout(GUARD_S):
        with pytest.raises(BackendUnavailable):
            await _drain(_llm(tier).stream(LLMCall("small", messages)))
    assert await calls_for(fake_upstream, key) == 2


async def test_malformed_body_is_an_upstream_error_not_a_hang_nor_a_retry(
    fake_upstream: str,
) -> None:
    key, messages = _ask("q", {"malformed": True})
    async with asyncio.timeout(GUARD_S):
        with pytest.raises(UpstreamError):
            await _llm(_tier(fake_upstream, retries=2)).complete(LLMCall("small", messages))
    assert await calls_for(fake_upstream, key) == 1


async def test_malformed_body_falls_back(fake_upstream: str) -> None:
    fallback = _tier(fake_upstream, "openai/fake-fallback")
    _, messages = _ask("q", {"malformed": True, "models": ["fake-small"]})
    completion = await _llm(_tier(fake_upstream, fallbacks=(fallback,))).complete(
        LLMCall("small", messages)
    )
    assert completion.model == "openai/fake-fallback"


# Valid JSON an OpenAI client cannot read: the model's failure (an UpstreamError on the lean
# wire; litellm's own parser calls it a transient error: BackendUnavailable after the retries),
# never an exception the gateway does not translate (a 500).
ODD_BODIES = {
    "message-a-string": {"choices": [{"message": "hello", "finish_reason": "stop"}]},
    "tool-calls-an-object": {
        "choices": [{"message": {"content": "", "tool_calls": {"id": "x"}}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    },
    "tool-call-a-number": {"choices": [{"message": {"content": "", "tool_calls": [7]}}]},
    "usage-not-a-number": {
        "choices": [{"message": {"content": "hi"}}],
        "usage": {"prompt_tokens": "many", "completion_tokens": 1},
    },
    "content-a-list": {"choices": [{"message": {"content": ["hi"]}}]},
}
ODD_CHUNKS = {
    "delta-a-string": [{"choices": [{"delta": "hi"}]}],
    "usage-not-a-number": [
        {"choices": [{"delta": {"content": "hi"}}]},
        {"choices": [], "usage": {"prompt_tokens": [1], "completion_tokens": 1}},
    ],
    "tool-call-index-a-word": [
        {"choices": [{"delta": {"tool_calls": [{"index": "first", "function": {"name": "f"}}]}}]}
    ],
    "choices-an-object": [{"choices": {"delta": {"content": "hi"}}}],
}


@pytest.mark.parametrize("body", ODD_BODIES.values(), ids=ODD_BODIES.keys())
async def test_a_body_of_an_odd_shape_is_an_upstream_error(
    fake_upstream: str, body: dict[str, Any]
) -> None:
    _, messages = _ask("q", {"raw": body})
    async with asyncio.timeout(GUARD_S):
        with pytest.raises(BackendError):
            await _llm(_tier(fake_upstream, retries=0)).complete(LLMCall("small", messages))


@pytest.mark.parametrize("chunks", ODD_CHUNKS.values(), ids=ODD_CHUNKS.keys())
async def test_a_stream_chunk_of_an_odd_shape_is_an_upstream_error(
    fake_upstream: str, chunks: list[dict[str, Any]]
) -> None:
    _, messages = _ask("q", {"raw": chunks})
    async with asyncio.timeout(GUARD_S):
        with pytest.raises(BackendError):
            await _drain(_llm(_tier(fake_upstream, retries=0)).stream(LLMCall("small", messages)))


async def test_truncated_stream_raises_after_the_deltas_already_sent(fake_upstream: str) -> None:
    _, messages = _ask("one two three four five", {"truncate_after": 3})
    received: list[StreamDelta] = []
    async with asyncio.timeout(GUARD_S):
        with pytest.raises(UpstreamError):
            async for delta in _llm(_tier(fake_upstream)).stream(LLMCall("small", messages)):
                received.append(delta)
    assert received and not any(d.done for d in received)


async def test_stream_that_fails_to_open_is_retried(fake_upstream: str) -> None:
    key, messages = _ask("q", {"fail_first": 1, "status": 502})
    deltas = await _drain(_llm(_tier(fake_upstream, retries=1)).stream(LLMCall("small", messages)))
    assert deltas[-1].done
    assert await calls_for(fake_upstream, key) == 2


async def test_stream_falls_back_when_the_primary_is_down(fake_upstream: str) -> None:
    fallback = _tier(fake_upstream, "openai/fake-fallback")
    _, messages = _ask("q", {"status": 503, "models": ["fake-small"]})
    llm = _llm(_tier(fake_upstream, retries=0, fallbacks=(fallback,)))
    deltas = await _drain(llm.stream(LLMCall("small", messages)))
    assert {d.model for d in deltas} == {"openai/fake-fallback"}


async def test_refused_connection_is_retried_then_backend_unavailable(
    fake_upstream: str,
) -> None:
    tier = _tier("http://127.0.0.1:9/v1", retries=1)  # discard port: nothing listens
    async with asyncio.timeout(GUARD_S):
        with pytest.raises(BackendUnavailable):
            await _llm(tier).complete(LLMCall("small", (Message(role="user", content="q"),)))


async def test_tiers_are_independent_and_an_unconfigured_tier_is_unavailable(
    fake_upstream: str,
) -> None:
    llm = _llm(None, _tier(fake_upstream, "openai/fake-large"))
    assert (llm.has_tier("small"), llm.has_tier("large")) == (False, True)
    assert (await llm.complete(LLMCall("large", _ask("q", {})[1]))).model == "openai/fake-large"
    with pytest.raises(BackendUnavailable):
        await llm.complete(LLMCall("small", _ask("q", {})[1]))


async def test_missing_api_key_env_var_fails_at_construction(fake_upstream: str) -> None:
    with pytest.raises(ValueError, match="QUERYGATE_TEST_UNSET_KEY"):
        _llm(_tier(fake_upstream, api_key_env="QUERYGATE_TEST_UNSET_KEY"))


async def test_warm_up_does_not_call_the_upstream(fake_upstream: str) -> None:
    before = (await upstream_stats(fake_upstream))["total"]
    await _llm(_tier(fake_upstream), _tier(fake_upstream, "openai/fake-large")).warm_up()
    assert (await upstream_stats(fake_upstream))["total"] == before


async def test_a_new_instance_works_after_another_was_closed(fake_upstream: str) -> None:
    first = _llm(_tier(fake_upstream))
    await first.complete(LLMCall("small", _ask("q", {})[1]))
    await first.aclose()
    completion = await _llm(_tier(fake_upstream, retries=0)).complete(
        LLMCall("small", _ask("q", {})[1])
    )
    assert completion.text.startswith("FAKE ANSWER")


# --- cooldown: a model that keeps failing is skipped, then probed -------------------------------

PRIMARY = "openai/fake-small"
FALLBACK = "openai/fake-fallback"
PRIMARY_DOWN = {"status": 503, "models": ["fake-small"]}
COOLDOWN_S = 30.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Cooling:
    """A tier whose primary (retried twice) opens after 2 failed calls, a fake clock, the events."""

    def __init__(self, base_url: str, *, fallback: bool = True, **overrides: Any) -> None:
        settings: dict[str, Any] = {
            "retries": 2,
            "cooldown_after": 2,
            "cooldown_s": COOLDOWN_S,
        } | overrides
        fallbacks = (_tier(base_url, FALLBACK, **settings),) if fallback else ()
        self.clock = FakeClock()
        self.events: list[tuple[str, str, bool]] = []
        self.llm = _llm(
            _tier(base_url, PRIMARY, fallbacks=fallbacks, **settings),
            clock=self.clock,
            on_cooldown=lambda *event: self.events.append(event),
        )

    async def ask(
        self, base_url: str, directive: dict[str, Any], tenant: str = ""
    ) -> tuple[str, int]:
        """The model that answered `tenant` and how many upstream requests it took."""
        key, messages = _ask("q", directive)
        completion = await self.llm.complete(LLMCall("small", messages, tenant=tenant))
        return completion.model, await calls_for(base_url, key)

    async def open_primary(self, base_url: str) -> None:
        for _ in range(2):
            await self.ask(base_url, PRIMARY_DOWN)
        assert set(self.llm.cooldowns()) == {("small", PRIMARY)}


async def test_a_dead_primary_is_skipped_after_cooldown_after_failed_calls(
    fake_upstream: str,
) -> None:
    cooling = Cooling(fake_upstream)
    answers = [await cooling.ask(fake_upstream, PRIMARY_DOWN) for _ in range(5)]
    # 3 attempts on the primary, then the fallback; once open, the fallback alone
    assert answers == [(FALLBACK, 4), (FALLBACK, 4), (FALLBACK, 1), (FALLBACK, 1), (FALLBACK, 1)]
    assert cooling.llm.cooldowns() == {("small", PRIMARY): COOLDOWN_S}


async def test_after_the_cooldown_one_probe_reaches_the_primary_and_closes_it(
    fake_upstream: str,
) -> None:
    cooling = Cooling(fake_upstream)
    await cooling.open_primary(fake_upstream)
    cooling.clock.now += COOLDOWN_S
    assert await cooling.ask(fake_upstream, {}) == (PRIMARY, 1)
    assert cooling.llm.cooldowns() == {}
    assert await cooling.ask(fake_upstream, {}) == (PRIMARY, 1)


async def test_concurrent_requests_while_half_open_send_a_single_probe(fake_upstream: str) -> None:
    cooling = Cooling(fake_upstream)
    await cooling.open_primary(fake_upstream)
    cooling.clock.now += COOLDOWN_S
    key = uuid.uuid4().hex
    # the primary is slow to answer the probe, so the others arrive while it is out
    slow = {"key": key, "delay_ms": 300, "models": ["fake-small"]}
    messages = [Message(role="user", content=f"q [[fake:{json.dumps(slow)}]]")]
    async with asyncio.timeout(GUARD_S):
        completions = await asyncio.gather(
            *(cooling.llm.complete(LLMCall("small", messages)) for _ in range(4))
        )
    assert sorted(c.model for c in completions) == [FALLBACK] * 3 + [PRIMARY]
    assert await calls_for(fake_upstream, key) == 4  # one probe, three fallback answers
    assert cooling.llm.cooldowns() == {}


async def test_a_failed_probe_is_not_retried_and_skips_the_primary_for_another_cooldown(
    fake_upstream: str,
) -> None:
    cooling = Cooling(fake_upstream)
    await cooling.open_primary(fake_upstream)
    cooling.clock.now += COOLDOWN_S + 10
    assert await cooling.ask(fake_upstream, PRIMARY_DOWN) == (FALLBACK, 2)
    assert cooling.llm.cooldowns() == {("small", PRIMARY): COOLDOWN_S}


async def test_every_model_cooling_down_fails_at_once_with_retry_after(fake_upstream: str) -> None:
    cooling = Cooling(fake_upstream, retries=0, cooldown_after=1)
    with pytest.raises(BackendUnavailable):
        await cooling.ask(fake_upstream, {"status": 503})
    cooling.clock.now += 10.5
    key, messages = _ask("q", {})
    with pytest.raises(BackendUnavailable, match="cooling down") as raised:
        await cooling.llm.complete(LLMCall("small", messages))
    assert raised.value.retry_after_s == 20  # 19.5 s left, in whole seconds
    assert await calls_for(fake_upstream, key) == 0


async def test_a_rejected_request_does_not_open_the_breaker(fake_upstream: str) -> None:
    cooling = Cooling(fake_upstream, fallback=False, cooldown_after=1)
    for _ in range(3):
        with pytest.raises(UpstreamError):
            await cooling.ask(fake_upstream, {"status": 400})
    assert cooling.llm.cooldowns() == {}
    assert await cooling.ask(fake_upstream, {}) == (PRIMARY, 1)


async def test_on_cooldown_hears_the_breaker_open_and_close(fake_upstream: str) -> None:
    cooling = Cooling(fake_upstream)
    await cooling.open_primary(fake_upstream)
    assert cooling.events == [("small", PRIMARY, True)]
    cooling.clock.now += COOLDOWN_S
    await cooling.ask(fake_upstream, {})
    assert cooling.events == [("small", PRIMARY, True), ("small", PRIMARY, False)]


async def test_a_stream_that_fails_to_open_counts_towards_the_cooldown(fake_upstream: str) -> None:
    cooling = Cooling(fake_upstream, retries=0, cooldown_after=2)
    for expected_calls in (2, 2, 1):  # primary then fallback, twice; then the fallback alone
        key, messages = _ask("q", PRIMARY_DOWN)
        deltas = await _drain(cooling.llm.stream(LLMCall("small", messages)))
        assert {d.model for d in deltas} == {FALLBACK}
        assert await calls_for(fake_upstream, key) == expected_calls


async def test_a_stream_cut_after_its_first_chunk_counts_towards_the_cooldown(
    fake_upstream: str,
) -> None:
    cooling = Cooling(fake_upstream, fallback=False, cooldown_after=1)
    _, messages = _ask("one two three four five", {"truncate_after": 2})
    async with asyncio.timeout(GUARD_S):
        with pytest.raises(UpstreamError):
            await _drain(cooling.llm.stream(LLMCall("small", messages)))
    assert cooling.events == [("small", PRIMARY, True)]


async def test_a_stream_that_completes_closes_the_breaker(fake_upstream: str) -> None:
    cooling = Cooling(fake_upstream)
    await cooling.open_primary(fake_upstream)
    cooling.clock.now += COOLDOWN_S
    deltas = await _drain(cooling.llm.stream(LLMCall("small", _ask("q", {})[1])))
    assert deltas[-1].done and deltas[-1].model == PRIMARY
    assert cooling.llm.cooldowns() == {}


# --- cooldown per tenant: one tenant's failures never take a model from another -----------------


async def test_one_tenants_failing_requests_do_not_cool_the_model_down_for_another(
    fake_upstream: str,
) -> None:
    cooling = Cooling(fake_upstream)
    assert await cooling.ask(fake_upstream, {}, "quiet") == (PRIMARY, 1)
    # "noisy"'s own requests make the primary fail (its content), more than cooldown_after
    noisy = [await cooling.ask(fake_upstream, PRIMARY_DOWN, "noisy") for _ in range(4)]
    # it pays retries until its own breaker opens, then skips the primary at once
    assert noisy == [(FALLBACK, 4), (FALLBACK, 4), (FALLBACK, 1), (FALLBACK, 1)]
    assert await cooling.ask(fake_upstream, {}, "quiet") == (PRIMARY, 1)
    assert cooling.llm.cooldowns() == {}
    assert cooling.llm.tenant_cooldowns() == {("small", PRIMARY): 1}
    assert cooling.events == []  # the shared breaker (the metric) never opened


async def test_a_dead_primary_failing_for_two_tenants_cools_it_down_for_everyone(
    fake_upstream: str,
) -> None:
    cooling = Cooling(fake_upstream)
    assert await cooling.ask(fake_upstream, PRIMARY_DOWN, "a") == (FALLBACK, 4)
    assert await cooling.ask(fake_upstream, PRIMARY_DOWN, "b") == (FALLBACK, 4)
    # two failed calls, as many as cooldown_after, from two tenants: a third is not asked
    assert await cooling.ask(fake_upstream, PRIMARY_DOWN, "c") == (FALLBACK, 1)
    assert cooling.llm.cooldowns() == {("small", PRIMARY): COOLDOWN_S}
    assert cooling.events == [("small", PRIMARY, True)]


async def test_a_single_tenant_still_cools_a_failing_model_down(fake_upstream: str) -> None:
    cooling = Cooling(fake_upstream, fallback=False)
    for _ in range(2):
        with pytest.raises(BackendUnavailable):
            await cooling.ask(fake_upstream, PRIMARY_DOWN, "solo")
    assert cooling.events == [("small", PRIMARY, True)]
    key, messages = _ask("q", {})
    with pytest.raises(BackendUnavailable, match="cooling down"):
        await cooling.llm.complete(LLMCall("small", messages, tenant="solo"))
    assert await calls_for(fake_upstream, key) == 0
    # a second tenant: the cooldown stood on one tenant's failures, and is withdrawn
    assert await cooling.ask(fake_upstream, {}, "newcomer") == (PRIMARY, 1)
    assert cooling.llm.cooldowns() == {}


async def test_the_current_trace_context_reaches_the_upstream_and_none_without_one(
    fake_upstream: str,
) -> None:
    """A model call made under a span sends its W3C trace context (on both wires, completed
    and streamed); one made outside any sends none."""
    key, messages = _ask("trace me", {})
    llm = _llm(_tier(fake_upstream))
    await llm.complete(LLMCall("small", messages))  # no span: no header
    parent = SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, False, TraceFlags(1)
    )
    with trace.use_span(NonRecordingSpan(parent)):
        await llm.complete(LLMCall("small", messages))
        await _drain(llm.stream(LLMCall("small", messages)))
    stats = await upstream_stats(fake_upstream)
    sent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert stats["traceparents_by_key"][key] == [None, sent, sent]
