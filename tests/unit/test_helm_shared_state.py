"""What pods share, through the Helm chart: it refuses fleets whose tenants' limits would
silently multiply by the pod count and a Redis asked for in the configuration that no pod could
reach, and never rolls a claim onto a second pod (rendered by a real helm, tests/helm_chart.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.settings import hash_api_key
from tests.helm_chart import HelmFailed, notes, render

# Needs a Go tool that scripts/test.sh builds (helm or Jaeger): it runs these once it is built.
pytestmark = pytest.mark.gotools

Doc = dict[str, Any]

# Several pods on a shared OpenSearch, tenants with limits: what would get N times its quota.
OPENSEARCH: Doc = {"enabled": True, "hosts": ["http://os:9200"]}
TENANTS = [
    {
        "id": "acme",
        "api_key_sha256": [hash_api_key("key-acme")],
        "rate_limit": {"requests_per_s": 5, "burst": 10},
        "daily_budget_usd": 20,
    }
]
REDIS: Doc = {"enabled": True, "existingSecret": "qg-redis"}


def fleet(**values: Any) -> Doc:
    config = {"config": {"querygate": {"tenants": TENANTS, **values.pop("querygate", {})}}}
    return {"opensearch": OPENSEARCH, **config, **values}


def rendered_config(docs: list[Doc]) -> Doc:
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    config: Doc = yaml.safe_load(cm["data"]["config.yaml"])
    return config


@pytest.mark.parametrize(
    "values",
    [
        fleet(replicaCount=2),
        fleet(autoscaling={"enabled": True}),
        # Redis for the cache, but quotas kept per process by choice: as per pod.
        fleet(replicaCount=3, redis=REDIS, querygate={"quotas": {"backend": "memory"}}),
    ],
    ids=["replicas", "autoscaling", "quotas-in-memory"],
)
def test_replicas_without_shared_quotas_are_refused(values: Doc) -> None:
    with pytest.raises(HelmFailed, match="more than one replica without quotas in Redis"):
        render(values)


def test_replicas_with_redis_or_the_per_pod_quotas_accepted_render() -> None:
    docs = render(fleet(replicaCount=2, redis=REDIS))
    assert rendered_config(docs)["cache"]["backend"] == "redis"
    accepted = fleet(replicaCount=2, redis={"acceptPerPodQuotas": True})
    assert [d["spec"]["replicas"] for d in render(accepted) if d["kind"] == "Deployment"] == [2]
    # One pod keeps each tenant's limits whole: nothing to refuse.
    render(fleet())


@pytest.mark.parametrize("section", ["cache", "quotas"])
def test_redis_in_the_configuration_without_a_url_is_refused(section: str) -> None:
    with pytest.raises(HelmFailed, match=rf"{section}\.backend: redis needs redis\.enabled"):
        render({"config": {"querygate": {section: {"backend": "redis"}}}})
    # A URL from the pod's environment (a Secret of the operator's own) is one the pods reach.
    url_env = {
        "name": "QUERYGATE_CACHE__REDIS_URL",
        "valueFrom": {"secretKeyRef": {"name": "mine", "key": "url"}},
    }
    render({"config": {"querygate": {section: {"backend": "redis"}}}, "env": [url_env]})


def _strategy(values: Doc) -> Doc:
    (deployment,) = [d for d in render(values) if d["kind"] == "Deployment"]
    strategy: Doc = deployment["spec"]["strategy"]
    return strategy


def test_a_claim_of_the_old_pod_is_released_before_the_new_pod_needs_it() -> None:
    # A ReadWriteOnce claim: a surge pod on another node would wait on it for ever.
    assert _strategy({"persistence": {"existingClaim": "qg-data"}}) == {"type": "Recreate"}
    # Without a claim nothing is shared: a new pod is ready before an old one goes.
    assert _strategy({}) == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    # A ReadWriteMany claim: the operator says so.
    rwx = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert _strategy({"persistence": {"existingClaim": "qg-data"}, "updateStrategy": rwx}) == rwx


def test_a_network_policy_that_keeps_prometheus_out_is_warned_of(tmp_path: Path) -> None:
    watched = {"enabled": True, "labels": {"release": "prometheus"}}
    values: Doc = {"networkPolicy": {"enabled": True}, "metrics": {"serviceMonitor": watched}}
    assert "networkPolicy.ingress.metricsFrom is empty" in notes(values, tmp_path / "a")
    values["networkPolicy"]["ingress"] = {
        "metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]
    }
    assert "WARNING" not in notes(values, tmp_path / "b")
