"""`querygate`: serve, ingest, reindex, route, eval, config, opensearch. Argument parsing and
what each command prints; the work is `gateway/server`'s (run, commands), `gateway/eval`'s and
the backends'. Every command reads the same configuration (`config` reads the file it is given, or
none).

Over 400 lines because the seven commands' parsers and their print-outs are each small and read
best side by side: one module is where `querygate --help` is written."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path

from gateway.obs.logs import configure_logging
from gateway.settings import ConfigError, Settings, load_settings

log = logging.getLogger("querygate")

# What pydantic writes its JSON schemas in.
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # Resolved once: `serve --workers N` hands the same choice to every worker.
    args.log_format = configure_logging(args.log_level, args.log_format)
    if args.command == "config":
        return _config(args)
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    handler = {
        "serve": _serve,
        "ingest": _ingest,
        "reindex": _reindex,
        "route": _route,
        "eval": _eval,
        "opensearch": _opensearch,
    }[args.command]
    return handler(settings, args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="querygate", description=__doc__)
    parser.add_argument("--config", type=Path, help="YAML configuration file")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument(
        "--log-format",
        choices=("auto", "json", "text"),
        default="auto",
        help="json: one JSON object per line; text: one short line per request, health probes "
        "only when they fail; auto (default): text on a terminal, else json",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument(
        "--sample-corpus",
        action="store_true",
        help="ingest the offline Wikipedia sample for the demo tenant in the background while "
        "serving (a no-op when done; with --workers N > 1, before serving)",
    )
    serve.add_argument(
        "--workers",
        type=_workers,
        default=1,
        help="worker processes on the one port (default 1; auto = one per core)",
    )

    ingest = sub.add_parser("ingest", help="add .md, .txt and .jsonl documents for a tenant")
    ingest.add_argument("--tenant", required=True)
    ingest.add_argument("paths", nargs="*", type=Path)
    ingest.add_argument(
        "--sample-corpus", action="store_true", help="the offline Wikipedia sample (10,033 pages)"
    )
    ingest.add_argument(
        "--rechunk",
        action="store_true",
        help="rewrite unchanged documents too, with today's chunker (after an upgrade changed it)",
    )
    ingest.add_argument(
        "--source",
        help="the name to record as these documents' source (default: each path, resolved); "
        "give the same name each time to ingest one source from different places",
    )
    ingest.add_argument(
        "--prune",
        action="store_true",
        help="after ingesting, list the documents of each source given (each path, or "
        "--source) that it no longer has; deletes nothing without --apply. Documents PUT by "
        "the API, ingested from another source, or stored before sources were recorded are "
        "never pruned",
    )
    ingest.add_argument("--apply", action="store_true", help="with --prune: delete what it lists")

    reindex = sub.add_parser(
        "reindex",
        help="rebuild a tenant's index with the configured chunker and embedding model while "
        "it serves, then switch to it (the old version is kept for --rollback)",
    )
    who = reindex.add_mutually_exclusive_group(required=True)
    who.add_argument("--tenant")
    who.add_argument("--all", action="store_true", help="every configured tenant")
    step = reindex.add_mutually_exclusive_group()
    for flag, text in (
        ("--status", "print the versions: serving, building, previous"),
        ("--rollback", "serve the previous version again (the current one becomes previous)"),
        ("--drop-old", "delete the previous version: no rollback after this"),
        ("--abort", "delete a building version (a build that was stopped)"),
    ):
        step.add_argument(flag, action="store_true", help=text)

    route = sub.add_parser("route", help="explain the routing decision for a question")
    route.add_argument("question")
    route.add_argument("--tenant", default="demo", help="whose routing rules apply")

    evaluate = sub.add_parser(
        "eval", help="measure this configuration's routing or retrieval on labelled questions"
    )
    kinds = evaluate.add_subparsers(dest="evaluation", required=True)
    routes = kinds.add_parser(
        "routes",
        help='route accuracy on JSONL lines {"question", "route", "history"?}',
        description="Classifier and policy only: no LLM is called, nothing is answered.",
    )
    routes.add_argument("file", type=Path)
    routes.add_argument("--tenant", default="demo", help="whose routing rules apply")
    routes.add_argument(
        "--with-escalation",
        action="store_true",
        help="run each lookup's retrieval and evidence grade on the tenant's index; "
        "escalated ones count as multihop",
    )
    retrieval = kinds.add_parser(
        "retrieval",
        help='recall@k and MRR@10 on JSONL lines {"question", "relevant": [doc_id, ...]}',
        description="BM25, dense and fused search of the tenant's index, as a lookup makes it.",
    )
    retrieval.add_argument("file", type=Path)
    retrieval.add_argument("--tenant", required=True)
    retrieval.add_argument("--k", type=_positive, default=10, help="recall@k (default 10)")
    for kind in (routes, retrieval):
        kind.add_argument("--json", action="store_true", help="print the report as JSON")
        kind.add_argument(
            "--show", type=_positive, default=10, help="worst misroutes / misses to list"
        )

    opensearch = sub.add_parser("opensearch", help="operations on the OpenSearch indices")
    opensearch.add_subparsers(dest="operation", required=True).add_parser(
        "migrate-tenancy",
        help="move a tenancy: shared deployment's chunks into one index per tenant "
        "(index_per_tenant); stop the gateways first; idempotent and resumable",
    )

    config = sub.add_parser("config", help="the configuration's JSON schema, or check a file")
    actions = config.add_subparsers(dest="action", required=True)
    actions.add_parser("schema", help="print the configuration's JSON schema")
    check = actions.add_parser(
        "check",
        help="validate a configuration file (with the QUERYGATE_* environment, as serve "
        "reads it) without starting anything: exit 0 and OK, or 2 naming every bad field",
    )
    check.add_argument("file", type=Path)
    return parser


def _positive(value: str) -> int:
    number = int(value)
    if not 1 <= number <= 100:
        raise argparse.ArgumentTypeError("want an integer from 1 to 100")
    return number


def _workers(value: str) -> int:
    from gateway.server.workers import worker_count

    try:
        return worker_count(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _serve(settings: Settings, args: argparse.Namespace) -> int:
    from gateway.core.runtime import DEMO_TENANT
    from gateway.server import commands, run

    # A SIGHUP before the server or the supervisor is up is ignored from the package's import
    # (gateway/__init__.py): it must not end the process.
    options = run.ServeOptions(
        args.config, args.host, args.port, args.log_level, args.workers, args.log_format
    )
    settings = run.serve_settings(settings, options)  # the demo key is made here, once
    if args.workers == 1:
        ingest = None
        if args.sample_corpus:
            from gateway.ingest.background import BackgroundIngest
            from gateway.ingest.wiki_sample import load_in_ingest_order

            # In the app's lifetime: the port opens at once and answers while it runs.
            ingest = BackgroundIngest(DEMO_TENANT, load_in_ingest_order)
        return run.serve_one(settings, options, ingest)
    if args.sample_corpus:
        # Workers are separate processes: the one writer ingests before they start.
        asyncio.run(commands.ingest(settings, DEMO_TENANT, [], sample=True))
    return run.supervise(settings, options)


def _ingest(settings: Settings, args: argparse.Namespace) -> int:
    """Exit 0: everything given was ingested; 1: the rest was, but something was skipped (a
    path that does not exist, a document over the chunk cap), each named on stderr; 2: nothing
    was (no paths, an unreadable file, a bad configuration, prune options that cannot run). A
    prune does not change the status: what it lists or deletes is named on stderr."""
    from gateway.server import commands

    if not args.paths and not args.sample_corpus:
        print("nothing to ingest: give paths or --sample-corpus", file=sys.stderr)
        return 2
    if (refusal := _prune_refusal(args)) is not None:
        print(refusal, file=sys.stderr)
        return 2
    from gateway.ingest.readers import UnreadableInput

    missing = [path for path in args.paths if not path.exists()]
    for path in missing:
        print(f"skipped, no such file or directory: {path}", file=sys.stderr)
    present = [path for path in args.paths if path.exists()]
    if not present and not args.sample_corpus:
        print("nothing to ingest: no path given exists", file=sys.stderr)
        return 2  # before any index is made: a new empty one would look like a served one
    if (notice := asyncio.run(commands.new_index_notice(settings))) is not None:
        print(notice, file=sys.stderr)
    prune: commands.PruneMode = "off" if not args.prune else "apply" if args.apply else "dry-run"
    try:
        report = asyncio.run(
            commands.ingest(
                settings,
                args.tenant,
                present,
                args.sample_corpus,
                args.rechunk,
                source=args.source,
                prune=prune,
            )
        )
    except UnreadableInput as exc:
        print(f"cannot ingest: {exc}", file=sys.stderr)
        return 2
    refused = report.pop("too_large_ids")
    blank = report.pop("blank_ids")
    stale = report.pop("stale_ids", {})
    print(json.dumps({**report, "missing_paths": len(missing)}))
    if prune != "off":
        _print_prune(args.tenant, stale, report["unsourced"], applied=prune == "apply")
    if blank:
        # The API refuses such a text (422); here it means the document should not exist.
        print(
            "not ingested, blank text (white space or invisible characters only; a stored "
            f"version is deleted): {', '.join(blank)}",
            file=sys.stderr,
        )
    if refused:
        print(
            f"not ingested, more than server.max_document_chunks "
            f"({settings.server.max_document_chunks}) chunks each: {', '.join(refused)}",
            file=sys.stderr,
        )
    return 1 if refused or missing else 0


def _prune_refusal(args: argparse.Namespace) -> str | None:
    """Why the prune options cannot run as given (exit 2, before anything is written)."""
    if args.apply and not args.prune:
        return "--apply deletes what --prune lists: give both"
    if args.prune and not args.paths:
        return "nothing to prune: --prune compares the index with the paths given"
    if args.source is not None and not args.source.strip():
        return "--source: want a name (documents without a source are never pruned)"
    return None


def _print_prune(
    tenant: str, stale: dict[str, list[str]], unsourced: int, *, applied: bool
) -> None:
    """The prune's documents on stderr, one line each: deleted, or what --apply would delete."""
    verb = "deleted" if applied else "would delete"
    for source, doc_ids in stale.items():
        for doc_id in doc_ids:
            print(f"{verb}, no longer in {source}: {doc_id}", file=sys.stderr)
    if stale and not applied:
        print("dry run, nothing deleted: add --apply to delete them", file=sys.stderr)
    if unsourced:
        print(
            f"{unsourced} documents of tenant {tenant} have no recorded source (PUT by the API, "
            "or stored before sources were recorded) and are never pruned",
            file=sys.stderr,
        )


