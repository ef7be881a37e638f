"""What one configuration makes of the shared backends: the pipeline and the key index.

A reload builds a new Runtime and swaps one reference; a request holds on to the Runtime it
started with, so it finishes on the configuration it began under.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from gateway.core.pipeline import Pipeline
from gateway.core.services import Services
from gateway.errors import Forbidden, Unauthorized
from gateway.settings import ConfigError, Settings, TenantConfig, hash_api_key
from routers.classifier import Classifier, HeuristicClassifier
from routers.learned import LearnedClassifier, RouterModelMismatch
from routers.sufficiency import SufficiencyModelMismatch, use_model

DEMO_TENANT = "demo"


@dataclass(frozen=True, slots=True)
class Runtime:
    settings: Settings
    pipeline: Pipeline
    tenants_by_key_hash: dict[str, TenantConfig]

    def tenant_for(self, authorization: str | None) -> TenantConfig:
        key = _bearer(authorization)
        tenant = self.tenants_by_key_hash.get(hash_api_key(key))
        if tenant is None:
            raise Unauthorized("unknown API key")
        return tenant

    def check_admin(self, authorization: str | None) -> None:
        expected = self.settings.admin_api_key_sha256
        if expected is None:
            raise Forbidden("no admin key is configured")
        if not hmac.compare_digest(hash_api_key(_bearer(authorization)), expected):
            raise Unauthorized("unknown admin key")


def _bearer(authorization: str | None) -> str:
    if not authorization:
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
    scheme, _, key = authorization.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized("malformed Authorization header: expected 'Bearer <key>'")
    key = key.strip()
    # aiohttp keeps bytes that are not UTF-8 as lone surrogates (not printable), which no key
    # can hash to a configured digest.
    if not key.isprintable():
        raise Unauthorized("malformed Authorization header: the key is not printable UTF-8")
    return key


def effective_tenants(settings: Settings) -> tuple[TenantConfig, ...]:
    """The configured tenants or, with none configured, the single demo tenant."""
    if settings.tenants:
        return settings.tenants
    if settings.demo_api_key is None:
        return ()
    digest = hash_api_key(settings.demo_api_key.get_secret_value())
    return (TenantConfig(id=DEMO_TENANT, api_key_sha256=(digest,)),)


def build_classifier(settings: Settings, embedding_model_id: str) -> Classifier:
    if settings.router.classifier == "heuristic":
        return HeuristicClassifier()
    try:
        return LearnedClassifier.load(embedding_model_id=embedding_model_id)
    except RouterModelMismatch as exc:
        raise ConfigError(f"router.classifier: {exc}") from exc


def build_runtime(settings: Settings, services: Services) -> Runtime:
    escalation = settings.router.escalation
    if escalation.enabled and escalation.method == "learned":
        try:
            use_model(services.embedder.model_id)
        except SufficiencyModelMismatch as exc:
            raise ConfigError(f"router.escalation.method: {exc}") from exc
    tenants = effective_tenants(settings)
    index = {digest: t for t in tenants for digest in t.api_key_sha256}
    pipeline = Pipeline(services, settings, build_classifier(settings, services.embedder.model_id))
    return Runtime(settings=settings, pipeline=pipeline, tenants_by_key_hash=index)
