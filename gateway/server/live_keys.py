"""Which configuration keys a reload applies and which only a restart can: the one place a key
is classified.

Every key of `Settings` is covered by exactly one entry of LIVE or RESTART_ONLY
(tests/unit/test_live_keys.py walks the model, so a new key that is in neither fails there).
A RESTART_ONLY entry may be a whole section: a key added under it is refused by a reload until
someone shows it applies live. A LIVE entry is always one key: a key added beside it must be
classified itself, since nothing reads it live by default.

A key is one field reached through sections (models); a list of sections (`tenants`,
`router.rules`, a tier's `fallbacks`) or a mapping is one key, compared whole.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel

# Read from the active Runtime's settings on each request, or built anew with each Runtime
# (the pipeline, routers, route policies, the response cache's policy, the tenants' keys).
LIVE: tuple[str, ...] = (
    "server.max_query_chars",
    "server.max_history_messages",
    "server.request_timeout_s",
    "server.write_timeout_s",
    "server.max_document_chunks",
    "server.body_read_timeout_s",
    "server.header_read_timeout_s",  # read per connection from the active Runtime
    "server.keepalive_timeout_s",  # likewise
    "server.sse_keepalive_s",
    # The admission pools are reconfigured by the holder that swaps the Runtime.
    "server.admission.queries.max_inflight",
    "server.admission.queries.max_queued",
    "server.admission.queries.tenant_max_inflight",
    "server.admission.queries.tenant_max_queued",
    "server.admission.writes.max_inflight",
    "server.admission.writes.max_queued",
    "server.admission.writes.tenant_max_inflight",
    "server.admission.writes.tenant_max_queued",
    "server.admission.max_queue_wait_s",
    "server.admission.retry_after_s",
    "tenants",
    "demo_api_key",
    "admin_api_key_sha256",
    "retrieval.k",
    "retrieval.candidates",
    "retrieval.lexical_weight",
    "retrieval.dense_weight",
    "retrieval.identifier_lexical_weight",
    "retrieval.fusion",  # every search request names it (SearchRequest.fusion)
    "retrieval.rerank.when",
    "retrieval.rerank.max_margin",
    "retrieval.rerank.skip_when_arms_agree",
    "retrieval.rerank.skip_keyword_queries",
    "retrieval.rerank.blend",
    "retrieval.rerank.title_weight",
    "retrieval.rerank.keep_full_match",
    "retrieval.rerank.full_match_min_words",
    "retrieval.rerank.candidates",
    "retrieval.rerank.passage_chars",
    "retrieval.rerank.timeout_s",
    "cache.ttl_s",
    "cache.single_flight_wait_s",
    "cache.max_entry_bytes",  # read by the response cache, built with each Runtime
    "cache.semantic.enabled",
    "cache.semantic.thresholds",
    "cache.semantic.candidates",
    "router.classifier",
    "router.thresholds",
    "router.rules",
    "router.escalation.enabled",
    "router.escalation.method",
    "router.escalation.max_insufficiency",
    "router.escalation.min_coverage",
    "router.escalation.min_agreement",
    "router.full_context.enabled",
    "router.full_context.max_tokens",
    "router.full_context.max_chunks",
    "router.rewrite_followups",
    "agent.max_steps",
    "agent.max_tool_calls",
    "agent.max_tokens",
    "agent.deadline_s",
    "agent.max_cost_usd",
    "agent.step_max_tokens",
    "agent.final_share",
    "agent.tool_timeout_s",
    "agent.search_k",
    "agent.read_max_chunks",
    "agent.min_similarity",
)

# What the process binds once, at start: sockets, connections, on-disk paths, loaded models,
# and values handed to objects built before the first request. A reload cannot apply them, and
# accepting them silently would announce a config version that is not the one running. The
# chart rolls the pods when one of them changes (helm/querygate/templates/_helpers.tpl).
RESTART_ONLY: tuple[str, ...] = (
    "server.host",
    "server.port",
    "server.max_body_bytes",  # the application's client_max_size
    "server.shutdown_grace_s",  # handed to run_app
    "server.worker_max_pause_s",  # the supervisor's, read once at start
    "server.reload_poll_s",  # the file watch's interval
    "data_dir",
    "embeddings",
    "retrieval.backend",
    "retrieval.opensearch",
    # The reranker built at start (which one, its endpoint, key, breakers); the policy of
    # `retrieval.rerank` (when, margins, candidates, lengths, timeout) reloads live.
    "retrieval.rerank.reranker",
    "retrieval.rerank.remote",
    "retrieval.rerank.opensearch",
    "cache.backend",
    "cache.max_entries",  # the size of the store already built
    "cache.memory_max_bytes",  # the memory store's ceiling, fixed as it is built
    # The Redis connection, opened once at start (cache and quotas share it).
    "cache.redis_url",
    "cache.redis_socket_timeout_s",
    "cache.redis_connect_timeout_s",
    "cache.redis_max_connections",
    "cache.redis_request_budget_s",
    "quotas",  # where the counters live, and the store's retry interval
    "models",  # the tiers' clients and breakers, built at start
    # The tracer provider, its exporter and span limits, set up once per process.
    "tracing",
)


def config_keys(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Every key of `model`, dotted, descending into its sections (optional ones too)."""
    for name, field in model.model_fields.items():
        section = _section_of(field.annotation)
        if section is None:
            yield prefix + name
        else:
            yield from config_keys(section, f"{prefix}{name}.")


def _section_of(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (also as `Model | None`), or None for a key's value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        models = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(models) == 1:
            return _section_of(models[0])
    return None


def changed_keys(old: BaseModel, new: BaseModel) -> list[str]:
    """The keys whose values differ between two configurations, secrets included."""
    return list(_changed(type(old), old, new, ""))


def _changed(model: type[BaseModel], old: BaseModel, new: BaseModel, prefix: str) -> Iterator[str]:
    for name, field in model.model_fields.items():
        before, after = getattr(old, name), getattr(new, name)
        if before == after:
            continue
        section = _section_of(field.annotation)
        if section is None or before is None or after is None:
            # A key, or a section set on one side only (named whole: it appears or goes).
            yield prefix + name
        else:
            yield from _changed(section, before, after, f"{prefix}{name}.")


def restart_only(changed: list[str]) -> list[str]:
    """The keys of `changed` a reload cannot apply: restart-only ones, and any key not
    classified (refused rather than announced and never applied)."""
    return [key for key in changed if key not in LIVE]
