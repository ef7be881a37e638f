"""`querygate ingest --prune` on both backends (the embedded file, a real OpenSearch node): a
folder ingested, files removed from it, a dry run that lists what it would delete and deletes
nothing, an apply run that deletes exactly that (bumping the generation), while a document PUT
through the API (even one with a folder document's id and content) and a document of another
source survive. The ingests are `commands.ingest`, what the CLI runs (its output and exit codes:
tests/e2e/test_cli.py); the PUTs go through a real app over the same configuration."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import yaml
from aiohttp.test_utils import TestClient, TestServer

from backends.embeddings.config import build_embedder
from gateway.ingest.readers import source_of
from gateway.server import commands
from gateway.server.app import create_app
from gateway.server.services import build_retriever
from gateway.settings import Settings, load_settings
from tests.fixtures.app import auth
from tests.fixtures.gateway import gateway_config
from tests.fixtures.opensearch import CI_TIMEOUTS

pytestmark = pytest.mark.asyncio(loop_scope="session")

TENANT = "acme"
POLICIES = {
    "warranty": "Acme's warranty lasts two years from delivery.",
    "returns": "Returns are accepted within thirty days with a receipt.",
    "shipping": "Orders ship within two working days from the Leeds depot.",
}


@pytest.fixture(params=["embedded", "opensearch"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Settings]:
    retrieval: dict[str, object] | None = None
    if request.param == "opensearch":
        url = request.getfixturevalue("opensearch_url")
        alias = f"qgtest-prune-{uuid.uuid4().hex[:8]}"
        options = {"hosts": [url], "alias": alias, **CI_TIMEOUTS}
        retrieval = {"backend": "opensearch", "opensearch": options}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(gateway_config(tmp_path / "data", 0, None, retrieval)))
    yield load_settings(path)
    if retrieval is not None:
        requests.delete(f"{url}/{alias}*", timeout=60)


def policy_file(name: str) -> str:
    return f"# {name.title()}\n\n{POLICIES[name]}\n"


async def stored(settings: Settings, doc_ids: list[str]) -> tuple[set[str], int]:
    """Which of `doc_ids` the tenant's index holds, and its generation."""
    embedder = build_embedder(settings.embeddings)
    retriever = build_retriever(settings, embedder.dimension)
    try:
        hashes = await retriever.content_hashes(TENANT, doc_ids)
        return set(hashes), await retriever.generation(TENANT)
    finally:
        await retriever.aclose()
        await embedder.aclose()


async def put(settings: Settings, doc_id: str, title: str, text: str) -> str:
    """PUT /v1/documents/<doc_id> on an app serving `settings`; the result it answers."""
    async with TestClient(TestServer(create_app(settings))) as client:
        body = {"title": title, "text": text}
        resp = await client.put(f"/v1/documents/{doc_id}", json=body, headers=auth(TENANT))
        assert resp.status in (200, 201), await resp.text()
        result: str = (await resp.json())["result"]
        return result


async def test_a_prune_deletes_only_what_its_source_no_longer_has(
    settings: Settings, tmp_path: Path
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in POLICIES:
        (docs / f"{name}.md").write_text(policy_file(name))
    faq = tmp_path / "faq.jsonl"  # another source, with an id the folder also once had
    faq.write_text(json.dumps({"id": "faq", "text": "Ask the depot about collections."}) + "\n")
    assert (await commands.ingest(settings, TENANT, [docs], sample=False))["added"] == 3
    assert (await commands.ingest(settings, TENANT, [faq], sample=False))["added"] == 1
    (docs / "faq.md").write_text("# Faq\n\nA page that is dropped again.\n")
    await commands.ingest(settings, TENANT, [docs], sample=False)
    # The API's: a new document, and a folder document PUT again unchanged (now the API's).
    assert await put(settings, "notice.md", "Notice", "The depot closes at noon on Fridays.") == (
        "created"
    )
    shipping = policy_file("shipping")
    assert await put(settings, "shipping.md", "Shipping", shipping) == "unchanged"
    for name in ("returns", "shipping", "faq"):
        (docs / f"{name}.md").unlink()
    every = ["warranty.md", "returns.md", "shipping.md", "faq.md", "faq", "notice.md"]
    _, generation = await stored(settings, every)

    dry = await commands.ingest(settings, TENANT, [docs], sample=False, prune="dry-run")

    # faq.md was the folder's; "faq" (the jsonl's) and the PUT documents are not.
    assert dry["stale_ids"] == {source_of(docs): ["faq.md", "returns.md"]}
    assert (dry["stale"], dry["pruned"], dry["unsourced"]) == (2, 0, 2)
    assert await stored(settings, every) == (set(every), generation)

    applied = await commands.ingest(settings, TENANT, [docs], sample=False, prune="apply")

    assert applied["stale_ids"] == dry["stale_ids"] and applied["pruned"] == 2
    held, after = await stored(settings, every)
    assert held == {"warranty.md", "shipping.md", "faq", "notice.md"}
    assert after > generation  # cached answers that cited the deleted documents retire
    again = await commands.ingest(settings, TENANT, [docs], sample=False, prune="apply")
    assert (again["stale"], again["pruned"]) == (0, 0)


async def test_a_named_source_spans_paths_and_an_emptied_one_is_all_stale(
    settings: Settings, tmp_path: Path
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (first / "warranty.md").write_text(policy_file("warranty"))
    (second / "returns.md").write_text(policy_file("returns"))
    named = {"source": "handbook"}
    await commands.ingest(settings, TENANT, [first, second], sample=False, **named)
    # One name: what either path has is present; ingested from the first alone, the second's
    # documents are stale.
    both = await commands.ingest(settings, TENANT, [first, second], False, prune="dry-run", **named)
    assert both["stale"] == 0
    alone = await commands.ingest(settings, TENANT, [first], False, prune="dry-run", **named)
    assert alone["stale_ids"] == {"handbook": ["returns.md"]}
    (first / "warranty.md").unlink()
    emptied = await commands.ingest(settings, TENANT, [first], False, prune="apply", **named)
    assert emptied["stale_ids"] == {"handbook": ["returns.md", "warranty.md"]}
    assert (await stored(settings, ["warranty.md", "returns.md"]))[0] == set()


async def test_documents_stored_without_a_source_are_claimed_by_the_next_ingest(
    settings: Settings, tmp_path: Path
) -> None:
    """An index written before sources were recorded: its documents read as source "", so a
    prune deletes none of them; an ingest of the folder records its source on those it still
    has (no rewrite), and only those are the folder's from then on."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("warranty", "returns"):
        (docs / f"{name}.md").write_text(policy_file(name))
    await commands.ingest(settings, TENANT, [docs], sample=False, source="")
    (docs / "returns.md").unlink()

    claimed = await commands.ingest(settings, TENANT, [docs], sample=False, prune="apply")

    assert (claimed["unchanged"], claimed["updated"]) == (1, 0)  # recorded, not rewritten
    assert (claimed["stale"], claimed["unsourced"]) == (0, 1)
    assert (await stored(settings, ["warranty.md", "returns.md"]))[0] == {
        "warranty.md",
        "returns.md",
    }
    (docs / "warranty.md").unlink()
    later = await commands.ingest(settings, TENANT, [docs], sample=False, prune="apply")
    assert later["stale_ids"] == {source_of(docs): ["warranty.md"]}