def _reindex(settings: Settings, args: argparse.Namespace) -> int:
    """One JSON line per tenant. Exit 0: done for every tenant; 2: a step the versions do not
    allow (its reason on stderr), or a backend without versions; 1: the backend failed."""
    from backends.errors import BackendError
    from backends.retrieval.versions import VersionError
    from gateway.ingest.reindex import ReindexError
    from gateway.server import commands

    step = next(
        (s for s in ("status", "rollback", "drop_old", "abort") if getattr(args, s)), "build"
    )
    try:
        for line in asyncio.run(commands.reindex(settings, args.tenant, step)):
            print(json.dumps(line))
    except VersionError as exc:
        print(f"cannot reindex: {exc}", file=sys.stderr)
        return 2
    except (BackendError, ReindexError) as exc:
        print(f"cannot reindex: {exc}", file=sys.stderr)
        return 1
    return 0


def _route(settings: Settings, args: argparse.Namespace) -> int:
    from gateway.server.commands import explain_route

    print(json.dumps(asyncio.run(explain_route(settings, args.tenant, args.question)), indent=2))
    return 0


def _config(args: argparse.Namespace) -> int:
    if args.action == "schema":
        schema = {"$schema": JSON_SCHEMA_DIALECT, **Settings.model_json_schema()}
        print(json.dumps(schema, indent=2))
        return 0
    if not args.file.is_file():
        print(f"cannot read {args.file}: no such file", file=sys.stderr)
        return 2
    try:
        settings = load_settings(args.file)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"OK {args.file}: config version {settings.version}")
    return 0


