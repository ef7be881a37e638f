"""What one configuration makes of the shared backends: the pipeline, the key index and the
tenants' assertion secrets.

A tenant's assertion secret (`access_control.secret_env`) is read from the environment each
time a configuration is applied (start, reload), like the configuration itself; one that is
not set, or shorter than `MIN_SECRET_BYTES`, refuses the configuration, naming the tenant.

A reload builds a new Runtime and swaps one reference; a request holds on to the Runtime it
started with, so it finishes on the configuration it began under.
"""

from __future__ import annotations

import hmac
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from backends.retrieval.access import NO_GROUPS
from gateway.core.assertion import HEADER, MIN_SECRET_BYTES, Assertion, verify
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
    # Per tenant with access control: its assertion secret (never logged nor shown).
    assertion_secrets: dict[str, bytes] = field(default_factory=dict, repr=False)

    def tenant_for(self, authorization: str | None) -> TenantConfig:
        key = _bearer(authorization)
        tenant = self.tenants_by_key_hash.get(hash_api_key(key))
        if tenant is None:
            raise Unauthorized("unknown API key")
        return tenant

    def user(self, tenant: TenantConfig, assertions: Sequence[str]) -> Assertion:
        """Who the query is for, from its `X-Querygate-User` headers: a verified assertion's
        groups, or no group (documents without an access list only) where the tenant allows
        a query without one. Unauthorized for an assertion that is missing where required,
        sent to a tenant without access control, sent twice, or not valid."""
        config = tenant.access_control
        if config is None:
            if assertions:
                raise Unauthorized(
                    f"{HEADER}: this tenant has no access control configured, so a user "
                    "assertion cannot be verified; leave the header out"
                )
            return Assertion(NO_GROUPS)
        if not assertions:
            if config.required:
                raise Unauthorized(
                    f"missing {HEADER}: this tenant's queries need a signed user assertion"
                )
            return Assertion(NO_GROUPS)
        if len(assertions) > 1:
            raise Unauthorized(f"{HEADER}: send one user assertion, not {len(assertions)}")
        secret = self.assertion_secrets[tenant.id]
        return verify(assertions[0].strip(), secret, time.time(), config.max_ttl_s)

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


def assertion_secrets(settings: Settings) -> dict[str, bytes]:
    """Each access-controlled tenant's secret from its environment variable; ConfigError
    naming the tenant when one is not set or too short."""
    secrets: dict[str, bytes] = {}
    for n, tenant in enumerate(settings.tenants):
        if tenant.access_control is None:
            continue
        name = tenant.access_control.secret_env
        where = f"tenants.{n}.access_control.secret_env ({tenant.id})"
        secret = os.environ.get(name, "").encode()
        if not secret:
            raise ConfigError(f"{where}: environment variable {name} is not set")
        if len(secret) < MIN_SECRET_BYTES:
            raise ConfigError(
                f"{where}: the secret in {name} is shorter than {MIN_SECRET_BYTES} bytes"
            )
        secrets[tenant.id] = secret
    return secrets


def build_runtime(settings: Settings, services: Services) -> Runtime:
    escalation = settings.router.escalation
    if escalation.enabled and escalation.method == "learned":
        try:
            use_model(services.embedder.model_id)
        except SufficiencyModelMismatch as exc:
            raise ConfigError(f"router.escalation.method: {exc}") from exc
    secrets = assertion_secrets(settings)  # before the pipeline: a refusal costs no build
    tenants = effective_tenants(settings)
    index = {digest: t for t in tenants for digest in t.api_key_sha256}
    pipeline = Pipeline(services, settings, build_classifier(settings, services.embedder.model_id))
    return Runtime(
        settings=settings, pipeline=pipeline, tenants_by_key_hash=index, assertion_secrets=secrets
    )
