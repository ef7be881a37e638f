"""Where a tenant's index versions are, and so where a write of its documents goes.

Each version is a physical index `<alias>-v<N>` of the tenant's alias (`layout`); the serving
one carries the alias itself, the building one of a reindex `<alias>-next`, the previous one kept
for a rollback `<alias>-prev` (`versions`). A write resolves them once, to physical names, and
writes the serving version, then each kept one: a switch that lands while the write runs
(moving the aliases in one atomic call) leaves the write whole in both versions, never half in
each.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.retrieval.opensearch.client import translated
from backends.retrieval.opensearch.layout import IndexLayout

BUILDING = "next"
PREVIOUS = "prev"


@dataclass(frozen=True, slots=True)
class Placed:
    """The tenant's physical indices by role; None where there is none."""

    alias: str
    serving: str | None
    building: str | None
    previous: str | None


def role_alias(alias: str, role: str) -> str:
    """The alias a kept version carries: `<tenant alias>-next` or `-prev`."""
    return f"{alias}-{role}"


def version_number(index: str) -> int:
    return int(index.rsplit("-v", 1)[1])


async def placed(layout: IndexLayout, tenant: str) -> Placed:
    """Which physical index carries which of the tenant's aliases, in one request."""
    alias = layout.config.tenant_alias(tenant)
    with translated("versions"):
        response = await layout.client.indices.get_alias(
            index=f"{alias}-v*", request_timeout=layout.config.write_timeout_s
        )
    by_alias = {name: index for index, body in response.items() for name in body["aliases"]}
    return Placed(
        alias,
        by_alias.get(alias),
        by_alias.get(role_alias(alias, BUILDING)),
        by_alias.get(role_alias(alias, PREVIOUS)),
    )


async def write_targets(layout: IndexLayout, tenant: str) -> tuple[str, list[str]]:
    """(the serving index, the kept ones): where a write of the tenant's documents goes. The
    alias itself when no index carries it yet (a write then fails or creates it as before)."""
    found = await placed(layout, tenant)
    kept = [index for index in (found.building, found.previous) if index is not None]
    return found.serving or found.alias, kept