def _opensearch(settings: Settings, args: argparse.Namespace) -> int:
    """`opensearch migrate-tenancy`, the one operation: prints the tenants and chunks moved."""
    from backends.errors import BackendError
    from backends.retrieval.opensearch import migrate_tenancy

    config = settings.retrieval.opensearch
    if config.tenancy != "index_per_tenant":
        print(
            "retrieval.opensearch.tenancy must be index_per_tenant to migrate to it",
            file=sys.stderr,
        )
        return 2
    try:
        copied = asyncio.run(migrate_tenancy(config))
    except BackendError as exc:
        print(f"cannot migrate: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"tenants": len(copied), "chunks": sum(copied.values())}))
    return 0


def _eval(settings: Settings, args: argparse.Namespace) -> int:
    from backends.errors import BackendError
    from gateway import eval as evaluation

    try:
        if args.evaluation == "routes":
            report = asyncio.run(
                evaluation.evaluate_routes(
                    settings,
                    args.file,
                    args.tenant,
                    with_escalation=args.with_escalation,
                    show=args.show,
                )
            )
            text = evaluation.render_routes
        else:
            report = asyncio.run(
                evaluation.evaluate_retrieval(
                    settings, args.file, args.tenant, k=args.k, show=args.show
                )
            )
            text = evaluation.render_retrieval
    except (evaluation.EvalError, ConfigError) as exc:
        print(f"cannot evaluate: {exc}", file=sys.stderr)
        return 2
    except BackendError as exc:
        print(f"cannot evaluate: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(evaluation.finite(report), indent=2) if args.json else text(report))
    return 0
