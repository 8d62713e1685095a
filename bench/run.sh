#!/bin/sh
# kc-watchman's performance harness (docs/PERFORMANCE.md), in one command:
# builds the binaries, then runs bench/cmd/kcbench, which fills this host
# with processes (default: N = 1000, 10000 and 30000), measures the scans,
# the hook, reconcile and sweep next to the seeds' approaches, prints a
# Markdown report and removes everything it started. Run as root; takes a
# few minutes. Extra arguments go to kcbench (see -h), e.g.
#   bench/run.sh -n 1000,10000 -podman off -md /tmp/report.md
set -eu
cd "$(dirname "$0")/.."
make build
exec env CGO_ENABLED=0 go run ./bench/cmd/kcbench "$@"
