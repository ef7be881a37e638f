"""`querygate eval routes|retrieval`: the real CLI on labelled files whose answers are known.

The route tests use the heuristic classifier (hand-set rules, never retrained), so every
prediction below is known before the run; the index is the suite's two tenants' documents.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.gateway import ingest_corpora, run_cli

# (question, label, what the heuristic classifier + policy routes it to)
ROUTE_LINES = (
    ("hello", "direct", "direct"),
    ("How do I fix ERR-4471?", "lookup", "lookup"),
    ("How long is the warranty on an Acme router?", "lookup", "lookup"),
    (
        "Compare the warranty of the router that reports ERR-4471 with the one that reports "
        "ERR-5120, and which ships faster?",
        "multihop",
        "multihop",
    ),
    # Labelled multihop, classified lookup; nothing in acme's documents covers it, so the
    # lookup's evidence grade escalates it.
    ("What is the capital of Mongolia?", "multihop", "lookup"),
    # A greeting labelled lookup: the most confident misroute (p 0.90 against 0.87).
    ("thanks!", "lookup", "direct"),
)


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A configuration whose acme and globex tenants have the suite's documents ingested."""
    root = tmp_path_factory.mktemp("eval")
    upstream = "http://127.0.0.1:9/v1"  # never called: nothing is answered
    tier = {"api_base": upstream, "retries": 0}
    config = {
        "data_dir": str(root / "data"),
        "tenants": [
            {"id": "acme", "api_key_sha256": ["0" * 64]},
            {"id": "globex", "api_key_sha256": ["1" * 64]},
            {"id": "empty", "api_key_sha256": ["2" * 64]},
        ],
        # A large model makes multihop executable, so an escalation ends there.
        "models": {
            "small": {"model": "openai/fake-small", **tier},
            "large": {"model": "openai/fake-large", **tier},
        },
        "router": {
            "classifier": "heuristic",
            "escalation": {"enabled": True, "method": "signals"},
        },
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    ingest_corpora(path)
    return path


def _jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _report(config: Path, *args: str) -> dict[str, Any]:
    done = run_cli(config, "eval", *args, "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    return report


@pytest.fixture
def routes_file(tmp_path: Path) -> Path:
    lines = [{"question": q, "route": label} for q, label, _ in ROUTE_LINES]
    return _jsonl(tmp_path / "routes.jsonl", lines)


def test_eval_routes_reports_the_known_figures(config: Path, routes_file: Path) -> None:
    report = _report(config, "routes", str(routes_file), "--tenant", "acme")
    assert report["n"] == 6
    assert report["classifier"] == "heuristic"
    assert report["accuracy"]["value"] == pytest.approx(4 / 6, abs=1e-4)
    low, high = report["accuracy"]["ci95"]
    assert 0 <= low < 4 / 6 < high <= 1
    assert report["multihop_recall"] == {
        "value": 0.5,
        "ci95": report["multihop_recall"]["ci95"],
        "n": 2,
    }
    assert report["single_hop_flagged_multihop"]["value"] == 0.0
    assert report["single_hop_flagged_multihop"]["n"] == 3
    assert report["confusion"] == {
        "routes": ["direct", "lookup", "multihop"],
        # rows labelled, columns predicted
        "rows": [[1, 0, 0], [1, 2, 0], [0, 1, 1]],
    }
    assert report["per_route"]["lookup"] == {
        "precision": pytest.approx(2 / 3, abs=1e-4),
        "recall": pytest.approx(2 / 3, abs=1e-4),
        "support": 3,
        "predicted": 3,
    }
    # Highest confidence first: the greeting (0.90), then the lookup (0.87).
    worst = [(r["line"], r["expected"], r["predicted"]) for r in report["worst_misroutes"]]
    assert worst == [(6, "lookup", "direct"), (5, "multihop", "lookup")]
    assert report["escalated"] is None


def test_eval_routes_with_escalation_counts_escalated_lookups_as_multihop(
    config: Path, routes_file: Path
) -> None:
    report = _report(config, "routes", str(routes_file), "--tenant", "acme", "--with-escalation")
    assert report["escalated"] == 1
    assert report["accuracy"]["value"] == pytest.approx(5 / 6, abs=1e-4)
    assert report["multihop_recall"]["value"] == 1.0
    assert report["single_hop_flagged_multihop"]["value"] == 0.0  # the real lookups held
    assert [r["line"] for r in report["worst_misroutes"]] == [6]


def test_eval_routes_readable_table(config: Path, routes_file: Path) -> None:
    done = run_cli(config, "eval", "routes", str(routes_file), "--tenant", "acme")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "accuracy                      0.667 [" in done.stdout
    assert "line 6: labelled lookup, routed direct" in done.stdout


def test_eval_retrieval_reports_recall_mrr_per_arm_and_misses(config: Path, tmp_path: Path) -> None:
    labels = _jsonl(
        tmp_path / "retrieval.jsonl",
        [
            {"question": "How do I fix ERR-4471?", "relevant": ["errors.md"]},
            {"question": "What does the Acme warranty exclude?", "relevant": ["warranty.txt"]},
            # globex's document: acme's search can never return it.
            {"question": "What is the Hammerfall launch code?", "relevant": ["globex-launch"]},
        ],
    )
    report = _report(config, "retrieval", str(labels), "--tenant", "acme", "--k", "1")
    assert report["backend"] == "embedded"
    assert report["k"] == 1
    assert set(report["arms"]) == {"bm25", "dense", "hybrid"}
    for arm in report["arms"].values():
        assert arm["recall_at_k"]["value"] == pytest.approx(2 / 3, abs=1e-4)
        assert arm["mrr_at_10"]["value"] == pytest.approx(2 / 3, abs=1e-4)
    assert report["hybrid_minus_arm_recall_at_k"]["dense"]["value"] == 0.0
    assert report["relevant_not_in_index"] == ["globex-launch"]
    assert report["missed"] == 1
    assert report["misses"][0]["line"] == 3
    assert report["misses"][0]["missing"] == ["globex-launch"]

    done = run_cli(config, "eval", "retrieval", str(labels), "--tenant", "acme", "--k", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "hybrid          0.667 [" in done.stdout
    assert "relevant ids are not in the tenant's index: globex-launch" in done.stdout


def test_eval_retrieval_reports_with_and_without_the_reranker(
    config: Path, tmp_path: Path, fake_upstream: str
) -> None:
    """The fake upstream's reranker scores by word overlap; on these questions it keeps the
    right document first where fusion had it, so the rows with reranking score as fusion."""
    settings = yaml.safe_load(config.read_text())
    remote = {"model": "cohere/fake-rerank", "api_base": f"{fake_upstream}/rerank"}
    remote["cost_per_search_unit_usd"] = 0.001
    settings["retrieval"] = {"rerank": {"reranker": "remote", "remote": remote}}
    reranked = tmp_path / "reranked.yaml"
    reranked.write_text(yaml.safe_dump(settings))
    labels = _jsonl(
        tmp_path / "retrieval.jsonl",
        [
            {"question": "How do I fix ERR-4471?", "relevant": ["errors.md"]},
            {"question": "What does the Acme warranty exclude?", "relevant": ["warranty.txt"]},
            {"question": "What is the Hammerfall launch code?", "relevant": ["globex-launch"]},
        ],
    )
    report = _report(reranked, "retrieval", str(labels), "--tenant", "acme", "--k", "1")
    assert set(report["arms"]) == {"bm25", "dense", "hybrid"}
    rerank = report["rerank"]
    assert (rerank["reranker"], rerank["model"]) == ("remote", "cohere/fake-rerank")
    assert set(rerank["arms"]) == {"hybrid+rerank", "hybrid+policy"}
    for row in rerank["arms"].values():
        assert row["recall_at_k"]["value"] == pytest.approx(2 / 3, abs=1e-4)
    assert rerank["minus_hybrid"]["hybrid+rerank"]["recall_at_k"]["value"] == 0.0
    assert sum(rerank["policy_decisions"].values()) == 3
    assert rerank["cost_usd"] == pytest.approx(0.003)  # every question reranked once

    done = run_cli(reranked, "eval", "retrieval", str(labels), "--tenant", "acme", "--k", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "with the remote reranker cohere/fake-rerank:" in done.stdout
    assert "hybrid+rerank - hybrid: recall" in done.stdout

    # The default configuration reranks locally; with the reranker off there are no rerank rows.
    default = _report(config, "retrieval", str(labels), "--tenant", "acme", "--k", "1")
    assert default["rerank"]["reranker"] == "local"
    settings["retrieval"] = {"rerank": {"reranker": "off"}}
    off = tmp_path / "off.yaml"
    off.write_text(yaml.safe_dump(settings))
    plain = _report(off, "retrieval", str(labels), "--tenant", "acme", "--k", "1")
    assert "rerank" not in plain


def test_eval_retrieval_stops_when_the_reranker_fails(config: Path, tmp_path: Path) -> None:
    settings = yaml.safe_load(config.read_text())
    remote = {"model": "cohere/fake-rerank", "api_base": "http://127.0.0.1:9/v1/rerank"}
    settings["retrieval"] = {"rerank": {"reranker": "remote", "remote": {**remote, "retries": 0}}}
    down = tmp_path / "down.yaml"
    down.write_text(yaml.safe_dump(settings))
    labels = _jsonl(
        tmp_path / "retrieval.jsonl",
        [{"question": "How do I fix ERR-4471?", "relevant": ["errors.md"]}],
    )
    done = run_cli(down, "eval", "retrieval", str(labels), "--tenant", "acme")
    assert done.returncode == 1
    assert "cannot evaluate: rerank unavailable: line 1:" in done.stderr


@pytest.mark.parametrize(
    ("command", "line", "expected"),
    [
        ("routes", '{"question": "hi", "rout": "direct"}', ":2: unknown field 'rout'"),
        ("routes", '{"question": "hi", "route": "agent"}', ":2: route must be one of"),
        ("routes", '{"question": "  ", "route": "direct"}', ":2: question is blank"),
        ("routes", "not json", ":2: not JSON"),
        ("retrieval", '{"question": "hi", "relevant": []}', ":2: relevant must be a non-empty"),
        ("retrieval", '{"question": "hi", "relevant": [" x"]}', ":2: relevant[0]: doc_id"),
    ],
)
def test_a_bad_line_exits_2_naming_line_and_field(
    config: Path, tmp_path: Path, command: str, line: str, expected: str
) -> None:
    good = {"question": "hello", "route": "direct", "relevant": ["errors.md"]}
    del good["relevant" if command == "routes" else "route"]
    path = tmp_path / "labels.jsonl"
    path.write_text(json.dumps(good) + "\n" + line + "\n")
    done = run_cli(config, "eval", command, str(path), "--tenant", "acme")
    assert done.returncode == 2
    assert f"{path}{expected}" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_a_tenant_without_documents_or_unknown_exits_2(config: Path, tmp_path: Path) -> None:
    labels = _jsonl(tmp_path / "r.jsonl", [{"question": "hi", "relevant": ["errors.md"]}])
    empty = run_cli(config, "eval", "retrieval", str(labels), "--tenant", "empty")
    assert empty.returncode == 2
    assert "tenant empty has no documents" in empty.stderr
    unknown = run_cli(config, "eval", "retrieval", str(labels), "--tenant", "nobody")
    assert unknown.returncode == 2
    assert "--tenant nobody: not a configured tenant" in unknown.stderr
