#!/usr/bin/env bash
# kc-watchman demo: a real podman container with a supervisor tree next to
# it, stopped with the hook installed (the tree dies with it), then one
# stopped without the hook (the janitor finds and reaps the stray tree),
# then a socket left behind by a SIGKILLed supervisor (swept).
#
# Every step checks what it claims (from the janitor's JSON, the ledger and
# /proc) and a step that does not hold ends the demo with one line saying so
# and exit status 1.
#
# Everything runs on a private podman setup under a temp dir (its own
# containers.conf, storage, hooks dir and API socket): the host's own podman
# configuration and containers are not touched. The janitor is always
# scoped (--container <id>, or the demo's own --socket-dir). Everything
# started here is stopped again on exit, by PID after re-checking its start
# time.
set -Eeuo pipefail

[ "$(id -u)" = 0 ] || { echo "demo: run as root (it starts containers and signals process groups)" >&2; exit 1; }
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin:/usr/local/sbin:/usr/sbin:/sbin"
# The caller's kc-watchman settings (KC_SWEEP=1, KC_CONTAINER, KC_ENGINE, …)
# must not change what the demo does.
while read -r v; do unset "$v"; done < <(compgen -e | grep '^KC_' || true)

if [ -t 1 ] && [ -z "${NO_COLOR:-}" ]; then BOLD=$'\033[1m' PLAIN=$'\033[0m'; else BOLD='' PLAIN=''; fi
step() { printf '\n%s==> %s%s\n' "$BOLD" "$*" "$PLAIN"; }
show() { printf '$ %s\n' "$*"; "$@"; }
ok() { printf '  ok: %s\n' "$*"; }
STEP=setup
fail() {
	printf 'demo: FAILED (%s): %s\n' "$STEP" "$*" >&2
	exit 1
}
trap 'fail "line $LINENO: \"$BASH_COMMAND\" exited $?"' ERR

# poll SECONDS COMMAND...: true once COMMAND succeeds, false after SECONDS.
poll() {
	local end=$((SECONDS + $1))
	shift
	until "$@"; do
		[ "$SECONDS" -lt "$end" ] || return 1
		sleep 0.1
	done
}

