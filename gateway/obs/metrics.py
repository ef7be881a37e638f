"""Every Prometheus metric the gateway exports, declared once, on a registry per app.

Labels take values from small closed sets (routes, stages, tiers, outcomes, configured model
names): never a query or a document id, which would grow without bound, and a tenant id only on
the index freshness gauges (`index_metrics`), whose tenants are the configured ones. Because the
sets are closed, `initialise` makes every family's known series at 0 when a process starts
(`gateway.server.metric_series` names them), so a panel or an alert reads 0 from the first
scrape rather than nothing until the first event.

Over 400 lines because every family is declared here, each with its help text: one module is the
list an operator reads to know what the gateway exports.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import ClassVar

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    generate_latest,
)
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from gateway.obs import pool
from gateway.obs.index_metrics import INFO, TENANT_FAMILIES, IndexMetrics

# Set by `serve --workers N` for every worker: metrics then live in files there, and a scrape
# of any worker reports the sum over all of them.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# Gateway-side latencies span sub-millisecond cache hits to multi-second agent loops.
_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
)  # fmt: skip


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "querygate_requests", "Answered requests.", ["route", "outcome", "cache"], registry=r
        )
        self.request_duration = Histogram(
            "querygate_request_duration_seconds",
            "Time from request parsed to answer ready, by final route.",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.stage_duration = Histogram(
            "querygate_stage_duration_seconds",
            "Time spent in each pipeline stage.",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.route_decisions = Counter(
            "querygate_route_decisions",
            "Routing decisions, by route and the rule or classifier that made them.",
            ["route", "reason"],
            registry=r,
        )
        self.escalations = Counter(
            "querygate_escalations",
            "Questions handed from a cheaper route to a dearer one.",
            ["from_route", "to_route", "reason"],
            registry=r,
        )
        self.cache_not_stored = Counter(
            "querygate_cache_not_stored",
            "Computed answers the response cache did not store, by why: escalated, capped, "
            "tool_calls, incomplete, abstention (gateway.cache.policy), too_large "
            "(cache.max_entry_bytes).",
            ["reason"],
            registry=r,
        )
        self.cache_lookups = Counter(
            "querygate_cache_lookups",
            "Response cache lookups, one per answering request: exact, semantic, miss, error "
            "(the store failed or the index generation was unknown: served uncached), bypass "
            "(Cache-Control: no-cache, OpenAI generation parameters, the client's tools or "
            "tool results, or a follow-up that could not be rewritten).",
            ["result"],
            registry=r,
        )
        self.llm_requests = Counter(
            "querygate_llm_requests", "LLM calls.", ["tier", "model", "outcome"], registry=r
        )
        self.llm_replies_cut = Counter(
            "querygate_llm_replies_cut",
            "LLM replies cut at their bound (backends.llm.bounds), by the bound: bytes, tokens.",
            ["tier", "reason"],
            registry=r,
        )
        self.llm_tokens = Counter(
            "querygate_llm_tokens", "LLM tokens.", ["tier", "model", "direction"], registry=r
        )
        self.llm_cost = Counter(
            "querygate_llm_cost_usd",
            "LLM spend in US dollars from configured prices.",
            ["tier", "model", "route"],
            registry=r,
        )
        self.agent_steps = Histogram(
            "querygate_agent_steps",
            "Model turns per agent loop (multihop), the answering turn included; a forced "
            "final answer after a cap is not a turn.",
            buckets=(1, 2, 3, 4, 5, 6, 8, 10, 15, 20),
            registry=r,
        )
        self.agent_cap_hits = Counter(
            "querygate_agent_cap_hits",
            "Agent loops stopped by a cap, by cap.",
            ["cap"],
            registry=r,
        )
        self.agent_degraded = Counter(
            "querygate_agent_degraded",
            "Agent loops whose model failed mid-loop, answered from the passages found: by "
            "another tier (fallback_tier) or quoted (extractive).",
            ["answer"],
            registry=r,
        )
        self.llm_cooldown_open = Gauge(
            "querygate_llm_cooldown_open",
            "1 while a model is cooled down for every tenant after repeated failures of more "
            "than one tenant's calls, or of the only tenant's (skipped, then probed).",
            ["tier", "model"],
            multiprocess_mode="livemax",
            registry=r,
        )
        self.llm_tenant_cooldowns = Gauge(
            "querygate_llm_tenant_cooldowns",
            "Tenants a model is cooled down for by their own repeated failures (the tenant is "
            "named in the log, not here).",
            ["tier", "model"],
            multiprocess_mode="livemax",
            registry=r,
        )
        self.retrieval_duration = Histogram(
            "querygate_retrieval_duration_seconds",
            "Retrieval query time.",
            ["backend", "mode"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.rerank_decisions = Counter(
            "querygate_rerank",
            "Rerank stage decisions, one per search (the lookup's and each agent search's).",
            ["decision"],
            registry=r,
        )
        self.rerank_duration = Histogram(
            "querygate_rerank_duration_seconds",
            "Time of the reranker's calls (reranked or failed), by reranker.",
            ["reranker"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.rerank_cost = Counter(
            "querygate_rerank_cost_usd",
            "USD spent on paid reranker calls, by reranker model.",
            ["model"],
            registry=r,
        )
        self.http_requests = Counter(
            "querygate_http_requests",
            "Every HTTP request, once, by endpoint (method and route template) and outcome: "
            "ok, client_error, body_timeout, shed_tenant, shed_process, rate_limited, "
            "budget_exceeded, deadline, unavailable, upstream_error, disconnect, cancelled, "
            "error.",
            ["endpoint", "outcome"],
            registry=r,
        )
        self.http_request_duration = Histogram(
            "querygate_http_request_duration_seconds",
            "Time from arrival to response, by endpoint, every outcome included.",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.admission_inflight = Gauge(
            "querygate_admission_inflight",
            "Admitted requests running, by pool.",
            ["pool"],
            multiprocess_mode="livesum",
            registry=r,
        )
        self.admission_queued = Gauge(
            "querygate_admission_queued",
            "Requests waiting for admission, by pool.",
            ["pool"],
            multiprocess_mode="livesum",
            registry=r,
        )
        self.inflight = Gauge(
            "querygate_inflight_requests",
            "Requests being served now.",
            multiprocess_mode="livesum",
            registry=r,
        )
        self.config_info = Gauge(
            "querygate_config_info",
            "The active configuration (value 1).",
            ["version"],
            multiprocess_mode="livemax",
            registry=r,
        )
        self.config_reloads = Counter(
            "querygate_config_reloads", "Configuration reloads.", ["result"], registry=r
        )
        # The semantic cache tier (gateway/cache/response.py): thresholds are tuned from these.
        self.cache_nearest_similarity = Histogram(
            "querygate_cache_nearest_similarity",
            "Cosine similarity of the nearest cached question, per semantic lookup that found "
            "one (served or not).",
            buckets=(0.5, 0.6, 0.7, 0.8, 0.85, 0.88, 0.9, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98,
                     0.99, 1.0),
            registry=r,
        )  # fmt: skip
        self.cache_guard_refusals = Counter(
            "querygate_cache_guard_refusals",
            "Cached answers above the similarity threshold refused by a guard: numbers, dates, "
            "negation, comparison, scope, identifiers, entities.",
            ["guard"],
            registry=r,
        )
        # Per-tenant quotas (gateway/limits/quotas.py). No tenant label: what one tenant spent or
        # was refused is not shown to the others (/metrics is unauthenticated); the request's log
        # line names its tenant.
        self.quota_refusals = Counter(
            "querygate_quota_refusals",
            "Requests and model calls refused by a tenant's quota: rate_limit, budget, or "
            "budget_unknown (the quota store down and the day's spend never read here).",
            ["reason"],
            registry=r,
        )
        self.quota_local_decisions = Counter(
            "querygate_quota_local_decisions",
            "Quota decisions this process made alone because the shared store (Redis) was "
            "unavailable, by check: rate_limit, budget, spend (a cost kept to add later).",
            ["check"],
            registry=r,
        )
        self.quota_store_degraded = Gauge(
            "querygate_quota_store_degraded",
            "1 while the shared quota store is unavailable and limits are per process.",
            multiprocess_mode="livemax",
            registry=r,
        )
        self.dependency_up = Gauge(
            "querygate_dependency_up",
            "1 while a backend answers its health probe (every 10 s), by dependency: retrieval, "
            "cache. With several workers, the minimum over them.",
            ["dependency"],
            multiprocess_mode="livemin",
            registry=r,
        )
        self.cache_memory_bytes = Gauge(
            "querygate_cache_memory_bytes",
            "Bytes the in-process response cache counts against cache.memory_max_bytes "
            "(entries, vectors and LSH buckets), summed over workers. 0 with the Redis cache "
            "or none.",
            multiprocess_mode="livesum",
            registry=r,
        )
        self.index = IndexMetrics(r)
        self._multiprocess_dir = os.environ.get(MULTIPROC_ENV)
        self._resources = None if self._multiprocess_dir is None else WorkerResources(r)
        if self._multiprocess_dir is None:
            for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
                r.register(collector)
            r.register(_WorkerPool())

    def labelled(self) -> dict[str, MetricWrapperBase]:
        """Every family with labels, by its name (`querygate_requests`, without `_total`).
        prometheus_client keeps a family's name and label names private: read as declared."""
        return {
            family._name: family
            for family in vars(self).values()
            if isinstance(family, MetricWrapperBase) and family._labelnames
        }

    def initialise(self, series: Mapping[str, Iterable[tuple[str, ...]]]) -> None:
        """Make each named family's series of these label values, at 0 (a counter or histogram
        not yet observed, a gauge not yet set). With several workers each one makes them in its
        own files, which the scrape sums: a new worker, replacing one, makes them again."""
        families = self.labelled()
        for name, values in series.items():
            family = families[name]
            for labels in values:
                family.labels(*labels)

    async def publish_resources(self, every_s: float = 5.0) -> None:
        """With several workers: publish this worker's memory, CPU and fds for the sum,
        until cancelled. With one process the standard collectors read them at scrape."""
        if self._resources is None:
            return
        while True:
            self._resources.refresh()
            await asyncio.sleep(every_s)

    def exposition(self, tenants: bool = False) -> bytes:
        """The text a scrape gets: this process's registry, or the sum over every worker;
        the families labelled by tenant only when `tenants` (an admin's scrape)."""
        hidden = frozenset() if tenants else TENANT_FAMILIES
        if self._multiprocess_dir is None:
            return generate_latest(_Without(self.registry, hidden))
        registry = CollectorRegistry()
        registry.register(_WorkerFiles(self._multiprocess_dir))
        registry.register(_WorkerPool())
        PlatformCollector(registry=registry)
        return generate_latest(_Without(registry, hidden))


