"""Requests and answers in OpenAI's chat shape, for both wires (litellm's and the lean one).

Messages go out as OpenAI's JSON; the sampling parameters are the client's over the tier's
(no litellm `drop_params`: a parameter an upstream refuses is refused, never dropped). Answers
come back as a `Completion` priced at the deployment's per-token prices: cost is ours, not
litellm's (`response_cost` is None for unregistered models). An upstream that reports no usage
is estimated with `litellm.token_counter`, and the answer says so.

litellm is imported where it is called, not here: the request core reaches this module through
metering, and importing litellm costs seconds of CPU, which a process that calls no model (the
CLI's ingest, eval, reindex and route) never pays. A serving process has imported it already,
with its tiers.
"""

from __future__ import annotations

# isort: off
from backends.llm import offline  # noqa: F401  (must run before litellm is imported)

# isort: on
import json
import logging
import math
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from backends.errors import UpstreamError
from backends.llm import openai_http
from backends.llm.base import Completion, GenerationOptions, Message, Tier, ToolCall
from backends.llm.deployments import Deployment
from backends.llm.propagation import trace_headers

if TYPE_CHECKING:
    from litellm import ModelResponse

log = logging.getLogger(__name__)

# What reading valid JSON of a shape no OpenAI answer has raises (a message that is a string,
# tokens that are words): the model's failure, like a body that is not JSON.
ODD_SHAPE = (AttributeError, TypeError, ValueError, KeyError)


def to_wire(message: Message) -> dict[str, Any]:
    wire: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_call_id is not None:
        wire["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        wire["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": _arguments_text(call)},
            }
            for call in message.tool_calls
        ]
    return wire


def litellm_args(
    deployment: Deployment,
    wire: list[dict[str, Any]],
    max_tokens: int | None,
    options: GenerationOptions,
) -> dict[str, Any]:
    """The keyword arguments of `litellm.acompletion` for one call; the trace context goes
    to the upstream as headers when there is one."""
    config = deployment.config
    traced = trace_headers()
    return {
        "model": config.model,
        "messages": wire,
        "api_base": config.api_base,
        "api_key": deployment.api_key,
        "timeout": config.timeout_s,
        **_generation(deployment, max_tokens, options),
        "max_retries": 0,  # the tiers' own retries are the one retry layer
        **({"extra_headers": traced} if traced else {}),
    }


def lean_body(
    deployment: Deployment,
    wire: list[dict[str, Any]],
    max_tokens: int | None,
    options: GenerationOptions,
) -> dict[str, Any]:
    """The request litellm would send an OpenAI-compatible server for `litellm_args`."""
    return {
        "model": deployment.config.model.removeprefix(openai_http.PREFIX),
        "messages": wire,
        **_generation(deployment, max_tokens, options),
    }


def reply_limit(deployment: Deployment, max_tokens: int | None, options: GenerationOptions) -> int:
    """The completion token limit a call sends: the call's, the tier's, capped by the client's."""
    return options.cap(max_tokens or deployment.config.max_tokens)


def _generation(
    deployment: Deployment, max_tokens: int | None, options: GenerationOptions
) -> dict[str, Any]:
    return {
        "temperature": deployment.config.temperature,
        **options.wire(),
        "max_tokens": reply_limit(deployment, max_tokens, options),
    }


def from_litellm(
    tier: Tier, deployment: Deployment, wire: list[dict[str, Any]], response: ModelResponse
) -> Completion:
    """The answer of a litellm call."""
    if not response.choices:
        raise UpstreamError("llm", f"{deployment.model}: response without choices")
    choice = response.choices[0]
    message = choice.message
    return _completion(
        tier,
        deployment,
        wire,
        message.content or "",
        (response.usage.prompt_tokens, response.usage.completion_tokens),
        tuple(parse_tool_call(c) for c in message.tool_calls or ()),
        choice.finish_reason,
    )


def from_json(
    tier: Tier, deployment: Deployment, wire: list[dict[str, Any]], answer: dict[str, Any]
) -> Completion:
    """The answer of a lean call: `from_litellm` for a decoded OpenAI answer."""
    choices = answer.get("choices")
    if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
        raise UpstreamError("llm", f"{deployment.model}: response without choices")
    choice = choices[0]
    try:
        message = choice.get("message") or {}
        text = text_of(message)
        tokens = usage_tokens(answer.get("usage") or {})
        calls = tuple(parse_tool_call(_json_call(c)) for c in listed(message, "tool_calls"))
    except ODD_SHAPE as exc:
        raise odd_shape(deployment, "response", exc) from exc
    return _completion(tier, deployment, wire, text, tokens, calls, choice.get("finish_reason"))


