#!/usr/bin/env bash
# promtool for the alert rules' tests, built once per machine from the Go module proxy
# (scripts/gotool.sh).
#   scripts/promtool.sh            print the cached binary's path (building it first if needed)
#   scripts/promtool.sh ARGS...    run it: scripts/promtool.sh check rules FILE
exec "$(dirname "${BASH_SOURCE[0]}")/gotool.sh" promtool "$@"
