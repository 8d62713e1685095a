#!/usr/bin/env bash
# kc-watchman demo: a real podman container with a supervisor tree next to
# it, stopped with the hook installed (the tree dies with it), then one
# stopped without the hook (the janitor finds and reaps the stray tree).
#
# Everything runs on a private podman setup under a temp dir (its own
# containers.conf, storage, hooks dir and API socket): the host's own podman
# configuration and containers are not touched. Everything started here is
# stopped again by PID on exit.
set -euo pipefail

[ "$(id -u)" = 0 ] || { echo "demo: run as root (it starts containers and signals process groups)" >&2; exit 1; }
cd "$(dirname "$0")/.."
REPO=$PWD
export PATH="$PATH:/usr/local/go/bin"

need=()
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
[ -x /bin/busybox ] || need+=(busybox-static)
if [ ${#need[@]} -gt 0 ]; then
	echo "==> installing ${need[*]} from Debian's packages"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

T=$(mktemp -d /tmp/kc-demo.XXXXXX)
PIDS=()
cleanup() {
	set +e
	for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null; done
	if [ -n "${P:-}" ]; then
		$P rm -f -a -t 0 >/dev/null 2>&1
		# conmon's asynchronous "podman container cleanup" must finish
		# before the store goes away.
		for _ in $(seq 100); do pgrep -f "$T" >/dev/null || break; sleep 0.1; done
		grep " $T/" /proc/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l
	fi
	# Kill what is left of the demo's trees by their recorded groups.
	for g in "${GROUPS_STARTED[@]:-}"; do [ -n "$g" ] && kill -KILL -- "-$g" 2>/dev/null; done
	rm -rf "$T"
}
GROUPS_STARTED=()
trap cleanup EXIT

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
show() { printf '$ %s\n' "$*"; "$@"; }

mkdir -p "$T/tmp" "$T/rootfs/bin" "$T/rootfs/tmp" "$T/hooks" "$T/nohooks" "$T/state" "$T/sock" "$T/bin"
cp /bin/busybox "$T/rootfs/bin/busybox"
for a in sh sleep; do ln -s busybox "$T/rootfs/bin/$a"; done
cat > "$T/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
[engine]
runtime = "runc"
tmp_dir = "$T/tmp"
lock_type = "file"
events_logger = "none"
cgroup_manager = "cgroupfs"
CONF
export CONTAINERS_CONF="$T/containers.conf"
STORE="--root $T/storage --runroot $T/run --storage-driver vfs"
P="podman $STORE --hooks-dir $T/hooks"
PNOHOOK="podman $STORE --hooks-dir $T/nohooks"

cp bin/kc-hook "$T/bin/kc-hook"
for f in hooks.d/*.json; do
	sed -e "s|/usr/local/libexec/oci/hooks.d/kc-hook|$T/bin/kc-hook|" \
	    -e "s|\"PATH=|\"KC_STATE_DIR=$T/state\", \"KC_KILL_GRACE=2s\", \"PATH=|" "$f" > "$T/hooks/$(basename "$f")"
done
echo "building a stand-in supervisor (the tests' fake kcserver: serves /status and /sessions like Kallichore)"
CGO_ENABLED=0 go build -o "$T/bin/kcserver" ./internal/testkit/kcserver

start_tree() { # container-id → sets SUP to the supervisor's pid
	"$T/bin/kcserver" --socket-dir "$T/sock" --container-id="$1" --children=2 --stubborn-child \
		--ready-file "$T/ready.$1" >/dev/null 2>&1 &
	local pid=$!
	disown "$pid"
	PIDS+=("$pid")
	GROUPS_STARTED+=("$pid")
	for _ in $(seq 100); do [ -s "$T/ready.$1" ] && break; sleep 0.05; done
	SUP=$pid
}
tree_of() { ps -o pid=,pgid=,stat=,comm=,args= -g "$1" 2>/dev/null | grep -v ' Z ' || true; }

step "1. the hook: a container with a supervisor tree, stopped"
ID=$($P run -d --network none --rootfs "$T/rootfs" /bin/sleep 100000)
echo "container $ID"
start_tree "$ID"
echo "supervisor tree (process group $SUP; one child ignores SIGTERM):"
tree_of "$SUP"
ls -l "$T/sock"
show $P stop -t 1 "$ID" >/dev/null
echo "after podman stop:"
[ -z "$(tree_of "$SUP")" ] && echo "  tree $SUP: gone" || { echo "  tree $SUP still alive:"; tree_of "$SUP"; }
echo "  sockets left: $(ls "$T/sock" | wc -l)"
echo "ledger record ($T/state/containers/$ID.json):"
cat "$T/state/containers/$ID.json"

step "2. the janitor: a container stopped WITHOUT the hook leaves a stray tree"
ID2=$($PNOHOOK run -d --network none --rootfs "$T/rootfs" /bin/sleep 100000)
start_tree "$ID2"; SUP2=$SUP
$PNOHOOK stop -t 1 "$ID2" >/dev/null
echo "container stopped; its tree is still there:"
tree_of "$SUP2"
$P system service --time=0 "unix://$T/podman.sock" >/dev/null 2>&1 &
PIDS+=($!)
disown $!
for _ in $(seq 100); do [ -S "$T/podman.sock" ] && break; sleep 0.1; done
JF="--podman-url unix://$T/podman.sock --state-dir $T/state --podman-arg=--root=$T/storage --podman-arg=--runroot=$T/run --podman-arg=--storage-driver=vfs"
# --container keeps the demo to its own containers: on a real host, every
# stray would be reaped, including trees that are not the demo's.
echo "(the demo passes --min-age 0s; the default 90s protects trees racing their container's start)"
show bin/kc-janitor reconcile $JF --container "$ID2" --min-age 0s 2>/dev/null || true
show bin/kc-janitor reconcile $JF --container "$ID2" --min-age 0s --apply --kill-grace 2s 2>/dev/null
[ -z "$(tree_of "$SUP2")" ] && echo "tree $SUP2: gone" || tree_of "$SUP2"

step "3. sockets: a supervisor killed with SIGKILL leaves its socket behind"
ID3=0000000000000000000000000000000000000000000000000000000000000003
start_tree "$ID3"; SUP3=$SUP
kill -KILL "$SUP3"
ls "$T/sock"
show bin/kc-janitor sweep --socket-dir "$T/sock" 2>/dev/null || true
show bin/kc-janitor sweep --socket-dir "$T/sock" --apply 2>/dev/null || true
kill -KILL -- "-$SUP3" 2>/dev/null || true

step "4. status and doctor: the operator's view of this (demo) host"
show bin/kc-janitor status $JF --socket-dir "$T/sock" 2>/dev/null || true
show bin/kc-janitor doctor $JF --hooks-dir "$T/hooks" --socket-dir "$T/sock" 2>/dev/null || true
step "done: everything the demo started is being removed"
