"""What the routers are configured with: the route policy per tenant and the executor
registry's configuration, built from the settings (also for the CLI, without any backend)."""

from __future__ import annotations

from gateway.settings import Settings, TenantConfig
from routers.executors import RegistryConfig, route_tiers
from routers.lookup import LookupParams
from routers.policy import PolicyConfig
from routers.types import Route


def policy_for(
    settings: Settings,
    tenant: str,
    executable: frozenset[Route],
    *,
    allow_force_route: bool = True,
    whole_corpus_allowed: bool = True,
) -> PolicyConfig:
    r = settings.retrieval
    return PolicyConfig(
        tenant=tenant,
        allow_force_route=allow_force_route,
        lexical_weight=r.lexical_weight,
        dense_weight=r.dense_weight,
        identifier_lexical_weight=r.identifier_lexical_weight,
        executable=executable,
        router=settings.router,
        whole_corpus_allowed=whole_corpus_allowed,
    )


def configured_routes(settings: Settings) -> frozenset[Route]:
    """The routes `settings` can execute, without building any backend (for the CLI)."""
    tiers = route_tiers(
        registry_config(settings), lambda tier: getattr(settings.models, tier) is not None
    )
    return frozenset(tiers)


def registry_config(settings: Settings) -> RegistryConfig:
    r, escalation = settings.retrieval, settings.router.escalation
    return RegistryConfig(
        tiers=settings.models.routes,
        lookup=LookupParams(
            k=r.k,
            candidates=r.candidates,
            grading=escalation if escalation.enabled else None,
            fusion=r.fusion,
        ),
        agent=settings.agent,
        full_context=settings.router.full_context.enabled,
    )


class TenantPolicies:
    """One route policy per tenant for a configuration's life (a reload builds new ones), not
    one per request."""

    def __init__(self, settings: Settings, executable: frozenset[Route]) -> None:
        self._settings = settings
        self._executable = executable
        self._policies: dict[tuple[str, bool, bool], PolicyConfig] = {}

    def of(self, tenant: TenantConfig) -> PolicyConfig:
        key = (tenant.id, tenant.allow_force_route, tenant.allow_full_context)
        policy = self._policies.get(key)
        if policy is None:
            policy = self._policies[key] = policy_for(
                self._settings,
                tenant.id,
                self._executable,
                allow_force_route=tenant.allow_force_route,
                whole_corpus_allowed=tenant.allow_full_context,
            )
        return policy