need=()
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
[ -x /bin/busybox ] || need+=(busybox-static)
if [ ${#need[@]} -gt 0 ]; then
	echo "==> installing ${need[*]} from Debian's packages"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
[ -x bin/kc-hook ] && [ -x bin/kc-janitor ] || fail "bin/kc-hook and bin/kc-janitor are missing: run make demo (it builds them)"

# --- processes: identities, groups -------------------------------------------
# ticks PID: the process's start time (clock ticks since boot), empty if
# it is gone or a zombie.
ticks() {
	local st
	{ read -r st <"/proc/$1/stat"; } 2>/dev/null || return 0
	st=${st##*) }
	# shellcheck disable=SC2086
	set -- $st
	[ "$1" = Z ] || echo "${20}"
}
# members PGID: the live (non-zombie) processes of group PGID, one per line.
members() {
	local f st pid
	for f in /proc/[0-9]*/stat; do
		{ read -r st <"$f"; } 2>/dev/null || continue
		st=${st##*) }
		# shellcheck disable=SC2086
		set -- $st
		[ "$3" = "$PGID_ARG" ] && [ "$1" != Z ] || continue
		pid=${f#/proc/}
		echo "${pid%/stat}"
	done
}
group() { PGID_ARG=$1 members; }
count() { group "$1" | wc -l; }
group_gone() { [ "$(count "$1")" = 0 ]; }
show_group() {
	local pid
	for pid in $(group "$1"); do
		printf '  %7s  %s\n' "$pid" "$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-150)"
	done
}

# OURS holds "pid:ticks" of everything the demo started outside podman;
# cleanup kills each one that is still that process.
OURS=()
remember() {
	local t
	t=$(ticks "$1")
	[ -z "$t" ] || OURS+=("$1:$t")
}
# ours_alive: some process in OURS is still that process (and no zombie).
ours_alive() {
	local e
	for e in "${OURS[@]}"; do
		[ "$(ticks "${e%%:*}")" != "${e#*:}" ] || return 0
	done
	return 1
}

DEMO_TICKS=$(ticks $$)
T=$(mktemp -d /tmp/kc-demo.XXXXXX)
TRE=${T//./[.]} # matches $T, but not a command line holding this pattern
P=()
cleanup() {
	local rc=$? e pid left
	trap - ERR
	set +eE
	for e in "${OURS[@]}"; do
		pid=${e%%:*}
		[ "$(ticks "$pid")" != "${e#*:}" ] || kill -KILL "$pid" 2>/dev/null
	done
	poll 5 eval '! ours_alive' || echo "demo: cleanup: some of the demo's processes survived SIGKILL: ${OURS[*]}" >&2
	if [ ${#P[@]} -gt 0 ]; then
		"${P[@]}" rm -f -a -t 0 >/dev/null 2>&1
		# conmon's asynchronous "podman container cleanup" must finish
		# before the store goes away.
		poll 10 eval '[ -z "$(grep -laE "$TRE" /proc/[0-9]*/cmdline 2>/dev/null)" ]'
		# Only the private podman's own (conmon, podman, its runtime),
		# started since the demo: an admin's `tail -f $T/...` is not ours.
		left=
		for pid in $(grep -laE "$TRE" /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3); do
			e=$(ticks "$pid")
			case $(cat "/proc/$pid/comm" 2>/dev/null) in
			conmon | podman | runc | catatonit) [ -n "$e" ] && [ "$e" -ge "$DEMO_TICKS" ] && left="$left $pid" ;;
			esac
		done
		if [ -n "$left" ]; then
			echo "demo: cleanup: killing leftover processes of the private podman:$left" >&2
			# shellcheck disable=SC2086
			kill -KILL $left 2>/dev/null
		fi
		grep " $T/" /proc/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l
	fi
	rm -rf "$T" || echo "demo: cleanup: could not remove $T" >&2
	# The trees' wrappers made kc-watchman/ for their cgroups; each one
	# went with its tree, and the parent goes once empty.
	for e in /sys/fs/cgroup/kc-watchman /sys/fs/cgroup/unified/kc-watchman /sys/fs/cgroup/freezer/kc-watchman; do
		rmdir "$e" 2>/dev/null
	done
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- a private podman -----------------------------------------------------------
mkdir -p "$T/tmp" "$T/net" "$T/rootfs/bin" "$T/rootfs/tmp" "$T/hooks" "$T/nohooks" "$T/state" "$T/sock" "$T/bin"
cp /bin/busybox "$T/rootfs/bin/busybox"
for a in sh sleep; do ln -s busybox "$T/rootfs/bin/$a"; done
cat >"$T/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
[engine]
runtime = "runc"
tmp_dir = "$T/tmp"
lock_type = "file"
events_logger = "none"
cgroup_manager = "cgroupfs"
[network]
# The demo's containers have no network; a private (empty) config dir keeps
# podman from reading, or warning about, the host's.
network_config_dir = "$T/net"
CONF
# Replaces the caller's (.ci/run sets its own): the demo's podman is its own.
export CONTAINERS_CONF="$T/containers.conf"
STORE=(--root "$T/storage" --runroot "$T/run" --storage-driver vfs)
P=(podman "${STORE[@]}" --hooks-dir "$T/hooks")
PNOHOOK=(podman "${STORE[@]}" --hooks-dir "$T/nohooks")

# pod WHAT COMMAND...: runs a podman command; PODOUT is its stdout. Its
# warnings are kept in $T/podman.log; a failure ends the demo with its last
# message.
pod() {
	local what=$1 rc=0
	shift
	PODOUT=$("$@" 2>"$T/podman.err") || rc=$?
	cat "$T/podman.err" >>"$T/podman.log"
	[ "$rc" = 0 ] || fail "$what exited $rc: $(grep -v '^$' "$T/podman.err" | tail -n1 || true)"
}

cp bin/kc-hook "$T/bin/kc-hook"
for f in hooks.d/*.json; do
	sed -e "s|/usr/local/libexec/oci/hooks.d/kc-hook|$T/bin/kc-hook|" \
		-e "s|\"PATH=|\"KC_STATE_DIR=$T/state\", \"KC_KILL_GRACE=2s\", \"PATH=|" "$f" >"$T/hooks/$(basename "$f")"
done
echo "building a stand-in supervisor (the tests' fake kcserver: real kcserver's flags, serves /status and /sessions like Kallichore)"
CGO_ENABLED=0 go build -o "$T/bin/kcserver" ./internal/testutil/kcserver

# The trees' wrappers watch this stand-in for a container's init process,
# not the container's own: a tree whose wrapper watched the real init would
# die with it, and the demo is about trees that are left behind.
sleep 1000000 &
INIT=$!
disown "$INIT"
remember "$INIT"
INIT_TICKS=$(ticks "$INIT")

# why_exited LOG: the first line of LOG that is not the wrapper's JSON log
# (kcserver's own error), else the wrapper's last line.
why_exited() {
	local line
	line=$(grep -v -e '^{' -e '^$' "$1" | head -n1 || true)
	[ -n "$line" ] || line=$(tail -n1 "$1" | cut -c1-300)
	printf '%s' "$line"
}

# start_tree N CONTAINER-ID: starts a supervisor tree the way kc-hook
# launches one: `kc-hook supervise` leads a new session and process group
# and carries the container ID in its argv; kcserver (the fake, with real
# kcserver's flags) runs under it with two kernels ("sleep") and one that
# ignores SIGTERM (KCFAKE_* are the fake's test knobs). Waits until all five
# processes are there; sets TREE (the group), KC (kcserver's pid) and SOCK
# (its control socket).
start_tree() {
	local id=$2 ready=$T/ready.$1 log=$T/tree.$1.log wrapper pid
	KCFAKE_READY_FILE=$ready KCFAKE_CHILDREN=2 KCFAKE_STUBBORN_CHILD=1 \
		"$T/bin/kc-hook" supervise --state-dir= --max-restarts=0 --kill-grace=2s \
		"$id" "$INIT" "$INIT_TICKS" -- "$T/bin/kcserver" --transport=socket --socket-dir="$T/sock" \
		</dev/null >/dev/null 2>"$log" &
	wrapper=$!
	disown "$wrapper"
	remember "$wrapper"
	tree_up() {
		[ -n "$(ticks "$wrapper")" ] || fail "the supervisor tree of $id exited at start: $(why_exited "$log")"
		[ -s "$ready" ] && [ "$(count "$wrapper")" -ge 5 ]
	}
	poll 15 tree_up || fail "the supervisor tree of $id did not start within 15s ($(count "$wrapper") of 5 processes in group $wrapper)"
	for pid in $(group "$wrapper"); do remember "$pid"; done
	TREE=$wrapper
	KC=$(head -n1 "$ready")
	SOCK=$(sed -n 2p "$ready")
	[ -S "$SOCK" ] || fail "kcserver $KC reported socket $SOCK, which is not a socket"
	ok "tree started: process group $TREE, $(count "$TREE") processes, kcserver $KC listening on $SOCK"
}

# jpick JSON OBJECT-START MATCH KEY: KEY's string value in the first object
# (of those starting with OBJECT-START) whose text contains MATCH. Plain
# grep and sed on the JSON: no jq or python needed.
jpick() {
	printf '%s' "$1" | tr -d ' \t\n' | sed "s/$2/\n&/g" | grep -F -- "$3" |
		sed -n "s/.*\"$4\":\"\([^\"]*\)\".*/\1/p" | head -n1 || true
}
tree_action() { jpick "$1" '{"container_id"' "\"pgid\":$2," action; }
socket_field() { jpick "$1" '{"path"' "\"path\":\"$2\"" "$3"; }

# janitor ARGS...: runs kc-janitor with --format json; OUT is its stdout,
# RC its exit status, $T/janitor.err its stderr.
janitor() {
	RC=0
	OUT=$(bin/kc-janitor "$@" --format json 2>"$T/janitor.err") || RC=$?
}
janitor_error() { tr '\n' ' ' <"$T/janitor.err" | cut -c1-300; }

# --- 1. the hook -----------------------------------------------------------------
STEP="step 1, the hook"
step "1. the hook: a container with a supervisor tree, stopped"
pod "podman run" "${P[@]}" run -d --network none --rootfs "$T/rootfs" /bin/sleep 100000
ID=$PODOUT
echo "container $ID"
LEDGER=$T/state/containers/$ID.json
[ -s "$LEDGER" ] || fail "kc-hook recorded nothing at createRuntime (no $LEDGER): is the hook in $T/hooks?"
ok "kc-hook recorded the container at createRuntime"
start_tree 1 "$ID"
echo "supervisor tree (one kernel ignores SIGTERM):"
show_group "$TREE"
echo "\$ podman stop -t 1 $ID"
pod "podman stop" "${P[@]}" stop -t 1 "$ID"
poll 15 group_gone "$TREE" || fail "tree $TREE still has $(count "$TREE") processes 15s after podman stop: the hook did not reap it"
ok "tree $TREE: gone"
poll 5 eval '[ ! -e "$SOCK" ]' || fail "socket $SOCK is still there after the stop"
ok "socket $SOCK: gone"
poll 5 grep -q '"outcome": *"reaped"' "$LEDGER" ||
	fail "the ledger record says outcome $(grep -o '"outcome": *"[^"]*"' "$LEDGER" || echo '(none)'), want \"reaped\""
ok "ledger record $LEDGER says outcome \"reaped\":"
grep -E '"(container_id|outcome|pgid|action|source|sockets_unlinked|createRuntime|poststop)"' "$LEDGER" | sed 's/^/    /'

# --- 2. the janitor --------------------------------------------------------------
STEP="step 2, the janitor"
step "2. the janitor: a container stopped WITHOUT the hook leaves a stray tree"
pod "podman run" "${PNOHOOK[@]}" run -d --network none --rootfs "$T/rootfs" /bin/sleep 100000
ID2=$PODOUT
echo "container $ID2 (started and stopped without the hook)"
start_tree 2 "$ID2"
TREE2=$TREE
pod "podman stop" "${PNOHOOK[@]}" stop -t 1 "$ID2"
[ "$(count "$TREE2")" -ge 5 ] || fail "tree $TREE2 lost processes when its container stopped without the hook"
echo "container stopped; its tree is still there:"
show_group "$TREE2"

"${P[@]}" system service --time=0 "unix://$T/podman.sock" </dev/null >"$T/podman-service.log" 2>&1 &
remember $!
disown $!
api_up() { podman --remote --url "unix://$T/podman.sock" version >/dev/null 2>&1 </dev/null; }
poll 30 api_up || fail "the demo's podman API service did not answer on $T/podman.sock within 30s"
JF=(--engine podman --podman-url "unix://$T/podman.sock" --state-dir "$T/state"
	--podman-arg="--root=$T/storage" --podman-arg="--runroot=$T/run" --podman-arg=--storage-driver=vfs)
# --container keeps the janitor to the demo's container: unscoped, it would
# judge every tree on this host.
echo "(--min-age 0s: the default 90s protects trees racing their container's start)"
show bin/kc-janitor reconcile "${JF[@]}" --container "$ID2" --min-age 0s
janitor reconcile "${JF[@]}" --container "$ID2" --min-age 0s
[ "$RC" = 0 ] || fail "kc-janitor reconcile (dry run) exited $RC: $(janitor_error)"
A=$(tree_action "$OUT" "$TREE2")
[ "$A" = would-reap ] || fail "the dry run says ${A:-nothing} for tree $TREE2, want would-reap"
[ "$(count "$TREE2")" -ge 5 ] || fail "the dry run touched tree $TREE2"
ok "dry run: tree $TREE2 would-reap, untouched"

# show_json KEYS ARGS...: prints the command line and the lines of the
# report holding one of KEYS (an extended regexp).
show_json() {
	local keys=$1
	shift
	printf '$ kc-janitor %s --format json\n' "$*"
	printf '%s\n' "$OUT" | grep -E "\"($keys)\":" | sed 's/^ */    /' || true
}
janitor reconcile "${JF[@]}" --container "$ID2" --min-age 0s --apply --kill-grace 2s
show_json "dry_run|container_id|pgid|action" reconcile --container "$ID2" --min-age 0s --apply --kill-grace 2s
[ "$RC" = 0 ] || fail "kc-janitor reconcile --apply exited $RC: $(janitor_error)"
A=$(tree_action "$OUT" "$TREE2")
[ "$A" = reaped ] || fail "reconcile --apply says ${A:-nothing} for tree $TREE2, want reaped"
poll 5 group_gone "$TREE2" || fail "reconcile --apply said reaped, but tree $TREE2 still has $(count "$TREE2") processes"
ok "tree $TREE2: reaped, gone"

# --- 3. sockets ------------------------------------------------------------------
STEP="step 3, sweep"
step "3. sockets: a supervisor killed with SIGKILL leaves its socket behind"
ID3=0000000000000000000000000000000000000000000000000000000000000003
start_tree 3 "$ID3"
TREE3=$TREE STALE=$SOCK
show kill -KILL "$KC"
# Its wrapper (--max-restarts=0) then takes the rest of the group down.
poll 15 group_gone "$TREE3" || fail "tree $TREE3 still has $(count "$TREE3") processes 15s after its kcserver was killed"
[ -S "$STALE" ] || fail "the SIGKILLed kcserver left no socket at $STALE"
ok "kcserver $KC is gone; its socket $STALE is left behind"
# --socket-dir: the demo's own directory only, never /tmp's real sockets.
janitor sweep --socket-dir "$T/sock"
show_json "dry_run|path|verdict|reason|action" sweep --socket-dir "$T/sock"
[ "$RC" = 0 ] || fail "kc-janitor sweep (dry run) exited $RC: $(janitor_error)"
V=$(socket_field "$OUT" "$STALE" verdict) A=$(socket_field "$OUT" "$STALE" action)
[ "$V/$A" = stale/would-unlink ] || fail "the sweep dry run says ${V:-nothing}/${A:-nothing} for $STALE, want stale/would-unlink"
[ -S "$STALE" ] || fail "the sweep dry run removed $STALE"
ok "dry run: $STALE stale, would-unlink, still there"
janitor sweep --socket-dir "$T/sock" --apply
show_json "dry_run|path|verdict|action" sweep --socket-dir "$T/sock" --apply
[ "$RC" = 0 ] || fail "kc-janitor sweep --apply exited $RC: $(janitor_error)"
A=$(socket_field "$OUT" "$STALE" action)
[ "$A" = unlinked ] || fail "sweep --apply says ${A:-nothing} for $STALE, want unlinked"
[ ! -e "$STALE" ] || fail "sweep --apply said unlinked, but $STALE is still there"
ok "$STALE: unlinked, gone"

# --- 4. the operator's view ------------------------------------------------------
STEP="step 4, status and doctor"
step "4. status and doctor: the operator's view of the demo's podman"
RC=0
show bin/kc-janitor status "${JF[@]}" --container "$ID" --container "$ID2" --socket-dir "$T/sock" 2>&1 || RC=$?
[ "$RC" = 0 ] || fail "kc-janitor status exited $RC"
# doctor's process and session checks look at the whole host, where other
# trees may be: its verdicts are shown, not checked.
RC=0
show bin/kc-janitor doctor "${JF[@]}" --hooks-dir "$T/hooks" --socket-dir "$T/sock" 2>&1 || RC=$?
echo "(doctor exited $RC: 0 all ok, 1 worst is a warning, 2 worst is an error)"

STEP=cleanup
step "done: every step checked; everything the demo started is being removed"
