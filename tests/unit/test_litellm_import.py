"""litellm costs seconds of CPU to import, so only a process that builds a litellm tier (or the
remote reranker) imports it: the one-shot commands (ingest, eval, reindex, route, config) and
the request core never do. In a fresh interpreter, since this one has imported it already."""

from __future__ import annotations

import subprocess
import sys

from tests.fixtures.gateway import REPO_ROOT

COMMAND_MODULES = (
    "gateway.cli.main",
    "gateway.server.commands",
    "gateway.server.services",
    "gateway.core.runtime",
    "gateway.eval.routing",
    "gateway.eval.retrieval",
)


def _imports_litellm(*modules: str) -> bool:
    code = f"import sys\nfor m in {modules!r}: __import__(m)\nprint('litellm' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.strip() == "True"


def test_the_commands_and_the_request_core_do_not_import_litellm() -> None:
    assert not _imports_litellm(*COMMAND_MODULES)


def test_the_tiers_do() -> None:  # the check above can see an import
    assert _imports_litellm("backends.llm.tiers")
