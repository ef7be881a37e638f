"""The Helm chart keeps secrets out of its ConfigMap: a demo key or a URL with credentials
written into the values is refused, naming the Secret-backed value to use instead (rendered by a
real helm, tests/helm_chart.py)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.helm_chart import HelmFailed, render

# Needs a Go tool that scripts/test.sh builds (helm or Jaeger): it runs these once it is built.
pytestmark = pytest.mark.gotools

Doc = dict[str, Any]


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"config": {"querygate": {"demo_api_key": "qg-demo"}}}, "secrets.demoApiKey"),
        (
            {"config": {"querygate": {"cache": {"redis_url": "redis://:hunter2@redis:6379/0"}}}},
            "redis.existingSecret",
        ),
        (
            {"opensearch": {"enabled": True, "hosts": ["https://admin:pw@os.search.svc:9200"]}},
            "opensearch.existingSecret",
        ),
        (
            {
                "config": {
                    "querygate": {
                        "retrieval": {"opensearch": {"hosts": ["http://u:p@os:9200"]}},
                    }
                }
            },
            "opensearch.existingSecret",
        ),
    ],
    ids=["demo-key", "redis-password", "opensearch-values", "opensearch-config"],
)
def test_a_secret_written_into_the_configmap_is_refused(values: Doc, says: str) -> None:
    with pytest.raises(HelmFailed, match=says):
        render(values)


def test_urls_without_credentials_stay_in_the_configuration() -> None:
    values = {
        "config": {"querygate": {"cache": {"redis_url": "redis://redis.cache.svc:6379/0"}}},
        # an @ in the path or query is not a credential
        "opensearch": {"enabled": True, "hosts": ["https://os.search.svc:9200/x@y"]},
    }
    (cm,) = [d for d in render(values) if d["kind"] == "ConfigMap"]
    config = yaml.safe_load(cm["data"]["config.yaml"])
    assert config["cache"]["redis_url"] == "redis://redis.cache.svc:6379/0"
    assert config["retrieval"]["opensearch"]["hosts"] == ["https://os.search.svc:9200/x@y"]
