"""`querygate eval`: a configuration's routing and retrieval measured on an operator's own
labelled questions, before the configuration (or a retrained router) is rolled out.

    querygate --config FILE eval routes LABELS.jsonl [--tenant T] [--with-escalation] [--json]
    querygate --config FILE eval retrieval LABELS.jsonl --tenant T [--k 10] [--json]

The labelled files are read by `examples`, routes scored by `routing`, retrieval by
`retrieval`, both with the bootstrap intervals of `stats`; `report` prints them. The names
below are what the CLI calls.
"""

from gateway.eval.errors import EvalError
from gateway.eval.report import finite, render_retrieval, render_routes
from gateway.eval.retrieval import evaluate_retrieval
from gateway.eval.routing import evaluate_routes

__all__ = [
    "EvalError",
    "evaluate_retrieval",
    "evaluate_routes",
    "finite",
    "render_retrieval",
    "render_routes",
]
