"""Observability: request accounting, logs, metrics and stage timings."""
