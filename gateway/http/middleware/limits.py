"""The limits middleware: a deadline from arrival, the body read under its own timeout, then
the tenant's admission to its pool (`gateway.limits.admission`). The tenant's rate limit (and,
for an answering endpoint, its budget: `gateway.limits.quotas`) is taken right after its key is
checked, before the body is read or any other work; the request's `RequestScope` carries the
budget check passed, which stands for its first model call, and the `RequestSpend` its Redis
calls share (`backends.redis_client`), the rate limit's and budget's first among them. An
answering endpoint's user assertion (`X-Querygate-User`) is verified with the key, before the
quotas: a 401 costs none of them, and the scope carries the user's groups.

Every endpoint that does work has a deadline and a body-read timeout; the endpoints in `POOLS`
are admitted to a pool too. `/admin/reload` has both limits but bypasses admission (an operator
must be able to raise the limits of a full process). /healthz, /readyz and /metrics are not
limited at all: they answer at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from backends.redis_client import RequestSpend
from backends.retrieval.access import NO_GROUPS, Groups
from gateway.core.assertion import HEADER
from gateway.core.runtime import Runtime
from gateway.core.scope import RequestScope
from gateway.errors import (
    DEADLINE_RETRY_AFTER_S,
    DeadlineExceeded,
)
from gateway.http.appkeys import RECORD, RUNTIME, SCOPE, SERVICES
from gateway.http.body import read_body
from gateway.limits.admission import Admission
from gateway.obs.accounting import ANSWERING
from gateway.settings import ServerConfig, TenantConfig

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# The class of work of each admitted endpoint.
POOLS = {
    "POST /v1/query": "queries",
    "POST /v1/chat/completions": "queries",
    "POST /v1/completions": "queries",
    "POST /v1/embeddings": "queries",
    "POST /v1/route": "queries",
    "PUT /v1/documents/{doc_id}": "writes",
    "DELETE /v1/documents/{doc_id}": "writes",
}
# Limited but not admitted: the admin key is checked before the body is read.
ADMIN = frozenset({"POST /admin/reload"})


def _timeout_s(server: ServerConfig, kind: str | None) -> float:
    return server.write_timeout_s if kind == "writes" else server.request_timeout_s


def limits_middleware(admission: Admission) -> Middleware:
    """Deadline from arrival, body read under its own timeout, then the tenant's admission.

    The body is read before admission so a slow client holds no slot while it trickles; the
    tenant (or the admin key) is checked before the body so an unknown key costs no read.
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        record = request[RECORD]
        endpoint = record.endpoint
        kind = POOLS.get(endpoint)
        if kind is None and endpoint not in ADMIN:
            return await handler(request)
        runtime = request.app[RUNTIME].current
        server = runtime.settings.server
        timeout_s = _timeout_s(server, kind)
        deadline = asyncio.get_running_loop().time() + timeout_s
        authorization = request.headers.get("Authorization")
        if kind is None:
            runtime.check_admin(authorization)
            await read_body(request, min(server.body_read_timeout_s, timeout_s))
            return await _within(deadline, handler, request)
        tenant = runtime.tenant_for(authorization)
        record.tenant = tenant.id
        answering = endpoint in ANSWERING
        groups = _user_groups(runtime, tenant, request) if answering else NO_GROUPS
        spend = RequestSpend()
        budget = None
        if (quotas := request.app[SERVICES].quotas) is not None:
            budget = await quotas.admit(tenant, answering=answering, spend=spend)
        request[SCOPE] = RequestScope(tenant, deadline, record, spend, budget, groups)
        await read_body(request, min(server.body_read_timeout_s, timeout_s))
        config = server.admission
        limits = config.writes if kind == "writes" else config.queries
        async with admission.pool(kind).admit(tenant.id, deadline, limits, config):
            if kind == "queries":
                # The handlers' own guards end at `deadline` (RequestScope.deadline).
                return await handler(request)
            return await _within(deadline, handler, request)

    return middleware


def _user_groups(runtime: Runtime, tenant: TenantConfig, request: web.Request) -> Groups:
    """The groups of the user the query is for (`Runtime.user`); its subject, if it names one,
    goes on the request's log line."""
    user = runtime.user(tenant, request.headers.getall(HEADER, []))
    if user.subject is not None:
        request[RECORD].fields["user"] = user.subject
    return user.groups


async def _within(deadline: float, handler: Handler, request: web.Request) -> web.StreamResponse:
    """The handler, cut at `deadline` (503). A TimeoutError of the handler's own is not ours
    to rename: it goes on as what it is."""
    timeout = asyncio.timeout_at(deadline)
    try:
        async with timeout:
            return await handler(request)
    except TimeoutError as exc:
        if not timeout.expired():
            raise
        raise DeadlineExceeded(
            "the request deadline passed", retry_after_s=DEADLINE_RETRY_AFTER_S
        ) from exc
