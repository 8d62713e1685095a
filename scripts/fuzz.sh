#!/usr/bin/env bash
# Runs every fuzz target of kc-watchman's input paths for a fixed time and
# prints how many inputs each one tried.
#
#   scripts/fuzz.sh [SECONDS]     # per target; default $KC_FUZZ_SECONDS or 25
#
# Five targets x 25s keeps the fuzz budget at about two minutes (plus the
# instrumented builds, cached after the first run; CI gives each 15s). The
# seeds are each target's f.Add calls and, where committed, its package's
# testdata/fuzz/<Target>/; a crash makes go test write the failing input
# there — commit it with the fix.
#
# Output: one line per target, then a total, in a parseable form:
#   FUZZ target=FuzzReadState pkg=./internal/hook seconds=25 execs=123456 result=ok
#   FUZZ total targets=5 execs=... failures=0
# result=deadline-race marks a run Go's coordinator ended with a bare
# "context deadline exceeded" (go.dev/issue/75804) that wrote no input and
# whose corpus still passes; it is not a failure.
# Exit status: 0 when no target failed.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
secs=${1:-${KC_FUZZ_SECONDS:-25}}
case $secs in
'' | *[!0-9]* | 0)
	echo "scripts/fuzz.sh: SECONDS must be a positive whole number, not '$secs'" >&2
	exit 2
	;;
esac
export CGO_ENABLED=0
targets=(
	"./internal/hook FuzzReadState"
	"./internal/kallichore FuzzDecodeStatus"
	"./internal/kallichore FuzzDecodeSessions"
	"./internal/sockets FuzzParseName"
	"./internal/fingerprint FuzzParseStat"
)

log=$(mktemp)
trap 'rm -f "$log"' EXIT
total=0
failures=0
for t in "${targets[@]}"; do
	read -r pkg fn <<<"$t"
	corpus="$pkg/testdata/fuzz/$fn"
	before=$(ls "$corpus" 2>/dev/null | sort)
	# Minimising each new interesting input is capped (100 runs): left at
	# its default (60s) it can stall a short budget on one large input.
	if go test -run '^$' -fuzz "^${fn}\$" -fuzztime "${secs}s" -fuzzminimizetime 100x "$pkg" >"$log" 2>&1; then
		result=ok
	elif [ "$(ls "$corpus" 2>/dev/null | sort)" = "$before" ] &&
		grep -q '^    context deadline exceeded$' "$log" &&
		! grep -qE 'panic:|Failing input written|--- FAIL: .*#' "$log" &&
		go test -run "^${fn}\$" "$pkg" >/dev/null 2>&1; then
		# Go's fuzzing coordinator can fail a target with a bare "context
		# deadline exceeded" as -fuzztime ends, having found nothing
		# (go.dev/issue/75804, fixed in Go 1.27). Nothing was written and
		# the corpus still passes: not a finding.
		result=deadline-race
	else
		result=FAIL
		failures=$((failures + 1))
	fi
	# go test prints "fuzz: elapsed: 25s, execs: 1234567 (49382/sec), ..."
	# every few seconds; the last line has the final count.
	execs=$(grep -o 'execs: [0-9]*' "$log" | tail -n 1 | awk '{print $2}')
	execs=${execs:-0}
	total=$((total + execs))
	echo "FUZZ target=$fn pkg=$pkg seconds=$secs execs=$execs result=$result"
	if [ "$result" != ok ]; then
		sed 's/^/    /' "$log"
	fi
done
echo "FUZZ total targets=${#targets[@]} execs=$total failures=$failures"
[ "$failures" -eq 0 ]
