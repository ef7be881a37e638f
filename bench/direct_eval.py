"""What goes direct: the shipped router on search-box phrasings and on small talk.

    python bench/direct_eval.py                  # the tuning part
    python bench/direct_eval.py --part heldout   # once, at the end
    python bench/direct_eval.py --show 20        # also list misrouted queries (tuning only)

Data: bench/data/direct_routing.jsonl, written by scripts/make_direct_benchmark.py (its
docstring states the rules and the split). Every query goes through the router as the gateway
builds it: the configured classifier (`gateway.core.runtime.build_classifier`, the learned one
by default) on the query's MiniLM embedding, then the tenant's route policy
(`gateway.core.routing.policy_for`) with `model: auto`, for a deployment with a small and a
large model (every route executable; no model is called). Figures: the share of information-
seeking queries routed direct (a lost grounding) and the share of small talk kept direct, each
with its 95% bootstrap interval (`gateway.eval.stats`), and the decision reasons per label.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file, the repo's packages are not on the path
    sys.path.insert(0, str(REPO))

from backends.embeddings.base import Embedder  # noqa: E402
from backends.embeddings.config import build_embedder  # noqa: E402
from gateway.core.routing import configured_routes, policy_for  # noqa: E402
from gateway.core.runtime import build_classifier  # noqa: E402
from gateway.eval.deployment import embed_all  # noqa: E402
from gateway.eval.stats import estimate  # noqa: E402
from gateway.settings import ModelsConfig, Settings  # noqa: E402
from routers.policy import decide  # noqa: E402
from routers.types import Route, RouteDecision  # noqa: E402

DATA = REPO / "bench" / "data" / "direct_routing.jsonl"
TIER = {"model": "openai/not-called"}
MODELS = ModelsConfig.model_validate({"small": TIER, "large": TIER})


async def route_all(queries: list[str], embedder: Embedder) -> list[RouteDecision]:
    """Every query's decision, embedded by `embedder` (the caller's to close)."""
    settings = Settings(models=MODELS)
    classifier = build_classifier(settings, embedder.model_id)
    vectors = await embed_all(embedder, queries)
    policy = policy_for(settings, "bench", configured_routes(settings))
    return [
        decide(classifier.classify(q, v), "auto", q, policy)
        for q, v in zip(queries, vectors, strict=True)
    ]


async def _route_with_the_configured_embedder(queries: list[str]) -> list[RouteDecision]:
    embedder = build_embedder(Settings(models=MODELS).embeddings)
    try:
        return await route_all(queries, embedder)
    finally:
        await embedder.aclose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("tune", "heldout"), default="tune")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--show", type=int, default=0, help="misrouted queries to list")
    args = parser.parse_args(argv)
    if args.show and args.part == "heldout":
        parser.error("--show lists the tuning part only: the held-out part is read once")
    with args.data.open(encoding="utf-8") as f:
        rows = [r for line in f if (r := json.loads(line))["split"] == args.part]
    decisions = asyncio.run(_route_with_the_configured_embedder([r["query"] for r in rows]))
    direct = np.array([d.route is Route.DIRECT for d in decisions], dtype=np.float64)
    info = np.array([r["label"] == "information" for r in rows])
    print(f"part {args.part}: {int(info.sum())} information, {int((~info).sum())} small talk")
    print(f"information routed direct  {estimate(direct[info])}")
    print(f"small talk kept direct     {estimate(direct[~info])}")
    for label, mask in (("information", info), ("small_talk", ~info)):
        chosen = (d for d, m in zip(decisions, mask, strict=True) if m)
        reasons = Counter(f"{d.route.value}/{d.reason}" for d in chosen)
        print(f"  {label}: " + ", ".join(f"{k} {n}" for k, n in reasons.most_common()))
    wrong = [
        (r, d)
        for r, d, m in zip(rows, decisions, info, strict=True)
        if (d.route is Route.DIRECT) == bool(m)
    ]
    for row, decision in wrong[: args.show]:
        print(f"  {row['label']}/{row['kind']} -> {decision.route.value}: {row['query']}")


if __name__ == "__main__":
    main()
