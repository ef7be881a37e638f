"""`allow_full_context`, and the deprecated `per_user_access` it replaces."""

import logging

import pytest
from pydantic import ValidationError

from gateway.settings import TenantConfig

DIGEST = "0" * 64


def tenant(**fields: object) -> TenantConfig:
    return TenantConfig.model_validate({"id": "acme", "api_key_sha256": DIGEST, **fields})


def test_whole_corpus_answers_are_allowed_by_default() -> None:
    assert tenant().allow_full_context


def test_allow_full_context_false_turns_them_off() -> None:
    assert not tenant(allow_full_context=False).allow_full_context


@pytest.mark.parametrize("old", [True, False])
def test_the_old_name_still_loads_inverted_with_a_warning(
    old: bool, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="gateway.settings"):
        config = tenant(per_user_access=old)
    assert config.allow_full_context is (not old)
    assert "per_user_access is deprecated" in caplog.text
    assert "per_user_access" not in config.model_dump()


def test_the_old_and_new_names_cannot_contradict() -> None:
    with pytest.raises(ValidationError, match="contradicts allow_full_context"):
        tenant(per_user_access=True, allow_full_context=True)
