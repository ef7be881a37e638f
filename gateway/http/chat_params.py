"""The chat and completion endpoints' OpenAI parameters: each one honoured, or refused with
400 naming it.

Honoured on the model calls that write the answer (direct, lookup and full_context: the final
call; multihop: every turn of the agent loop, since any turn may write the answer):
`temperature`, `top_p`, `max_tokens` / `max_completion_tokens` (a cap: the call gets its own
limit or this, whichever is lower; both given, the lower), `stop`, `seed`,
`frequency_penalty`, `presence_penalty`. Without a model the answer is extractive (the best
passages, quoted): `max_tokens` cuts it, `temperature`, `top_p` and `seed` are met as they stand
(nothing is sampled: the answer is what temperature 0 asks, the same for the same request), and
`stop`, `frequency_penalty` and `presence_penalty` (non-zero) are refused by name, since a
quote cannot end at a client's marker or avoid repeating itself
(`routers.executors.Refusing.without_model`).

Direct route only: `tools`, `tool_choice`, `parallel_tool_calls` and a `response_format` of
`json_object` or `json_schema`. Every other route writes prose citing the tenant's documents,
which neither a tool call nor a JSON document can be; there (and on `auto` when the question is
not routed direct, and on a direct route without a model) the request gets 400 naming them
before any work is done (`routers.executors.Refusing.from_sources`).

The handler takes `stream`, `stream_options.include_usage` (with `stream` only), and `user` /
`safety_identifier` (written to the request's log line, never a metric label). The tool calls
and results a client sends back after its question go to the model after it (direct only,
like `tools`).

Refused with 400 unless at the value that asks for nothing (null is always that value): `n`
(1: one choice is all the gateway writes), `logprobs` (false), `top_logprobs`, `logit_bias`,
`store` (false), `metadata`, `service_tier` ("auto", "default"), `modalities` (["text"]),
`functions` and `function_call` (the deprecated form of tools: send `tools`). Any other
parameter is refused naming it: never dropped without a word.

The completion endpoint takes the same sampling parameters and `max_tokens`; `prompt` is one
string (or a list of one); `echo` (false), `suffix`, `best_of` (1), `logprobs` and the rest as
for chat.

A request with any generation parameter (or tool results) is answered afresh and not stored:
the cache holds answers to the tier's own settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from backends.llm.base import NO_OPTIONS, GenerationOptions
from gateway.errors import BadRequest, clip, listed
from gateway.http.schemas import ChatBody, GenerationBody

# Parameters the gateway cannot honour, with the values that ask for nothing and why not.
Refused = Mapping[str, tuple[tuple[Any, ...], str]]
_BOTH: dict[str, tuple[tuple[Any, ...], str]] = {
    "n": ((1,), "one choice is written per request; send n: 1 or leave it out"),
    "logit_bias": (({},), "token biases are not supported (they would bend citation markers)"),
}
CHAT_REFUSED: Refused = {
    **_BOTH,
    "logprobs": ((False,), "token log probabilities are not returned"),
    "top_logprobs": ((0,), "token log probabilities are not returned"),
    "store": ((False,), "completions are not stored for later retrieval"),
    "metadata": (({},), "completions are not stored, so there is nothing to tag"),
    "service_tier": (("auto", "default"), "the deployment's models serve every request"),
    "modalities": ((["text"],), "answers are text only"),
    "functions": ((), "the deprecated form of tools: send tools instead"),
    "function_call": ((), "the deprecated form of tool_choice: send tool_choice instead"),
}
COMPLETION_REFUSED: Refused = {
    **_BOTH,
    "logprobs": ((), "token log probabilities are not returned"),
    "best_of": ((1,), "one completion is written per request; send best_of: 1"),
    "echo": ((False,), "the prompt is not echoed back"),
    "suffix": (("",), "text insertion (a suffix after the completion) is not supported"),
}


def refuse_unsupported(body: GenerationBody, refused: Refused) -> None:
    """400 naming every parameter the gateway would otherwise have to ignore."""
    problems = []
    for name, value in sorted((body.model_extra or {}).items()):
        if value is None:
            continue
        if name not in refused:
            problems.append(f"{clip(name)}: not a parameter this endpoint supports")
            continue
        accepted, why = refused[name]
        if not any(_json_equal(value, ok) for ok in accepted):
            problems.append(f"{name}: {why}")
    extra = body.stream_options.model_extra if body.stream_options is not None else None
    problems += [f"stream_options.{clip(name)}: not supported" for name in sorted(extra or {})]
    if body.stream_options is not None and not body.stream:
        # OpenAI refuses it too; taken silently, include_usage would ask for nothing
        problems.append("stream_options: only with stream: true")
    if isinstance(body, ChatBody):
        if not body.tools and body.tool_choice is not None:
            problems.append("tool_choice: needs tools")
        if not body.tools and body.parallel_tool_calls is not None:
            problems.append("parallel_tool_calls: needs tools")
    if problems:
        raise BadRequest(listed(problems))


def _json_equal(value: object, ok: object) -> bool:
    """Equal as JSON values: 1 and 1.0 are one number, but true is not 1."""
    if isinstance(value, bool) or isinstance(ok, bool):
        return type(value) is type(ok) and value == ok
    if isinstance(value, int | float) and isinstance(ok, int | float):
        return value == ok
    return type(value) is type(ok) and value == ok


def generation_options(body: GenerationBody) -> GenerationOptions:
    """The request's parameters for the calls that write its answer (after
    `refuse_unsupported`)."""
    options = GenerationOptions(
        temperature=body.temperature,
        top_p=body.top_p,
        max_tokens=body.max_tokens,
        stop=(body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ()),
        seed=body.seed,
        frequency_penalty=body.frequency_penalty,
        presence_penalty=body.presence_penalty,
    )
    if isinstance(body, ChatBody):
        options = _chat_options(body, options)
    return NO_OPTIONS if options == NO_OPTIONS else options


def _chat_options(body: ChatBody, options: GenerationOptions) -> GenerationOptions:
    caps = [c for c in (body.max_tokens, body.max_completion_tokens) if c is not None]
    response_format = body.response_format
    if response_format is not None and response_format.type == "text":
        response_format = None  # what every answer is anyway
    tool_choice = body.tool_choice
    return replace(
        options,
        max_tokens=min(caps) if caps else None,
        response_format=(
            response_format.model_dump(exclude_none=True) if response_format else None
        ),
        tools=tuple(t.model_dump(exclude_none=True) for t in body.tools or ()),
        tool_choice=(
            tool_choice if isinstance(tool_choice, str | None) else tool_choice.model_dump()
        ),
        parallel_tool_calls=body.parallel_tool_calls,
    )
