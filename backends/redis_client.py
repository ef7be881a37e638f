"""The process's one Redis client, shared by the cache store and the quota store.

Built once per process from `RedisOptions` (services.py fills them from `cache.redis_*`):

- one connection pool (per node on a cluster), at most `max_connections` connections, and at
  most that many calls in flight: a call past it waits for one to end (within its bound) rather
  than fail as if Redis were down;
- explicit, short socket and connect timeouts: a cache that fails open must fail fast, and a
  Redis that accepts connections but never answers (overloaded, paused) costs a request one
  socket timeout, not the request's deadline;
- no client-side retries (redis-py 6+ retries 3 times with backoff by default): the gateway's
  one retry layer is the next request, and retries under a down Redis only multiply the load
  and the latency of every miss;
- every call goes through `call()`, which bounds it as a whole (`op_timeout_s`) and turns any
  client failure into `BackendUnavailable`, so no caller ever catches a redis-py exception;
- a request's calls together are bounded too (`request_budget_s`): the gateway makes one
  `RequestSpend` per request, and every call made for the request passes it to `call()`.
  Each call is cut at what is left of the budget, and once it is spent every call fails at
  once, so a slow-but-alive Redis costs a request at most that budget, not one socket timeout
  per round trip, and the request is decided as if Redis were down (the cache fails open, the
  quotas decide per process). A call cut by the budget is not itself a verdict on Redis's
  health (`RequestBudgetSpent.cut`): the quotas confirm it with a probe of its own bound.
  Work that no answer waits for (spend records, cache writes, lease renewals and releases)
  passes none: its calls are bounded one by one, not by a request's budget, which
  it would otherwise eat into, or find spent and fail (a cache write or spend record lost
  for nothing).
- `ping()`, the health verdict of the cache and the quotas alike, is timed on a thread of its
  own with a connection of its own: a Redis that answers, but slower than a request's budget,
  is down for the requests (every one would spend its budget waiting), and neither the event
  loop's backlog nor a wait for one of the pool's connections is counted against Redis. A
  PING over the budget is tried again, so a TCP connect, a TLS handshake, `CLIENT SETINFO` or
  one pause of the server is never taken for a slow server, and a warm probe is one PING.

Cluster mode is chosen by the URL's scheme, never guessed: `redis+cluster://host:port` (or
`rediss+cluster://` for TLS) names one or more seed nodes of a Redis Cluster and builds a
`redis.asyncio.cluster.RedisCluster`; `redis://` and `rediss://` build a single-node client.
A guess from `INFO cluster` would need Redis up at start-up, and a cache must let the gateway
start while Redis is down. `start()` checks the guess the other way round once Redis answers:
a `redis://` URL that reaches a cluster node (whose keys would answer MOVED) refuses to start
with `RedisModeMismatch`, and so does `redis+cluster://` on a standalone server.

`start()` also detects an optional server-side vector search and says so in one log line:
Redis 8's vector sets (`VSIM`), or the query engine (the `search` module, 2.4+, whose
`FT.SEARCH` takes VECTOR fields). Debian's Redis 7.0 has neither (its RediSearch 1.2 has no
vectors), and neither do most managed fleets, so the cache store never relies on one: the fast
path is detected and reported, not built (it could not be tested here).

Over 400 lines because the bounds above are one contract: the call guard, the request budget,
the health PING and the start-up probe share the options and the failure map, and a caller
reads them in one place.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry as BlockingRetry

from backends.errors import BackendError, BackendUnavailable
from backends.redis_lua import Client, Script

log = logging.getLogger(__name__)

T = TypeVar("T")

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
# The query engine's vector fields arrived in RediSearch 2.4 (module version 20400).
_SEARCH_VECTOR_MIN_VERSION = 20400
# PINGs a probe may send to one node before it calls the node slow.
PING_TRIES = 3


class RedisModeMismatch(BackendError):
    """The URL says single node but the server is a cluster node, or the other way round."""


@dataclass(frozen=True, slots=True)
class RedisOptions:
    url: str
    socket_timeout_s: float = 0.25
    connect_timeout_s: float = 0.5
    max_connections: int = 64
    # What one request's calls may take together (None: each call bounded alone).
    request_budget_s: float | None = 0.25

    @property
    def cluster(self) -> bool:
        return urlsplit(self.url).scheme in CLUSTER_SCHEMES

    @property
    def client_url(self) -> str:
        """The URL redis-py understands: the `+cluster` suffix stripped."""
        parts = urlsplit(self.url)
        scheme = CLUSTER_SCHEMES.get(parts.scheme, parts.scheme)
        return urlunsplit(parts._replace(scheme=scheme))

    @property
    def op_timeout_s(self) -> float:
        """A bound on one whole call: a connect, a write and a read, plus a margin for the
        event loop. A cluster call that follows one MOVED or re-reads the slot map can take
        two round trips; past this bound it is a miss anyway."""
        return self.connect_timeout_s + 2 * self.socket_timeout_s + 0.05


@dataclass(slots=True)
class RequestSpend:
    """Seconds one request has spent waiting on Redis (calls in parallel each count)."""

    spent_s: float = field(default=0.0)


class RequestBudgetSpent(BackendUnavailable):
    """This request has used its Redis time: the call was not sent, or was cut at its budget.
    What it was for is decided without Redis, as if Redis were down, but it is not a verdict
    on Redis's health (a caller that tracks that, like the quotas' degraded state, leaves it
    as it is). `cut`: a sent call ran out of the budget, so Redis may be slow, or this
    process's loop too busy to read its answer (a burst opening connections): a caller that
    tracks health asks Redis again under a bound of its own to tell which."""

    def __init__(self, budget_s: float, *, cut: bool = False) -> None:
        super().__init__("redis", f"the request's Redis time budget ({budget_s:g}s) is spent")
        self.cut = cut


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """What `start()` learnt from the server (the node the URL names)."""

    version: str
    cluster: bool
    vector_search: str | None  # "vector sets (VSIM)", "query engine (search N)" or None


def build_client(options: RedisOptions) -> Client:
    """A client with its own pool; it connects lazily, so Redis may be down at this point."""
    common: dict[str, Any] = {
        "socket_timeout": options.socket_timeout_s,
        "socket_connect_timeout": options.connect_timeout_s,
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 0,
    }
    if options.cluster:
        # max_connections is per node on a cluster. A topology error (MOVED after a
        # failover) is followed by redis-py's redirect handling, not by a retry.
        return RedisCluster.from_url(
            options.client_url,
            max_connections=options.max_connections,
            **common,
        )
    return Redis.from_url(
        options.client_url,
        max_connections=options.max_connections,
        retry_on_timeout=False,
        **common,
    )


class RedisConnection:
    """Owns the client and its pool; stores borrow `client` and never close it."""

    name = "redis"

    def __init__(self, options: RedisOptions) -> None:
        self.options = options
        self.client: Client = build_client(options)
        self.facts: ServerFacts | None = None
        self._closed = False
        # Calls in flight, at most the pool's size: redis-py's pool refuses a call past it
        # at once (MaxConnectionsError), which callers would read as Redis being down, and a
        # burst of requests (their rate-limit checks run before admission) would put every
        # tenant's quotas on per-process limits. Past it a call waits, within its bound.
        self._slots = asyncio.Semaphore(options.max_connections)
        self._prober = ThreadPoolExecutor(max_workers=1, thread_name_prefix="redis-ping")
        # The prober's own clients, one per node; only its one thread touches them.
        self._ping_clients: dict[str, redis.Redis] = {}

    @property
    def cluster(self) -> bool:
        return self.options.cluster

    async def start(self) -> None:
        """Probe the server once at start-up: log its version, mode and vector capability.
        Redis down only logs a warning (the cache fails open and the pool reconnects by
        itself); a URL whose mode contradicts the server raises `RedisModeMismatch`."""
        try:
            facts = await probe_server(self.options)
        except BackendUnavailable as exc:
            log.warning("Redis not reachable at start-up", extra={"error": str(exc)})
            return
        if facts.cluster != self.cluster:
            raise RedisModeMismatch(_mismatch_message(facts.cluster))
        self.facts = facts
        if isinstance(self.client, RedisCluster):
            await self._map_slots(self.client)
        log.info(
            "Redis connected",
            extra={
                "redis_version": facts.version,
                "redis_mode": "cluster" if facts.cluster else "single node",
                "vector_search": facts.vector_search or "none (plain commands only)",
                "vector_fast_path": "not built: the cache store uses plain commands and Lua",
            },
        )

    async def _map_slots(self, client: RedisCluster) -> None:
        """Read the slot map now, not on the first calls: concurrent first calls of a fresh
        cluster client race its lazy mapping (connections closed under them) and a slow
        mapping fails them on the op timeout. Failing here only logs: calls map it later."""
        try:
            await guarded(client.initialize(), 2 * self.options.op_timeout_s)
        except BackendUnavailable as exc:
            log.warning("Redis cluster slots not mapped at start-up", extra={"error": str(exc)})

    async def call(self, pending: Awaitable[T], spend: RequestSpend | None = None) -> T:
        """Await one client call under the whole-call bound, translating every failure;
        `spend`: that of the request it is made for, whose time budget bounds the call too
        (None: work no answer waits for)."""
        if self._closed:
            _close_unawaited(pending)
            raise BackendUnavailable("redis", "the Redis connection is closed")
        timeout_s = self.options.op_timeout_s
        budget_s = self.options.request_budget_s
        if spend is None or budget_s is None:
            return await guarded(self._in_slot(pending), timeout_s)
        left = budget_s - spend.spent_s
        if left <= 0:
            _close_unawaited(pending)
            raise RequestBudgetSpent(budget_s)
        # A call bounded by the request's budget rather than the whole-call bound that runs
        # out of it is this request's outcome, not a verdict on Redis: under a burst on a
        # loaded core (150 requests opening connections at once) calls to a healthy Redis
        # overran a 0.25 s budget and put the quotas in the degraded state for every tenant;
        # a call given 20 us of what earlier calls left did so alone. So is a call whose
        # budget ran out while it waited for one of this process's connections: never sent.
        sent: list[bool] = []
        started = time.monotonic()
        try:
            return await guarded(self._in_slot(pending, sent), min(timeout_s, left))
        except BackendUnavailable as exc:
            if left < timeout_s and isinstance(exc.__cause__, TimeoutError):
                raise RequestBudgetSpent(budget_s, cut=bool(sent)) from exc
            raise
        finally:
            spend.spent_s += time.monotonic() - started

    async def _in_slot(self, pending: Awaitable[T], sent: list[bool] | None = None) -> T:
        """`pending` once one of the `max_connections` slots is free; `sent` gets True then."""
        try:
            await self._slots.acquire()
        except BaseException:  # the call's bound ended the wait: it never runs
            _close_unawaited(pending)
            raise
        if sent is not None:
            sent.append(True)
        try:
            return await pending
        finally:
            self._slots.release()

    def register_script(self, source: str) -> Script:
        """A Lua script run by EVALSHA (loaded again by itself where it is missing)."""
        return Script(self.client, source)

    async def ping(self) -> None:
        """Raises `BackendUnavailable` when a node cannot be reached, or when its round trip is
        longer than a request's Redis budget (`request_budget_s`): a verdict on Redis alone,
        timed on the prober's thread, whatever this process's loop and pool are doing."""
        if self._closed:
            raise BackendUnavailable("redis", "the Redis connection is closed")
        nodes = self._ping_targets()
        took_s = await asyncio.get_running_loop().run_in_executor(
            self._prober, self._round_trip_s, nodes
        )
        budget_s = self.options.request_budget_s
        if took_s == float("inf"):
            raise BackendUnavailable(
                "redis", f"no PING answered within {self.options.socket_timeout_s:g}s"
            )
        if budget_s is not None and took_s > budget_s:
            raise BackendUnavailable(
                "redis",
                f"a PING took {took_s * 1000:.0f} ms, longer than a request's Redis budget "
                f"({budget_s:g}s)",
            )

    def _ping_targets(self) -> list[str]:
        """The URL of each node to ask: a cluster's primaries once the slots are mapped,
        else the node the URL names."""
        url = self.options.client_url
        if isinstance(self.client, RedisCluster):
            primaries = self.client.get_primaries()
            if primaries:
                return [node_url(url, node.host, int(node.port)) for node in primaries]
        return [url]

    def _round_trip_s(self, nodes: list[str]) -> float:
        """On the prober's thread: the slowest node's round trip (`_node_round_trip_s`)."""
        slowest = 0.0
        for url in nodes:
            client = self._ping_clients.get(url)
            if client is None:
                client = self._ping_clients[url] = _ping_client(url, self.options)
            try:
                slowest = max(slowest, _node_round_trip_s(client, self.options.request_budget_s))
            except (RedisError, OSError) as exc:
                raise BackendUnavailable("redis", f"{type(exc).__name__}: {exc}") from exc
        return slowest

    def _close_ping_clients(self) -> None:
        for client in self._ping_clients.values():
            client.close()
        self._ping_clients.clear()

    async def aclose(self) -> None:
        """Idempotent; after it every call raises `BackendUnavailable`."""
        if self._closed:
            return
        self._closed = True
        # Queued behind a ping in flight, on the thread that owns the clients; not waited
        # for (a ping is bounded by its socket timeouts).
        self._prober.submit(self._close_ping_clients)
        self._prober.shutdown(wait=False)
        await self.client.aclose()


async def guarded(pending: Awaitable[T], timeout_s: float) -> T:
    """One map from redis-py's failures to ours, most specific first: a whole-call timeout,
    then anything the client raises (connection, timeout, protocol garbage, a script or
    WRONGTYPE error, a cluster without a node for the slot). AttributeError too: a cluster
    client that lost a node closes its connections while other calls are sending on them, and
    redis-py 7.4's send then finds its stream writer gone (`None.writelines`); that call failed
    as a connection would, and is a 500 if it escapes."""
    try:
        async with asyncio.timeout(timeout_s):
            return await pending
    except TimeoutError as exc:
        raise BackendUnavailable("redis", f"no answer within {timeout_s:.2f}s") from exc
    except (RedisError, RedisClusterException, OSError, AttributeError) as exc:
        raise BackendUnavailable("redis", f"{type(exc).__name__}: {exc}") from exc


def node_url(url: str, host: str, port: int) -> str:
    """`url` pointed at another node: the scheme, credentials and options kept."""
    parts = urlsplit(url)
    credentials, at, _ = parts.netloc.rpartition("@")
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=f"{credentials}{at}{address}"))


def _ping_client(url: str, options: RedisOptions) -> redis.Redis:
    """A blocking single-node client for the prober's thread, under the pool's timeouts."""
    return redis.Redis.from_url(
        url,
        socket_timeout=options.socket_timeout_s,
        socket_connect_timeout=options.connect_timeout_s,
        retry=BlockingRetry(NoBackoff(), 0),
        health_check_interval=0,
    )


def _node_round_trip_s(client: redis.Redis, budget_s: float | None) -> float:
    """The fastest of up to `PING_TRIES` PINGs, stopping at the first within the budget: on a
    warm connection one PING is the whole probe (every replica's probes reach the same Redis);
    a first PING that paid for a TCP connect, a TLS handshake and `CLIENT SETINFO`, or met one
    pause of the server (a fork for a snapshot, say), is not taken for a slow server. A
    connection the server (or a middlebox) closed while idle is opened once more."""
    fastest = float("inf")
    for attempt in range(PING_TRIES):
        try:
            took_s = _timed(client.ping)
        except RedisTimeoutError:
            # No answer within the socket timeout (the budget, as shipped): a slow try, not
            # a verdict; every try slow is (`inf`, over any budget).
            continue
        except RedisConnectionError:
            if attempt > 0:
                raise
            continue
        fastest = min(fastest, took_s)
        if budget_s is None or took_s <= budget_s:
            break
    return fastest


def _timed(ping: Callable[[], object]) -> float:
    started = time.perf_counter()
    ping()
    return time.perf_counter() - started


async def probe_server(options: RedisOptions) -> ServerFacts:
    """Ask the node the URL names (a throwaway single-node connection, so this works
    whatever the mode) for its version, cluster flag and vector commands."""
    plain = Redis.from_url(
        options.client_url,
        socket_timeout=options.socket_timeout_s,
        socket_connect_timeout=options.connect_timeout_s,
        retry=Retry(NoBackoff(), 0),
    )
    timeout_s = options.op_timeout_s
    try:
        server = await guarded(plain.info("server"), timeout_s)
        cluster = await guarded(plain.info("cluster"), timeout_s)
        vector_sets = await _has_command(plain, "VSIM", timeout_s)
        modules = await guarded(cast(Any, plain).execute_command("MODULE", "LIST"), timeout_s)
    finally:
        await plain.aclose()
    return ServerFacts(
        version=str(server.get("valkey_version") or server.get("redis_version", "unknown")),
        cluster=int(cluster.get("cluster_enabled", 0)) == 1,
        vector_search=_vector_search(vector_sets, modules),
    )


async def _has_command(client: Redis, command: str, timeout_s: float) -> bool:
    """Whether the server knows `command`: called with no arguments, a known command is
    refused for its arity, an unknown one as unknown. (COMMAND INFO would say so too, but
    redis-py's parser of its reply fails on the nil it gives for an unknown command.)"""
    try:
        await guarded(cast(Any, client).execute_command(command), timeout_s)
    except BackendUnavailable as exc:
        cause = exc.__cause__
        if isinstance(cause, ResponseError):
            return "unknown command" not in str(cause).lower()
        raise
    return True


def _vector_search(vector_sets: bool, modules: Any) -> str | None:
    if vector_sets:
        return "vector sets (VSIM)"
    for module in modules or []:
        fields = _module_fields(module)
        name = str(fields.get("name", "")).lower()
        version = int(fields.get("ver", 0) or 0)
        if name in ("search", "ft") and version >= _SEARCH_VECTOR_MIN_VERSION:
            return f"query engine (search {version})"
    return None


def _module_fields(module: Any) -> dict[str, Any]:
    """MODULE LIST entries are flat [name, value, ...] lists (RESP2) or dicts (RESP3)."""
    if isinstance(module, dict):
        raw = module
    else:
        items = list(module)
        raw = dict(zip(items[::2], items[1::2], strict=False))
    return {_text(k): _text(v) if isinstance(v, bytes) else v for k, v in raw.items()}


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _mismatch_message(server_is_cluster: bool) -> str:
    if server_is_cluster:
        return (
            "cache.redis_url names a Redis Cluster node with a single-node scheme; "
            "use redis+cluster://host:port (or rediss+cluster://)"
        )
    return "cache.redis_url uses redis+cluster:// but the server is not a cluster node"


def _close_unawaited(pending: Awaitable[Any]) -> None:
    """A coroutine we refuse to await must be closed, or Python warns it was never awaited."""
    close = getattr(pending, "close", None)
    if callable(close):
        close()
