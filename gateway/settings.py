"""Configuration: one YAML file plus `QUERYGATE_*` environment overrides, validated whole.

The whole configuration is one frozen model tree. A reload builds a new tree and swaps one
reference, so a request keeps the tree it started with. Nothing else reads the environment
for configuration, but for the OpenTelemetry SDK's own `OTEL_*` variables (`TracingConfig`).
Secrets are never in the file: API keys are stored as SHA-256 hashes, and model keys by the
name of the environment variable that holds them.

The tree is one module (over 400 lines) because it reads top to bottom as the file does; a
section that belongs to a backend or a router (the embedder, OpenSearch, the model tiers, the
agent, the router's rules) keeps its model beside that code and is only named here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from backends.config_yaml import load_yaml
from backends.credentials import mask, slow_digest
from backends.embeddings.config import EmbeddingsConfig
from backends.llm.base import Tier, TierConfig
from backends.retrieval.base import DEFAULT_FUSION, FusionMethod
from backends.retrieval.opensearch import OpenSearchConfig
from backends.sections import SECTION
from routers.agent_caps import AgentConfig
from routers.rerank import RerankConfig
from routers.rules import RouterConfig
from routers.types import Route

log = logging.getLogger(__name__)

_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


class ConfigError(Exception):
    """The configuration cannot be used; the message names the bad field."""


class PoolLimits(BaseModel):
    """One admission pool's bounds, per process. A tenant past its share gets 429; the
    process past its own bounds gets 503; both at once, with Retry-After."""

    model_config = SECTION

    max_inflight: int = Field(gt=0)  # requests running at once
    max_queued: int = Field(ge=0)  # requests waiting for a slot
    tenant_max_inflight: int = Field(gt=0)  # a tenant's share of the running slots
    tenant_max_queued: int = Field(ge=0)  # and of the waiting room

    @model_validator(mode="after")
    def _shares_within_the_pool(self) -> PoolLimits:
        if self.tenant_max_inflight > self.max_inflight:
            raise ValueError("tenant_max_inflight must not exceed max_inflight")
        if self.tenant_max_queued > self.max_queued:
            raise ValueError("tenant_max_queued must not exceed max_queued")
        return self


class AdmissionConfig(BaseModel):
    """Admission control, per process (each worker of a deployment has its own).

    Defaults are sized for 2 cores: a query mostly waits on the model upstream, so 32 may run;
    a document write is CPU-bound (chunking, embedding), so 2 run and a tenant gets one.
    """

    model_config = SECTION

    queries: PoolLimits = PoolLimits(
        max_inflight=32, max_queued=64, tenant_max_inflight=16, tenant_max_queued=16
    )
    writes: PoolLimits = PoolLimits(
        max_inflight=2, max_queued=8, tenant_max_inflight=1, tenant_max_queued=2
    )
    # A waiter never waits longer than this (nor past its deadline): then 503.
    max_queue_wait_s: float = Field(default=10.0, gt=0)
    retry_after_s: int = Field(default=1, ge=1)


class ServerConfig(BaseModel):
    model_config = SECTION

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=1_048_576, gt=0)
    max_query_chars: int = Field(default=8_000, gt=0)
    max_history_messages: int = Field(default=50, ge=0)
    request_timeout_s: float = Field(default=60.0, gt=0)
    # PUT/DELETE /v1/documents: a large document takes tens of seconds to embed on 2 cores.
    write_timeout_s: float = Field(default=120.0, gt=0)
    # A document making more chunks than this is refused (PUT: 413; `querygate ingest`: named,
    # exit 1) before any embedding: each chunk costs about the same to embed, and
    # punctuation-dense text makes several times the chunks of prose per byte, so one write
    # could hold the shared embedder for minutes. The default takes 1 MiB of English prose
    # (docs/documents.md has the figures).
    max_document_chunks: int = Field(default=1_500, gt=0)
    # A request body that has not fully arrived by then gets 408 (slow clients hold no slot).
    body_read_timeout_s: float = Field(default=10.0, gt=0)
    # A request's headers not complete this long after its first byte (a connection's first
    # request: after connecting) get 408 and the connection closed: a client sending headers
    # slowly, or half of them, would hold a connection and its file descriptor for 75 s (the
    # keep-alive timeout, which still applies to an idle connection between requests).
    header_read_timeout_s: float = Field(default=10.0, gt=0)
    # An idle keep-alive connection (no byte of a next request) is closed after this: behind a
    # load balancer, longer than its idle timeout, so it never sends on a connection being
    # closed (aiohttp's `web.run_app` default).
    keepalive_timeout_s: float = Field(default=75.0, gt=0, le=3600)
    admission: AdmissionConfig = AdmissionConfig()
    # SIGTERM: stop accepting and give in-flight requests this long. At least request_timeout_s,
    # so a rollout does not cut answers that are within their own time.
    shutdown_grace_s: float = Field(default=60.0, ge=0)
    # The longest pause before replacing a worker that died (pauses double from 0.5 s): once no
    # worker serves and a start failed after it, the supervisor exits 1 for the orchestrator.
    worker_max_pause_s: float = Field(default=30.0, ge=1, le=600)
    # A stream whose answer is not ready yet (an agent loop) gets an SSE comment this often.
    sse_keepalive_s: float = Field(default=10.0, gt=0)
    # How often the config file is checked for changes; 0 turns the file watch off.
    reload_poll_s: float = Field(default=2.0, ge=0)


class RateLimit(BaseModel):
    """A tenant's request rate: a token bucket refilled at `requests_per_s`, holding at most
    `burst` (the requests that may arrive at once after a quiet spell)."""

    model_config = SECTION

    # At least one request in ~3 hours: a slower bucket would outlive any sensible key TTL.
    requests_per_s: float = Field(ge=1e-4, allow_inf_nan=False)
    burst: int = Field(ge=1, le=1_000_000)


class AccessControlConfig(BaseModel):
    """Document-level access for a tenant's end users (docs/access.md): a query carries the
    user's groups in `X-Querygate-User`, an HS256 JWT the tenant signs with this secret."""

    model_config = SECTION

    # The environment variable holding the signing secret (at least 32 bytes), never the
    # secret: read when the configuration is applied (start, reload).
    secret_env: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
    # Every query must carry an assertion (401 without). false: a query without one reads the
    # documents without an access list only.
    required: bool = True
    # An assertion expiring further ahead than this is refused: a leaked one stays usable
    # for at most this long.
    max_ttl_s: int = Field(default=3600, ge=1, le=86_400)