class _Without:
    """A registry's families but those named in `hidden`."""

    def __init__(self, registry: CollectorRegistry, hidden: frozenset[str]) -> None:
        self._registry = registry
        self._hidden = hidden

    def collect(self) -> Iterator[Metric]:
        return (f for f in self._registry.collect() if f.name not in self._hidden)


class _WorkerFiles:
    """Every worker's metric files, summed, less the config versions (and index models) no
    live worker reports: a worker's file keeps every label set it ever wrote (remove() cannot
    take one out of it), so each reload left its old version behind at 0, one more series per
    distinct version until a restart. Only the value 1 means a version is active."""

    def __init__(self, path: str) -> None:
        self._files = MultiProcessCollector(None, path)  # type: ignore[no-untyped-call]

    def collect(self) -> Iterator[Metric]:
        for family in self._files.collect():  # type: ignore[no-untyped-call]
            if family.name in ("querygate_config_info", INFO):
                family.samples = [s for s in family.samples if s.value == 1]
            yield family


class _WorkerPool:
    """`querygate_workers`, read at scrape from what the supervisor counts (shared memory):
    every worker reports the same figures, and no file is left by a dead one. A single
    process is one worker of one, serving since it answers the scrape (an alert on the
    gauge then holds for every pod)."""

    def collect(self) -> Iterator[Metric]:
        counts = pool.pool_counts() or (1, 1)
        family = GaugeMetricFamily(
            "querygate_workers",
            "Worker processes of serve --workers N: serving (alive and ready) and expected "
            "(N). Fewer serving: one crashed or cannot start, and is being replaced.",
            labels=["state"],
        )
        family.add_metric(["serving"], counts[0])
        family.add_metric(["expected"], counts[1])
        yield family


