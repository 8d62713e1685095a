# shellcheck shell=bash
# Does the test suite leave the host as it found it (issue 25)? A snapshot
# before the tests, one after, and the difference is what they left:
#
#   - processes whose parent is PID 1 (orphans: a test killed a shell but
#     not the sleep it forked, a supervisor nobody reaped);
#   - entries of /tmp (t.TempDir dirs remade after their removal, build
#     dirs, kc-<pid>.sock sockets of killed supervisors);
#   - /run/kc-watchman (the production state dir: tests use their own);
#   - kc-watchman/<id> cgroups (a supervisor's, left by a wrapper that
#     never tore down and by no sweep after it).
#
#   source .ci/lib/hygiene.sh
#   hygiene_snapshot DIR/before       # before the tests
#   ...tests...
#   hygiene_check DIR/before DIR/after || status=1   # prints what was left
#
# Not counted: what existed before; zombies (dead, PID 1 reaps them
# lazily); processes of the rootless test user (stop_rootless kills them);
# Go's own go-build* work dirs. Processes still exiting are waited for, up
# to 15s, before they count. Set KC_CI_HYGIENE=warn to report without
# failing (a shared machine where another run churns /tmp).

HYGIENE_WAIT=${HYGIENE_WAIT:-15}                 # seconds for stragglers to exit
HYGIENE_RUN_DIR=${HYGIENE_RUN_DIR:-/run/kc-watchman} # the production state dir

