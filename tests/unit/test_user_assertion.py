"""The signed user assertion (gateway/core/assertion.py) and access lists
(backends/retrieval/access.py): every way an assertion can be wrong is a 401, never a query
with no filter; every bad access list is refused naming the rule."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

import pytest

from backends.retrieval.access import (
    MAX_DOCUMENT_GROUPS,
    MAX_GROUP_CHARS,
    MAX_READER_GROUPS,
    InvalidGroups,
    access_list,
    readable,
    reader_groups,
)
from gateway.core.assertion import MAX_ASSERTION_CHARS, verify
from gateway.errors import Unauthorized
from tests.fixtures.access import SECRET, b64url, mint

NOW = 1_800_000_000.0
TTL = 3600.0


def _verify(token: str) -> frozenset[str]:
    return verify(token, SECRET.encode(), NOW, TTL).groups


def _claims(**extra: Any) -> dict[str, Any]:
    return {"groups": ["finance"], "exp": NOW + 60, **extra}


def test_a_valid_assertion_gives_its_groups_and_subject() -> None:
    token = mint(_claims(sub="ann", groups=["finance", "hr", "finance"]))
    verified = verify(token, SECRET.encode(), NOW, TTL)
    assert verified.groups == {"finance", "hr"}
    assert verified.subject == "ann"


def test_a_user_in_no_group_is_valid() -> None:
    assert _verify(mint(_claims(groups=[]))) == frozenset()


def _tampered_payload() -> str:
    head, _, signature = mint(_claims()).split(".")
    forged = b64url(json.dumps(_claims(groups=["board"])).encode())
    return f"{head}.{forged}.{signature}"


def _alg_none() -> str:
    head = b64url(json.dumps({"alg": "none"}).encode())
    body = b64url(json.dumps(_claims()).encode())
    return f"{head}.{body}."


REFUSED: dict[str, tuple[str, str]] = {
    "unsigned (alg none)": (_alg_none(), "algorithm must be HS256"),
    "other algorithm": (mint(_claims(), header={"alg": "HS512"}), "algorithm must be HS256"),
    "RS256 header": (mint(_claims(), header={"alg": "RS256"}), "algorithm must be HS256"),
    "no alg": (mint(_claims(), header={"typ": "JWT"}), "algorithm must be HS256"),
    "crit": (mint(_claims(), header={"alg": "HS256", "crit": ["x"]}), "critical"),
    "other secret": (mint(_claims(), secret="another-secret-of-the-same-length!!"), "signature"),
    "tampered payload": (_tampered_payload(), "bad signature"),
    "signature cut": (mint(_claims())[:-4], "bad signature"),
    "empty signature": (mint(_claims()).rsplit(".", 1)[0] + ".", "bad signature"),
    "expired": (mint(_claims(exp=NOW - 1)), "expired"),
    "expires now": (mint(_claims(exp=NOW)), "expired"),
    "too far ahead": (mint(_claims(exp=NOW + TTL + 1)), "ahead"),
    "no exp": (mint({"groups": ["finance"]}), "exp"),
    "exp as text": (mint(_claims(exp=str(NOW + 60))), "exp"),
    "exp as bool": (mint(_claims(exp=True)), "exp"),
    "not yet valid": (mint(_claims(nbf=NOW + 30)), "nbf"),
    "no groups": (mint({"exp": NOW + 60}), "groups claim must be a list"),
    "groups a string": (mint(_claims(groups="finance")), "groups claim must be a list"),
    "group not text": (mint(_claims(groups=[7])), "must be a string"),
    "group blank": (mint(_claims(groups=[" "])), "empty"),
    "group control": (mint(_claims(groups=["fin\u0000ance"])), "control"),
    "too many groups": (
        mint(_claims(groups=[f"g{i}" for i in range(MAX_READER_GROUPS + 1)])),
        "more than",
    ),
    "sub not text": (mint(_claims(sub=5)), "sub"),
    "two segments": (".".join(mint(_claims()).split(".")[:2]), "compact JWT"),
    "four segments": (mint(_claims()) + ".x", "compact JWT"),
    "not base64url": (mint(_claims()).replace(".", ".+", 1), "compact JWT"),
    "padded": (mint(_claims()) + "=", "compact JWT"),
    "payload not JSON": ("eyJhbGciOiJIUzI1NiJ9.bm90IGpzb24." + "x", "signature"),
    "too long": ("a" * (MAX_ASSERTION_CHARS + 1), "longer than"),
    "empty": ("", "compact JWT"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_every_bad_assertion_is_refused(case: str) -> None:
    token, why = REFUSED[case]
    with pytest.raises(Unauthorized) as refused:
        _verify(token)
    assert why in str(refused.value)
    assert refused.value.status == 401
    assert SECRET not in str(refused.value)


def test_a_signed_payload_that_is_not_json_is_refused_as_such() -> None:
    """Signed right, but not an object: refused after the signature, naming the payload."""
    head = b64url(json.dumps({"alg": "HS256"}).encode())
    for body in (b64url(b"not json"), b64url(b"[1, 2]")):
        signed = f"{head}.{body}".encode()
        sig = b64url(hmac.new(SECRET.encode(), signed, hashlib.sha256).digest())
        with pytest.raises(Unauthorized, match="payload is not"):
            _verify(f"{head}.{body}.{sig}")


def test_a_header_that_is_not_an_object_is_refused() -> None:
    head = base64.urlsafe_b64encode(b'"HS256"').rstrip(b"=").decode()
    with pytest.raises(Unauthorized, match="header is not a JSON object"):
        _verify(f"{head}.e30.")


def test_access_lists_are_deduplicated_and_sorted() -> None:
    assert access_list(["hr", "finance", "hr"]) == ("finance", "hr")


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("finance", "must be a list"),
        ({"a": 1}, "must be a list"),
        ([], "at least one group"),
        ([f"g{i}" for i in range(MAX_DOCUMENT_GROUPS + 1)], "more than"),
        ([""], "empty"),
        (["\t "], "empty"),
        (["x" * (MAX_GROUP_CHARS + 1)], "longer than"),
        (["a\u0007b"], "control"),
        (["a\u200bb"], "control or format"),
        (["ok", None], "item 1"),
        (["\ud800"], "control"),
    ],
)
def test_bad_access_lists_are_refused_naming_the_rule(value: object, why: str) -> None:
    with pytest.raises(InvalidGroups, match=why):
        access_list(value)


def test_a_reader_may_read_a_public_document_or_one_sharing_a_group() -> None:
    assert readable(None, frozenset())
    assert readable(("a", "b"), frozenset({"b"}))
    assert not readable(("a",), frozenset({"b"}))
    assert not readable(("a",), frozenset())
    assert reader_groups([]) == frozenset()