class WorkerResources:
    """The standard process_* figures summed over workers: the default process collector
    would report only the one worker a scrape happens to reach (GC statistics are per
    interpreter and are not exported with several workers). CPU time is a counter that each
    worker adds its own to, so it never falls when a worker dies; the others are gauges over
    the live workers."""

    _CPU = "process_cpu_seconds"
    # Summed over workers, except where a sum means nothing.
    _MODES: ClassVar[dict[str, str]] = {
        "process_start_time_seconds": "livemin",
        "process_max_fds": "livemin",
    }

    def __init__(self, registry: CollectorRegistry) -> None:
        self._gauges: dict[str, Gauge] = {}
        self._cpu_seen = 0.0
        self._cpu = Counter(
            self._CPU,
            "Total CPU time of every worker, dead ones included, in seconds.",
            registry=registry,
        )
        for family in PROCESS_COLLECTOR.collect():
            if family.name == self._CPU:
                continue
            for sample in family.samples:
                self._gauges[sample.name] = Gauge(
                    sample.name,
                    family.documentation + " (over live workers)",
                    multiprocess_mode=self._MODES.get(sample.name, "livesum"),  # type: ignore[arg-type]
                    registry=registry,
                )

    def refresh(self) -> None:
        for family in PROCESS_COLLECTOR.collect():
            for sample in family.samples:
                if family.name == self._CPU:
                    self._cpu.inc(max(0.0, sample.value - self._cpu_seen))
                    self._cpu_seen = max(self._cpu_seen, sample.value)
                elif (gauge := self._gauges.get(sample.name)) is not None:
                    gauge.set(sample.value)
