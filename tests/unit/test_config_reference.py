"""The configuration reference (docs/configuration.md) is a real, valid configuration."""

import re
from pathlib import Path

from gateway.settings import load_settings

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_configuration_reference_validates(tmp_path: Path) -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", REFERENCE.read_text(), re.DOTALL)
    example = next(b for b in blocks if "router:" in b and "tenants:" in b)
    # The reference abbreviates digests with an ellipsis; put a real one in.
    example = re.sub(r"\[9f86d08…\]", "[" + "9f86d08" + "0" * 57 + "]", example)
    path = tmp_path / "config.yaml"
    path.write_text(example)
    settings = load_settings(path)
    assert settings.router.rules[0].name == "billing"
    assert settings.tenants[0].id == "acme"