def _completion(
    tier: Tier,
    deployment: Deployment,
    wire: list[dict[str, Any]],
    text: str,
    tokens: tuple[int, int],
    tool_calls: tuple[ToolCall, ...],
    finish_reason: str | None,
) -> Completion:
    """One answer, whichever wire brought it. An upstream that sent no usage (zeros) is
    estimated: a real prompt is never free, so the call is not booked at no cost."""
    estimated = tokens[0] == 0
    if estimated:
        log.warning("llm %s sent no usage; estimating tokens", deployment.model)
        tokens = estimate_usage(deployment.model, wire, text)
    return Completion(
        text=text,
        tier=tier,
        model=deployment.model,
        usage=deployment.cost(*tokens),
        tool_calls=tool_calls,
        finish_reason=finish_reason or "stop",
        usage_estimated=estimated,
    )


def estimate_usage(model: str, messages: list[dict[str, Any]], text: str) -> tuple[int, int]:
    """(prompt, completion) tokens for a call whose upstream reported none."""
    return count_tokens(model, messages=messages), count_tokens(model, text=text)


def count_tokens(model: str, messages: Sequence[dict[str, Any]] = (), text: str = "") -> int:
    """Tokens of wire `messages` (or of `text`) as litellm counts them; about 4 characters a
    token when its tokenizer fails, since a count that raised would lose the charge."""
    if not messages and not text:
        return 0
    import litellm

    try:
        if messages:
            return int(litellm.token_counter(model=model, messages=list(messages)))
        return int(litellm.token_counter(model=model, text=text))
    except Exception:
        log.debug("token count failed; estimating from characters", exc_info=True)
        chars = sum(len(text_of(m)) for m in messages) + len(text)
        return math.ceil(chars / 4)


def text_counter(model: str) -> Callable[[str], int]:
    """`count_tokens` of a text, for `model`."""
    return lambda text: count_tokens(model, text=text)


def parse_tool_call(raw: Any) -> ToolCall:
    """A tool call; arguments that are not a JSON object are the model's mistake, not the
    upstream's: the call comes back with `error` set so the caller can tell the model."""
    name = str(raw.function.name or "")
    text = str(raw.function.arguments or "")
    try:
        arguments = json.loads(text or "{}")
    except (ValueError, RecursionError):  # not JSON, over 4,300 digits, nested too deeply
        return ToolCall(raw.id, name, {}, error="invalid JSON", raw_arguments=text)
    if not isinstance(arguments, dict):
        return ToolCall(raw.id, name, {}, error="not a JSON object", raw_arguments=text)
    return ToolCall(id=raw.id, name=name, arguments=arguments, raw_arguments=text)


def _arguments_text(call: ToolCall) -> str:
    """A tool call's arguments as the model wrote them, when known."""
    return call.raw_arguments if call.raw_arguments is not None else json.dumps(call.arguments)


def _json_call(raw: dict[str, Any]) -> SimpleNamespace:
    function = raw.get("function") or {}
    return SimpleNamespace(
        id=raw.get("id") or "",
        function=SimpleNamespace(name=function.get("name"), arguments=function.get("arguments")),
    )


def odd_shape(deployment: Deployment, what: str, exc: Exception) -> UpstreamError:
    return UpstreamError("llm", f"{deployment.model}: {what} of an odd shape: {exc}")


def usage_tokens(usage: dict[str, Any]) -> tuple[int, int]:
    counts = (usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0)
    if not all(isinstance(n, int | float) and n >= 0 for n in counts):
        raise ValueError(f"usage {counts!r:.60}")
    return int(counts[0]), int(counts[1])


def text_of(message: dict[str, Any]) -> str:
    text = message.get("content") or ""
    if not isinstance(text, str):
        raise TypeError(f"content is {type(text).__name__}")
    return text


def listed(parent: dict[str, Any], key: str) -> list[Any]:
    value = parent.get(key) or []
    if not isinstance(value, list):
        raise TypeError(f"{key} is {type(value).__name__}")
    return value
