"""Shared pytest setup. Fixtures that start real processes live in tests/fixtures/."""

import os

# litellm must never reach for the network (cost map, tokenizers): set before any import of it.
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytest_plugins: list[str] = [
    "tests.fixtures.opensearch",
    "tests.fixtures.upstream",
    "tests.fixtures.gateway",
    "tests.fixtures.app",  # app_client: the gateway in process
    "tests.fixtures.embeddings",
    "tests.fixtures.redis",  # redis_server, redis_url, redis_cluster, redis_cluster_urls
    "tests.fixtures.jaeger",  # Jaeger's all-in-one: an OTLP receiver and its query API
]
