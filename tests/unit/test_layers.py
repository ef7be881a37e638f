"""The layer rule: a module imports only from its own package or from a layer below it.

Every import counts, at module level, inside a function (lazy) or under TYPE_CHECKING, so a
cycle cannot be hidden by deferring one side of it. Packages of one layer are siblings and may
not import each other. docs/architecture.md draws the same stack.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Top first. A module of one entry may import its own entry and any entry of a lower layer.
LAYERS: list[list[str]] = [
    ["gateway.cli"],
    ["gateway.eval"],
    ["gateway.server"],
    ["gateway.http"],
    ["gateway.core"],
    ["gateway.cache", "gateway.limits", "gateway.ingest"],
    ["gateway.obs"],
    ["gateway.settings", "gateway.errors", "gateway.text"],
    ["routers"],
    ["backends"],
]
# The package's own entry points sit above every layer.
TOP = {"gateway", "gateway.__main__"}


def _unit(module: str) -> tuple[int, str] | None:
    """The layer index and entry a dotted module name belongs to (None: not ours)."""
    for depth, layer in enumerate(LAYERS):
        for entry in layer:
            if module == entry or module.startswith(entry + "."):
                return depth, entry
    return None


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.add(target)
            # `from gateway.server import heap` imports the module gateway.server.heap.
            found.update(
                name for alias in node.names if _is_module(name := f"{target}.{alias.name}")
            )
    return found


def _sources() -> list[Path]:
    return sorted(
        path for top in ("gateway", "routers", "backends") for path in (ROOT / top).rglob("*.py")
    )


def upward(module: str, tree: ast.AST, is_package: bool) -> list[str]:
    """The imports of one module that point at its own layer's siblings or above it."""
    own = _unit(module)
    assert own is not None, f"{module} is in no layer: add it to LAYERS"
    found = []
    for target in sorted(_imported(tree, module, is_package)):
        other = _unit(target)
        if other is not None and other[1] != own[1] and other[0] <= own[0]:
            found.append(f"{module} imports {target}")
    return found


def violations() -> list[str]:
    found: list[str] = []
    for path in _sources():
        module = _module_name(path)
        if module not in TOP:
            tree = ast.parse(path.read_text(encoding="utf-8"))
            found += upward(module, tree, path.name == "__init__.py")
    return found


def test_every_import_points_down_the_layers() -> None:
    assert violations() == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import gateway.server.app\n", ["gateway.core.x imports gateway.server.app"]),
        (
            "def f():\n    from gateway.http import wire\n",
            [
                "gateway.core.x imports gateway.http",
                "gateway.core.x imports gateway.http.wire",
            ],
        ),
        (
            "from gateway.server import heap\n",
            ["gateway.core.x imports gateway.server", "gateway.core.x imports gateway.server.heap"],
        ),
        (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from gateway.cli import main\n",
            ["gateway.core.x imports gateway.cli", "gateway.core.x imports gateway.cli.main"],
        ),
        ("from gateway.limits.quotas import Quotas\n", []),
    ],
)
def test_the_walk_sees_lazy_and_plain_imports(source: str, expected: list[str]) -> None:
    assert upward("gateway.core.x", ast.parse(source), is_package=False) == expected


# The request core and what it stands on know nothing of the HTTP framework: they are driven
# by plain arguments, so they run (and are tested) without a server.
FRAMEWORK_FREE = (
    "gateway.core",
    "gateway.cache",
    "gateway.limits",
    "gateway.ingest",
    "routers",
)


def test_the_core_does_not_import_the_http_framework() -> None:
    found = []
    for path in _sources():
        module = _module_name(path)
        if module.startswith(FRAMEWORK_FREE):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            imported = _imported(tree, module, path.name == "__init__.py")
            found += [
                f"{module} imports {t}" for t in sorted(imported) if t.split(".")[0] == "aiohttp"
            ]
    assert found == []