# hygiene_procs prints "PID:STARTTICKS" of each live process whose parent
# is PID 1, but the rootless test user's.
hygiene_procs() {
	local d s rest f f2 uid line
	for d in /proc/[0-9]*; do
		# Builtins only: a fork per process would make each snapshot slow.
		read -r s 2>/dev/null <"$d/stat" || continue
		rest=${s##*) } # state ppid pgrp ...: the fields after comm
		rest=${rest#* }
		[ "${rest%% *}" = 1 ] || continue
		read -ra f <<<"${s##*) }"
		[ "${f[0]}" != Z ] && [ "${f[0]}" != X ] || continue
		if [ -n "${ROOTLESS_UID:-}" ]; then
			uid=
			while read -r line; do
				case $line in Uid:*) read -ra f2 <<<"$line"; uid=${f2[1]}; break ;; esac
			done 2>/dev/null <"$d/status"
			[ "$uid" != "$ROOTLESS_UID" ] || continue
		fi
		echo "${d#/proc/}:${f[19]}"
	done | sort
}

# hygiene_cgroups prints the kc-watchman/<id> cgroups on each hierarchy.
hygiene_cgroups() {
	local m d
	for m in /sys/fs/cgroup /sys/fs/cgroup/unified /sys/fs/cgroup/freezer; do
		for d in "$m"/kc-watchman/*/; do
			[ -d "$d" ] && echo "${d%/}"
		done
	done
	return 0
}

# hygiene_snapshot DIR writes the snapshot files into DIR.
hygiene_snapshot() {
	local dir=$1
	mkdir -p "$dir"
	hygiene_procs >"$dir/procs"
	# The clock, in the ticks /proc/PID/stat counts start times in: a
	# process older than the first snapshot was not started by the tests,
	# whoever adopts it later (a caller's shell reparented to PID 1).
	local up
	read -r up _ </proc/uptime
	echo $((${up%.*} * $(getconf CLK_TCK))) >"$dir/since"
	ls -A /tmp | sort >"$dir/tmp"
	hygiene_cgroups | sort >"$dir/cgroups"
	if [ -d "$HYGIENE_RUN_DIR" ]; then
		{ echo "$HYGIENE_RUN_DIR"; find "$HYGIENE_RUN_DIR" -mindepth 1 2>/dev/null; } | sort >"$dir/run"
	else
		: >"$dir/run"
	fi
}

# hygiene_new BEFORE AFTER prints the lines of AFTER not in BEFORE.
hygiene_new() { comm -13 "$1" "$2"; }

# hygiene_describe_proc PID prints one line about a leftover process.
hygiene_describe_proc() {
	local pid=$1 d=/proc/$1 args cwd uid etime
	args=$(tr '\0' ' ' <"$d/cmdline" 2>/dev/null)
	[ -n "$args" ] || args="[$(cat "$d/comm" 2>/dev/null)]"
	[ ${#args} -le 200 ] || args="${args:0:200}..."
	cwd=$(readlink "$d/cwd" 2>/dev/null || echo '?')
	uid=$(awk '/^Uid:/ {print $2; exit}' "$d/status" 2>/dev/null)
	etime=$(ps -o etime= -p "$pid" 2>/dev/null | tr -d ' ')
	printf '  process %s (parent 1, uid %s, up %s, pgid %s, cwd %s): %s\n' \
		"$pid" "${uid:-?}" "${etime:-?}" "$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ')" "$cwd" "${args% }"
}

# hygiene_check BEFORE AFTER snapshots BEFORE's state into AFTER (a dir)
# and prints what is new; its status is 1 when something was left.
hygiene_check() {
	local before=$1 after=$2 left=() procs=() p n e what
	# Processes: wait for stragglers (a conmon finishing its cleanup, a
	# group SIGKILLed a moment ago) before they count.
	local deadline=$((SECONDS + HYGIENE_WAIT))
	while :; do
		hygiene_snapshot "$after"
		mapfile -t procs < <(hygiene_new "$before/procs" "$after/procs")
		[ ${#procs[@]} -gt 0 ] && [ "$SECONDS" -lt "$deadline" ] || break
		sleep 0.2
	done
	local since
	since=$(cat "$before/since" 2>/dev/null || echo 0)
	for p in "${procs[@]}"; do
		[ "${p##*:}" -ge "$since" ] || continue
		[ -d "/proc/${p%%:*}" ] && left+=("$(hygiene_describe_proc "${p%%:*}")")
	done
	while IFS= read -r e; do
		case $e in
		go-build*) continue ;; # go's work dirs (go test killed by a timeout)
		kc-*.sock) what="$(stat -c %F "/tmp/$e" 2>/dev/null || echo gone), named as a supervisor's" ;;
		*)
			if [ -d "/tmp/$e" ]; then
				n=$(find "/tmp/$e" -mindepth 1 2>/dev/null | wc -l)
				what="dir, $n entries, owner $(stat -c %U "/tmp/$e" 2>/dev/null)"
			else
				what="$(stat -c %F "/tmp/$e" 2>/dev/null || echo gone)"
			fi
			;;
		esac
		left+=("  /tmp/$e ($what)")
	done < <(hygiene_new "$before/tmp" "$after/tmp")
	while IFS= read -r e; do
		left+=("  cgroup $e ($(wc -l <"$e/cgroup.procs" 2>/dev/null || echo '?') processes)")
	done < <(hygiene_new "$before/cgroups" "$after/cgroups")
	if [ ! -s "$before/run" ] && [ -s "$after/run" ]; then
		left+=("  $HYGIENE_RUN_DIR (created by the tests; $(($(wc -l <"$after/run") - 1)) entries)")
	else
		while IFS= read -r e; do left+=("  $e (new in $HYGIENE_RUN_DIR)"); done < <(hygiene_new "$before/run" "$after/run")
	fi
	if [ ${#left[@]} -eq 0 ]; then
		echo "hygiene: the tests left nothing behind (orphaned processes, /tmp entries, $HYGIENE_RUN_DIR, cgroups)"
		printf 'clean\n' >"$after/verdict"
		return 0
	fi
	{
		echo "hygiene: the tests left ${#left[@]} thing(s) on the host (issue 25; snapshots in $before and $after):"
		printf '%s\n' "${left[@]}"
	} | tee "$after/verdict"
	[ "${KC_CI_HYGIENE:-fail}" = warn ] && { echo "hygiene: KC_CI_HYGIENE=warn: not failing"; return 0; }
	return 1
}

# hygiene_summary prints the verdict of the last hygiene_check in AFTER.
hygiene_summary() {
	[ -f "$1/verdict" ] || { echo "hygiene: not checked (the tests did not get that far)"; return 0; }
	if [ "$(cat "$1/verdict")" = clean ]; then
		echo "hygiene: clean"
	else
		cat "$1/verdict"
	fi
}
