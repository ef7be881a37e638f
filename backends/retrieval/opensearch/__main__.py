"""`python -m backends.retrieval.opensearch migrate-tenancy CONFIG`: the one-off move of a
`shared` deployment's chunks to `index_per_tenant` (stop the gateways first)."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

from backends.retrieval.opensearch.migrate import migrate_tenancy


def main(argv: Sequence[str] | None = None) -> int:
    from gateway.settings import load_settings  # the entry point reads the gateway's config

    parser = argparse.ArgumentParser(prog="python -m backends.retrieval.opensearch")
    parser.add_argument("command", choices=["migrate-tenancy"])
    parser.add_argument("config", type=Path, nargs="?", help="the gateway's YAML config")
    args = parser.parse_args(argv)
    config = load_settings(args.config).retrieval.opensearch
    if config.tenancy != "index_per_tenant":
        parser.error("retrieval.opensearch.tenancy must be index_per_tenant to migrate to it")
    copied = asyncio.run(migrate_tenancy(config))
    print(json.dumps({"tenants": len(copied), "chunks": sum(copied.values())}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
