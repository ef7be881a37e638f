"""What a cached answer is filed under: its tenant, a scope and the normalised question.

The scope is a digest of everything besides the question that could change an answer: the
requested route, the tenant's index generation (a document change retires the answers computed
before it), the configuration an answer depends on (`answer_config_version`: models,
embeddings, retrieval, routing, the agent's caps and the tenant's own routing flags; not the
port, data directory, timeouts, admission limits, quotas or cache settings, so replicas that
differ only in those share answers and changing those retires none), the prompts' text, the
embedding model (the semantic tier compares its vectors), the client's generation parameters
and the cached form's own version.
The end user's groups are in the scope too (`access_digest`): users whose groups differ may
see different documents, so they never share an answer, in either tier or a single flight.
When any of them changes, new requests look under a new scope and the old entries are never
read again; their TTL ends them, with no scan.

The conversation the model reads is in the scope too (`history_digest`): every message the
executors put before the question (a system message such as "Answer only in French", earlier
turns). A follow-up the rewrite stage made self-contained reaches the executors without the
turns the rewrite consumed (only the client's system messages stay), so it is cached under its
self-contained form and the system messages; one that was not rewritten (no model, rewriting
off or failed) is not cached at all.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from backends.llm.base import GenerationOptions, Message
from backends.retrieval.access import Groups
from gateway.settings import Settings, TenantConfig
from routers import prompts

# Bump when the cached payload's shape changes (gateway.cache.entry.answer_to_cache).
PAYLOAD_VERSION = 2


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _prompts_version() -> str:
    texts = {
        name: value
        for name, value in sorted(vars(prompts).items())
        if name.isupper() and isinstance(value, str)
    }
    return _digest(json.dumps(texts, ensure_ascii=False))[:12]


PROMPTS_VERSION = _prompts_version()


def answer_config_version(settings: Settings, tenant: TenantConfig) -> str:
    """A digest of the configuration sections an answer depends on, for this tenant."""
    material = {
        "models": settings.models.model_dump(mode="json"),
        "embeddings": settings.embeddings.model_dump(mode="json"),
        "retrieval": settings.retrieval.model_dump(mode="json"),
        "router": settings.router.model_dump(mode="json"),
        "agent": settings.agent.model_dump(mode="json"),
        "tenant": tenant.model_dump(
            mode="json", include={"allow_force_route", "allow_full_context"}
        ),
    }
    return _digest(json.dumps(material, sort_keys=True, default=str))[:12]


@dataclass(frozen=True, slots=True)
class CacheScope:
    requested_route: str
    generation: int
    config_version: str
    embedding_model: str
    # The client's generation parameters (temperature, max_tokens …), as `options_digest`.
    options: str = ""
    # The messages the executors send before the question, as `history_digest`.
    history: str = ""
    # The end user's groups, as `access_digest`.
    access: str = ""
    prompts_version: str = PROMPTS_VERSION
    payload_version: int = PAYLOAD_VERSION

    @property
    def digest(self) -> str:
        material = json.dumps(
            [
                self.requested_route,
                self.generation,
                self.config_version,
                self.embedding_model,
                self.options,
                self.history,
                self.access,
                self.prompts_version,
                self.payload_version,
            ],
            ensure_ascii=False,
        )
        return _digest(material)[:24]


def options_digest(options: GenerationOptions) -> str:
    """The client's generation parameters as part of a scope: answers written with other
    parameters (a temperature, a token cap, stop sequences) are never shared. Empty for none."""
    params = {**options.wire(), "max_tokens": options.max_tokens}
    params = {k: v for k, v in params.items() if v is not None}
    return _digest(json.dumps(params, sort_keys=True, default=str))[:16] if params else ""


def access_digest(groups: Groups) -> str:
    """The end user's groups as part of a scope; empty for none (every user without a group
    of a tenant shares one scope, as every user of a tenant without access control does)."""
    if not groups:
        return ""
    return _digest(json.dumps(sorted(groups), ensure_ascii=False))[:24]


def history_digest(history: Sequence[Message]) -> str:
    """Every message the model reads before the question, role and text, as part of a scope.
    Empty for none."""
    if not history:
        return ""
    material = [[m.role, m.content] for m in history]
    return _digest(json.dumps(material, ensure_ascii=False))[:16]


# Full-width ASCII (U+FF01..FF5E) read as ASCII: the only compatibility forms folded. NFKC
# would also fold superscripts ("2³" → "23"), ligatures and more, which change a question.
_WIDTH = {c: c - 0xFEE0 for c in range(0xFF01, 0xFF5F)}


def normalise_query(text: str) -> str:
    """Only what cannot change a question: canonical Unicode composition (NFC), full-width
    ASCII, letter case (`lower`, not `casefold`: "Maße" is not "Masse"), runs of white space
    and a closing "?" or "." ("What is 10!" is not "What is 10?"). Other punctuation can
    change one ("C" vs "C++")."""
    composed = unicodedata.normalize("NFC", text).translate(_WIDTH)
    return " ".join(composed.lower().split()).rstrip("?.。 ")


def display_question(text: str) -> str:
    """The question as the guards read it: white space collapsed, case kept (capitals mark
    names)."""
    return " ".join(text.split())


def exact_key(scope: CacheScope, question: str) -> str:
    """The exact tier's key within a tenant: the scope, then the normalised question."""
    # Client text is clean by now (gateway/text.py); a rewrite from the model may not be, so a
    # lone surrogate is hashed as it is rather than failing the request.
    return f"{scope.digest}:{_digest(normalise_query(question))[:32]}"
