#!/usr/bin/env bash
# helm for the chart's tests, built once per machine from the Go module proxy (scripts/gotool.sh).
#   scripts/helm.sh            print the cached binary's path (building it first if needed)
#   scripts/helm.sh ARGS...    run it: scripts/helm.sh lint helm/querygate
exec "$(dirname "${BASH_SOURCE[0]}")/gotool.sh" helm "$@"
