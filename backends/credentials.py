"""Credentials inside configuration values, in every form the clients here accept them.

redis-py reads a password from a URL's userinfo (`redis://user:pw@host`, `unix://:pw@/sock`)
or from its query (`?password=`, `?username=`, `?ssl_password=`: any keyword of its connection
goes there); opensearch-py and httpx (litellm) read a host's userinfo; an api base may carry a
key in its query (`?api-key=`). A field named like a secret (`*_key`, `*secret`, `*password`,
`*token`) holds one whatever its form, and a `SecretStr` always does.

`mask` gives a model's JSON dump with each of them replaced by REDACTED (what /admin/config
shows), and the values it replaced; `slow_digest` is how the configuration's version sees a
secret change without being a fast oracle for guessing one (the version is in every answer).
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus

from pydantic import BaseModel, SecretStr

REDACTED = "**********"

# A field whose whole value is a secret. `api_key_sha256` (a digest) and `api_key_env` (the
# name of a variable) do not end so: they are how keys are configured, not keys.
_SECRET_FIELD = re.compile(r"(^|_)(key|secret|password|passwd|token|credentials?)$")
# A query parameter naming a credential, in any client's spelling (`password`, `ssl_password`,
# `username`, `api-key`, `access_token`, `auth`, `sig`).
_SECRET_PARAM = re.compile(r"pass|pwd|user|secret|token|key|auth|credential|sig")


def redact_url(url: str) -> str:
    """`url` with its userinfo and every credential of its query replaced by REDACTED; the
    server it names (scheme, host, port, path, other parameters) kept as written. Split by
    hand: `urlunsplit` would drop the empty host of `unix:///path`."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    cut = min((i for i in (rest.find(c) for c in "/?#") if i != -1), default=len(rest))
    netloc, tail = rest[:cut], rest[cut:]
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rpartition('@')[2]}"
    before_fragment, hash_, fragment = tail.partition("#")
    path, mark, query = before_fragment.partition("?")
    query = "&".join(_redact_param(piece) for piece in query.split("&"))
    return f"{scheme}://{netloc}{path}{mark}{query}{hash_}{fragment}"


def _redact_param(piece: str) -> str:
    name, eq, _ = piece.partition("=")
    if eq and _SECRET_PARAM.search(unquote_plus(name).lower()):
        return f"{name}={REDACTED}"
    return piece


def redact_text(field: str, value: str) -> str:
    """A string field's value as it may be shown: REDACTED when the field holds a secret,
    the URL without its credentials when it is one, else as it is."""
    if _SECRET_FIELD.search(field.lower()):
        return REDACTED
    return redact_url(value) if "://" in value else value


@dataclass(frozen=True, slots=True)
class Masked:
    data: dict[str, Any]  # the JSON dump, every credential replaced by REDACTED
    secrets: tuple[str, ...]  # the values replaced, in the order of the fields


def mask(model: BaseModel, exclude: frozenset[str] = frozenset()) -> Masked:
    """`model`'s JSON dump (without the top-level fields in `exclude`), credentials masked."""
    data = model.model_dump(mode="json", exclude=set(exclude))
    secrets: list[str] = []
    _mask_model(model, data, secrets, exclude)
    return Masked(data, tuple(secrets))


def _mask_model(
    model: BaseModel, data: dict[str, Any], secrets: list[str], exclude: frozenset[str]
) -> None:
    for name in type(model).model_fields:
        if name not in exclude:
            data[name] = _mask_value(name, getattr(model, name), data[name], secrets)


def _mask_value(field: str, value: object, dumped: Any, secrets: list[str]) -> Any:
    if isinstance(value, SecretStr):
        secret = value.get_secret_value()
        secrets.append(secret)
        return redact_url(secret) if "://" in secret else REDACTED
    if isinstance(value, BaseModel):
        _mask_model(value, dumped, secrets, frozenset())
        return dumped
    if isinstance(value, str):
        shown = redact_text(field, value)
        if shown != value:
            secrets.append(value)
        return shown
    if isinstance(value, tuple | list):
        return [_mask_value(field, v, d, secrets) for v, d in zip(value, dumped, strict=True)]
    if isinstance(value, dict):
        pairs = zip(value.values(), dumped.values(), strict=True)
        return dict(zip(dumped, [_mask_value(field, v, d, secrets) for v, d in pairs], strict=True))
    return dumped


@functools.lru_cache(maxsize=256)
def slow_digest(secret: str) -> str:
    """A memory-hard digest of `secret` (scrypt, 16 MiB, ~0.1 s; once per value and process,
    on the thread that asks): a version that changes with it, and costs a guesser that much
    per guess."""
    key = hashlib.scrypt(
        secret.encode(), salt=b"querygate config version", n=2**14, r=8, p=1, dklen=16
    )
    return key.hex()
