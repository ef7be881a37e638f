"""Document-level access: what an access list may hold, and who may read a document.

A document may carry an access list, the groups whose members may read it; one without a list
is readable by every user of its tenant. A reader is a set of groups (the end user's, as the
tenant vouched for them in a signed assertion; none for a request without one), and may read a
document without a list, or one whose list shares a group with it. There is no reader that
sees everything: a read that names no groups sees the documents without a list only.

Group names are compared exactly (case and Unicode form as sent). The same rules bound a
document's list and a reader's set, so both backends store and match what both sides send.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

# The most groups one document's list may name, and one reader may be in.
MAX_DOCUMENT_GROUPS = 64
MAX_READER_GROUPS = 256
MAX_GROUP_CHARS = 128
# Control (Cc), format (Cf), surrogate (Cs) and line/paragraph separators: invisible in a
# name, and a name that looks like another must not be another.
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})

Groups = frozenset[str]
NO_GROUPS: Groups = frozenset()


class InvalidGroups(ValueError):
    """An access list or a reader's groups breaking a rule; the message says which, safe to
    show."""


def access_list(value: object, limit: int = MAX_DOCUMENT_GROUPS) -> tuple[str, ...]:
    """`value` as an access list: a list of 1..`limit` valid group names, duplicates dropped,
    sorted (one list, one content hash). Raises InvalidGroups naming the rule broken."""
    if not isinstance(value, list | tuple):
        raise InvalidGroups("must be a list of group names")
    if not value:
        raise InvalidGroups(
            "must name at least one group; leave it out for a document every user may read"
        )
    if len(value) > limit:
        raise InvalidGroups(f"names more than {limit} groups")
    for n, name in enumerate(value):
        _check_name(n, name)
    return tuple(sorted(set(value)))


def reader_groups(value: object) -> Groups:
    """A reader's groups (an assertion's `groups` claim): a list of at most MAX_READER_GROUPS
    valid names, possibly empty (the user is in no group)."""
    if isinstance(value, list | tuple) and not value:
        return NO_GROUPS
    return frozenset(access_list(value, MAX_READER_GROUPS))


def readable(document_groups: Iterable[str] | None, groups: Groups) -> bool:
    """Whether a reader in `groups` may read a document with this access list (None: none)."""
    return document_groups is None or not groups.isdisjoint(document_groups)


def _check_name(n: int, name: object) -> None:
    if not isinstance(name, str):
        raise InvalidGroups(f"item {n}: a group name must be a string")
    if not name.strip():
        raise InvalidGroups(f"item {n}: a group name must not be empty or white space")
    if len(name) > MAX_GROUP_CHARS:
        raise InvalidGroups(f"item {n}: a group name is longer than {MAX_GROUP_CHARS} characters")
    if any(unicodedata.category(ch) in _REFUSED_CATEGORIES for ch in name):
        raise InvalidGroups(f"item {n}: a group name must not hold control or format characters")
