"""One request's scope: who asks (the tenant, and the end user's groups its assertion
vouched for), by when it must be answered, its accounting record, the budget check it passed
on arrival and the Redis time its calls share.

The limits middleware builds it at the edge, once the tenant's key is checked; the handlers
pass it to the guards and the pipeline, and what needs the deadline or the Redis time below
the core gets it as a plain argument. What bounds or records a request is read from
signatures, not from context variables (those are for log records only, `gateway.obs.logs`).
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.redis_client import RequestSpend
from backends.retrieval.access import NO_GROUPS, Groups
from gateway.limits.quotas import BudgetCheck
from gateway.obs.accounting import RequestRecord
from gateway.settings import TenantConfig


@dataclass(frozen=True, slots=True)
class RequestScope:
    tenant: TenantConfig
    # The loop time by which the request must be answered, from its arrival: the time spent
    # reading its body and waiting for admission counts against it.
    deadline: float
    # The request's one counter increment and log line (mutable: what runs for it adds).
    record: RequestRecord
    # The time the request's Redis calls share (`backends.redis_client`), its rate limit's
    # and budget's first among them: every cache and quota lookup made for it passes this.
    spend: RequestSpend
    # The budget check passed on arrival (None: no budget applies): it stands for the
    # request's first model call (`gateway.limits.budget`).
    budget: BudgetCheck | None = None
    # The end user's groups (`gateway.core.assertion`): every read the request makes sees
    # only the documents they may read, and its cached answers are filed under them.
    groups: Groups = NO_GROUPS
