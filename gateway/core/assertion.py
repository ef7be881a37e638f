"""The signed user assertion: how a tenant vouches for its end user's groups on a query.

The tenant's application sends `X-Querygate-User: <compact JWT>`, HS256 over the tenant's own
secret (`tenants[].access_control.secret_env`), with claims `exp` (required; a NumericDate no
further ahead than `max_ttl_s`), `groups` (required; the user's group names, possibly none)
and `sub` (optional; the user, for the log). Only HS256 is accepted: the header names its
algorithm, and a token saying `none` or any other must not choose how it is checked. The
signature is checked, in constant time, before the payload is read.

Every failure is `Unauthorized` (401) with a message saying what was wrong and nothing of the
secret: an assertion that cannot be verified never means "no filter".
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from backends.retrieval.access import Groups, InvalidGroups, reader_groups
from gateway.errors import Unauthorized

HEADER = "X-Querygate-User"
MIN_SECRET_BYTES = 32  # HS256's own strength: a shorter secret is refused at configuration
MAX_ASSERTION_CHARS = 4096  # within the 8,190 bytes aiohttp takes for one header line
MAX_SUBJECT_CHARS = 256
_SEGMENT = re.compile(r"^[A-Za-z0-9_-]*$")


@dataclass(frozen=True, slots=True)
class Assertion:
    """What a verified assertion says of the user."""

    groups: Groups
    subject: str | None = None


def verify(token: str, secret: bytes, now: float, max_ttl_s: float) -> Assertion:
    """The verified assertion in `token`, or Unauthorized saying why not. `now`: epoch
    seconds."""
    if len(token) > MAX_ASSERTION_CHARS:
        raise _refused(f"longer than {MAX_ASSERTION_CHARS} characters")
    parts = token.split(".")
    if len(parts) != 3 or not all(_SEGMENT.match(p) for p in parts):
        raise _refused("not a compact JWT (three base64url segments)")
    encoded_header, encoded_payload, encoded_signature = parts
    header = _json_segment(encoded_header, "header")
    if header.get("alg") != "HS256":
        raise _refused("the algorithm must be HS256")
    if "crit" in header:
        raise _refused("critical header parameters are not supported")
    expected = hmac.new(
        secret, f"{encoded_header}.{encoded_payload}".encode("ascii"), hashlib.sha256
    ).digest()
    if not hmac.compare_digest(expected, _decode(encoded_signature, "signature")):
        raise _refused("bad signature")
    claims = _json_segment(encoded_payload, "payload")
    _check_expiry(claims, now, max_ttl_s)
    try:
        groups = reader_groups(claims.get("groups"))
    except InvalidGroups as exc:
        raise _refused(f"groups claim {exc}") from exc
    subject = claims.get("sub")
    if subject is not None and (
        not isinstance(subject, str)
        or len(subject) > MAX_SUBJECT_CHARS
        or not subject.isprintable()
    ):
        raise _refused(f"sub must be printable text of at most {MAX_SUBJECT_CHARS} characters")
    return Assertion(groups, subject)


def _check_expiry(claims: dict[str, Any], now: float, max_ttl_s: float) -> None:
    exp = claims.get("exp")
    if isinstance(exp, bool) or not isinstance(exp, int | float) or not math.isfinite(exp):
        raise _refused("exp (a NumericDate) is required")
    if exp <= now:
        raise _refused("expired")
    if exp > now + max_ttl_s:
        raise _refused(f"exp is more than {max_ttl_s:g} s ahead (access_control.max_ttl_s)")
    nbf = claims.get("nbf")
    if nbf is not None and (isinstance(nbf, bool) or not isinstance(nbf, int | float)):
        raise _refused("nbf must be a NumericDate")
    if nbf is not None and nbf > now:
        raise _refused("not valid yet (nbf)")


def _json_segment(segment: str, name: str) -> dict[str, Any]:
    try:
        value = json.loads(_decode(segment, name))
    except (UnicodeDecodeError, ValueError) as exc:
        raise _refused(f"the {name} is not JSON") from exc
    if not isinstance(value, dict):
        raise _refused(f"the {name} is not a JSON object")
    return value


def _decode(segment: str, name: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
    except (binascii.Error, ValueError) as exc:
        raise _refused(f"the {name} is not base64url") from exc


def _refused(why: str) -> Unauthorized:
    return Unauthorized(f"{HEADER}: invalid user assertion: {why}")