def _one_or_many_schema(schema: dict[str, Any]) -> None:
    """The published schema of a field that also takes one item for a list of one."""
    many = {k: schema.pop(k) for k in ("type", "items", "minItems") if k in schema}
    schema["anyOf"] = [{"type": "string"}, many]


class TenantConfig(BaseModel):
    model_config = SECTION

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    api_key_sha256: tuple[str, ...] = Field(min_length=1, json_schema_extra=_one_or_many_schema)
    # May a request name its own route instead of "auto"?
    allow_force_route: bool = True
    # May a question be answered from the tenant's whole corpus at once (full context, when
    # `router.full_context` is on and the corpus fits)? The corpus read is the documents the
    # user may read (`access_control`).
    allow_full_context: bool = True
    # Document-level access for the tenant's end users; None: no assertion is accepted, and
    # queries read the documents without an access list.
    access_control: AccessControlConfig | None = None
    # Requests of every tenant endpoint, shared by every replica (gateway/limits/quotas.py); over
    # it: 429 with Retry-After. None: no rate limit.
    rate_limit: RateLimit | None = None
    # USD of model calls per UTC day, checked before each call; spent: 429 naming it until
    # 00:00 UTC. None: no budget.
    daily_budget_usd: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    # Seconds within which the tenant's index is expected to change (a source synced daily:
    # 86400 and some): exported as querygate_index_expect_writes_within_seconds, and the
    # QuerygateIndexStale alert fires when the index went longer without a write. None: no
    # expectation, no alert.
    expect_writes_within_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _deprecated_per_user_access(cls, data: Any) -> Any:
        """`per_user_access: true` is the deprecated spelling of `allow_full_context: false`:
        it loads, with a warning, since it promises more than it does."""
        if not isinstance(data, dict) or "per_user_access" not in data:
            return data
        data = dict(data)
        old = data.pop("per_user_access")
        if not isinstance(old, bool):
            raise ValueError("per_user_access (deprecated) must be true or false")
        if "allow_full_context" in data and data["allow_full_context"] is old:
            raise ValueError("per_user_access (deprecated) contradicts allow_full_context")
        data.setdefault("allow_full_context", not old)
        log.warning(
            "tenants: per_user_access is deprecated and only ever disabled full-context "
            "answers; write allow_full_context: %s instead",
            str(not old).lower(),
        )
        return data

    @field_validator("api_key_sha256", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return (value,) if isinstance(value, str) else value

    @field_validator("api_key_sha256")
    @classmethod
    def _hex_digests(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for digest in value:
            if not _SHA256_HEX.match(digest):
                raise ValueError("must be a lowercase hex SHA-256 digest of the API key")
        return value


_DEFAULT_ROUTE_TIERS: dict[Route, Tier] = {
    Route.DIRECT: "small",
    Route.LOOKUP: "small",
    Route.FULL_CONTEXT: "small",
    Route.MULTIHOP: "large",
}


class ModelsConfig(BaseModel):
    """No tier configured means generation is off for it: the gateway answers extractively."""

    model_config = SECTION

    small: TierConfig | None = None
    large: TierConfig | None = None
    # The tier each route's model calls use; a route whose tier has no model answers without
    # one (direct, lookup), or is not executable here (multihop, full_context).
    routes: dict[Route, Tier] = Field(default_factory=lambda: dict(_DEFAULT_ROUTE_TIERS))

    @field_validator("routes")
    @classmethod
    def _every_route(cls, value: dict[Route, Tier]) -> dict[Route, Tier]:
        missing = sorted(r.value for r in Route if r not in value)
        if missing:
            raise ValueError(f"no tier for route(s) {', '.join(missing)}")
        return value


class RetrievalConfig(BaseModel):
    model_config = SECTION

    backend: Literal["embedded", "opensearch"] = "embedded"
    k: int = Field(default=6, ge=1, le=50)
    candidates: int = Field(default=50, ge=1, le=1000)
    lexical_weight: float = Field(default=1.0, ge=0)
    dense_weight: float = Field(default=1.0, ge=0)
    # The lexical weight of a query naming identifiers (error codes, SKUs) or written as keywords
    # rather than a question (`routers.policy.lexical_reason`): found by exact terms, not by
    # meaning. 4 chosen with the fusion on bench/retrieval_eval.py's tuning split.
    identifier_lexical_weight: float = Field(default=4.0, ge=0)
    # How hybrid search fuses BM25 and k-NN: "minmax_peak" (scores scaled per arm, each arm
    # weighted up by how far its best candidate leads; within the interval of the better arm on
    # both of bench/retrieval_eval.py's benchmarks, recall@10 and MRR@10), "minmax", "rrf" or
    # "zscore". Applies to both backends (docs/opensearch.md, "Fusion").
    fusion: FusionMethod = DEFAULT_FUSION
    opensearch: OpenSearchConfig = OpenSearchConfig()
    # The second stage, and when a query pays for it (routers/rerank.py; docs/reranking.md).
    rerank: RerankConfig = RerankConfig()

    @model_validator(mode="after")
    def _reranker_on_its_backend(self) -> RetrievalConfig:
        if self.rerank.reranker == "opensearch" and self.backend != "opensearch":
            raise ValueError("rerank.reranker 'opensearch' needs backend: opensearch")
        return self


DEFAULT_SEMANTIC_THRESHOLD = 0.96  # see SemanticCacheConfig.thresholds


class SemanticCacheConfig(BaseModel):
    """The second cache tier: a paraphrase of a cached question gets its answer, when the
    embeddings are this close and no guard (numbers, dates, negation, comparison, scope,
    entities, identifiers) tells the two questions apart. Thresholds per route, chosen by
    bench/cache_eval.py."""

    model_config = SECTION

    enabled: bool = True
    # 0.96: the lowest threshold at which, with the guards, no hard negative of FanOutQA dev's
    # tuning part hits; 0.95 lets a parent hit its own sub-question, 0.97 serves fewer
    # meaning-preserving rewrites (`python bench/cache_eval.py`; docs/benchmarks.md).
    # Direct and full_context have no such data and take the lookup's value.
    thresholds: dict[Route, float] = Field(
        default_factory=lambda: {route: DEFAULT_SEMANTIC_THRESHOLD for route in Route}
    )
    # How many nearest entries are checked against the guards before giving up.
    candidates: int = Field(default=4, ge=1, le=32)

    @field_validator("thresholds")
    @classmethod
    def _similarities(cls, value: dict[Route, float]) -> dict[Route, float]:
        # A route left out keeps the default; 1.0 all but turns the tier off for a route.
        for route, threshold in value.items():
            if not 0.5 <= threshold <= 1.0:
                raise ValueError(
                    f"{route.value}: a cosine similarity from 0.5 to 1, not {threshold}"
                )
        return {**{route: DEFAULT_SEMANTIC_THRESHOLD for route in Route}, **value}


class CacheConfig(BaseModel):
    model_config = SECTION

    # memory: in-process, per replica (the embedded default); redis: shared by the fleet.
    backend: Literal["memory", "redis", "off"] = "memory"
    redis_url: SecretStr = SecretStr("redis://127.0.0.1:6379/0")
    # Short and explicit: a slow Redis costs a request at most this, then it is a miss.
    redis_socket_timeout_s: float = Field(default=0.25, gt=0)
    redis_connect_timeout_s: float = Field(default=0.5, gt=0)
    redis_max_connections: int = Field(default=64, gt=0)
    # What one request's Redis calls (cache and quotas) may take together; once spent, the
    # request's next calls fail at once, as if Redis were down. A healthy Redis answers a
    # request's 3-6 round trips in a few ms; a slow one would cost a socket timeout each.
    redis_request_budget_s: float = Field(default=0.25, gt=0)
    # Fixed at write: a hit never extends it.
    ttl_s: int = Field(default=3600, gt=0)
    # Per tenant: writing past it evicts that tenant's oldest entries only.
    max_entries: int = Field(default=10_000, gt=0)
    # An answer whose entry (key, question, answer) is bigger is not stored, on any backend
    # (querygate_cache_not_stored_total{reason="too_large"}).
    max_entry_bytes: int = Field(default=256 * 1024, ge=1024)
    # The memory backend's whole store, every tenant's entries together; past it the tenant
    # holding the most loses its oldest first. Read at start, as the store is built.
    memory_max_bytes: int = Field(default=256 * 1024 * 1024, ge=1024 * 1024)
    semantic: SemanticCacheConfig = SemanticCacheConfig()
    # Concurrent identical misses: one computes, the others wait this long for its answer.
    single_flight_wait_s: float = Field(default=30.0, ge=0)


class QuotasConfig(BaseModel):
    """Where the tenants' rate limits and budgets are kept (gateway/limits/quotas.py)."""

    model_config = SECTION

    # auto: in Redis (at cache.redis_url) when cache.backend is redis, else per process;
    # redis: in Redis at cache.redis_url whatever the cache uses; memory: per process.
    backend: Literal["auto", "memory", "redis"] = "auto"
    # After Redis fails, this process enforces on its own for this long before it asks Redis
    # again (so an outage costs one request a socket timeout per interval, not every request).
    redis_retry_s: float = Field(default=1.0, gt=0)

    def uses_redis(self, cache_backend: str) -> bool:
        return self.backend == "redis" or (self.backend == "auto" and cache_backend == "redis")


class TracingConfig(BaseModel):
    """OpenTelemetry traces (gateway/obs/tracing.py, docs/tracing.md), off unless turned on here
    or by the SDK's own `OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT`; `OTEL_SDK_DISABLED=true` turns
    them off whatever this says. The other `OTEL_*` variables (service name, sampler, headers)
    are read by the SDK itself."""

    model_config = SECTION

    # None: on when the environment names an OTLP endpoint; true or false: as said.
    enabled: bool | None = None
    # The OTLP/HTTP traces URL (".../v1/traces"); None: the SDK's environment or its default.
    endpoint: str | None = Field(default=None, min_length=1, max_length=2048)
    # OTEL_SERVICE_NAME, when set, names the service instead.
    service_name: str = Field(default="querygate", min_length=1, max_length=128)
    # The client's question on the request span: off, it is the tenant's data.
    record_question: bool = False
    # Every string attribute is cut to this many characters (an upstream's error, a question).
    max_attribute_length: int = Field(default=256, ge=16, le=8192)


def default_data_dir() -> Path:
    """`$XDG_DATA_HOME/querygate`, or `~/.local/share/querygate`: one place whatever the current
    directory, so `querygate ingest` run from any folder fills the index `serve` reads."""
    xdg = os.environ.get("XDG_DATA_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "querygate"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="QUERYGATE_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,
    )

    # Relative in the file: to the file's folder; in QUERYGATE_DATA_DIR: to the current one.
    data_dir: Path = Field(default_factory=default_data_dir)
    server: ServerConfig = ServerConfig()
    tenants: tuple[TenantConfig, ...] = ()
    # Only used when no tenant is configured: the one `demo` tenant's key.
    demo_api_key: SecretStr | None = None
    admin_api_key_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    models: ModelsConfig = ModelsConfig()
    embeddings: EmbeddingsConfig = EmbeddingsConfig()
    retrieval: RetrievalConfig = RetrievalConfig()
    cache: CacheConfig = CacheConfig()
    quotas: QuotasConfig = QuotasConfig()
    router: RouterConfig = RouterConfig()
    agent: AgentConfig = AgentConfig()
    tracing: TracingConfig = TracingConfig()

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        # Resolved once, at load: a later chdir (or a worker started elsewhere) cannot move it.
        return value.expanduser().absolute()

    @field_validator("tenants")
    @classmethod
    def _unique_tenants(cls, value: tuple[TenantConfig, ...]) -> tuple[TenantConfig, ...]:
        ids = [t.id for t in value]
        if len(ids) != len(set(ids)):
            raise ValueError("tenant ids must be unique")
        digests = [d for t in value for d in t.api_key_sha256]
        if len(digests) != len(set(digests)):
            raise ValueError("an API key may belong to one tenant only")
        return value

    @model_validator(mode="after")
    def _tenant_references(self) -> Settings:
        """What no field validator sees: tenants named elsewhere. A reload that removes a
        tenant a rule still names is refused, naming the rule."""
        admin = self.admin_api_key_sha256
        for tenant in self.tenants:
            if admin is not None and admin in tenant.api_key_sha256:
                # That tenant could read every tenant's configuration and reload it.
                raise ValueError(
                    f"admin_api_key_sha256: the admin key is also tenant {tenant.id!r}'s API "
                    "key; give the admin a key of its own"
                )
        # With none configured, the one tenant is gateway.core.runtime's DEMO_TENANT.
        known = {t.id for t in self.tenants} or {"demo"}
        for n, rule in enumerate(self.router.rules):
            if unknown := sorted(set(rule.when.tenants) - known):
                # A misspelt tenant id silently never matches: the rule would route nobody.
                raise ValueError(
                    f"router.rules.{n}.when.tenants: no tenant {', '.join(map(repr, unknown))} "
                    f"is configured (rule {rule.name!r} could never match it)"
                )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The file comes in as init kwargs; the environment overrides it.
        return (env_settings, init_settings)

    @property
    def version(self) -> str:
        """A short digest of the effective configuration: it names the config in every answer.

        The credentials (backends.credentials) enter it masked, plus one slow digest of them
        all: the version changes with a password, yet is no fast oracle for guessing one, and
        costs one digest however many there are. The demo key is left out: `serve` mints it
        beside the file, and `querygate config check` names the version `serve` runs for the
        same file (a reload still sees it change: it compares keys)."""
        masked = mask(self, exclude=frozenset({"demo_api_key"}))
        text = json.dumps(masked.data, sort_keys=True)
        secrets = slow_digest("\0".join(masked.secrets))
        return hashlib.sha256(f"{text}|{secrets}".encode()).hexdigest()[:12]


def load_settings(path: Path | None) -> Settings:
    """Read, merge and validate. Raises ConfigError naming every bad field."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            # Bounded: a reload parses on a thread that shares the interpreter with serving.
            loaded = load_yaml(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as exc:  # e.g. saved as UTF-16: a refusal, not a crash
            raise ConfigError(f"cannot read {path}: not UTF-8 text ({exc})") from exc
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read {path}: {exc}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
        if odd := [repr(key) for key in (loaded or {}) if not isinstance(key, str)]:
            # Settings(**data) would raise TypeError, not name the key
            raise ConfigError(f"{path}: top-level keys must be names, not {', '.join(odd)}")
        data = loaded or {}
        data_dir = data.get("data_dir")
        if isinstance(data_dir, str) and not Path(data_dir).expanduser().is_absolute():
            data["data_dir"] = str(path.absolute().parent / data_dir)
    try:
        return Settings(**data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path)) from exc


def _describe(exc: ValidationError, path: Path | None) -> str:
    where = str(path) if path else "environment"
    lines = [f"invalid configuration ({where}):"]
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "(root)"
        lines.append(f"  {field}: {err['msg']}")
    return "\n".join(lines)


def hash_api_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()
