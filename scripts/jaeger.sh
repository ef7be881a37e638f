#!/usr/bin/env bash
# Jaeger (v2's all-in-one: OTLP receiver, memory storage, query API) for the tracing tests,
# built once per machine from the Go module proxy (scripts/gotool.sh).
#   scripts/jaeger.sh            print the cached binary's path (building it first if needed)
#   scripts/jaeger.sh ARGS...    run it: scripts/jaeger.sh --config FILE
exec "$(dirname "${BASH_SOURCE[0]}")/gotool.sh" jaeger "$@"
