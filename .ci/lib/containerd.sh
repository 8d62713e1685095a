# shellcheck shell=bash
# A private containerd for the tests (Debian's containerd 1.6 package):
# its own root, state and sockets under a temp dir, so the host's
# /run/containerd (and Docker's containerd) are never touched.
#
#   source .ci/lib/containerd.sh
#   start_containerd    # exports KC_TEST_CONTAINERD_ADDRESS
#   ...
#   stop_containerd     # by PID; removes the temp dir
#
# The CRI plugin is enabled with a base_runtime_spec carrying kc-hook's
# hooks only when KC_TEST_CONTAINERD_CRI_SPEC names a spec file; the tests
# that need CRI start their own containerd (internal/testutil/containerd).
# Images are not pulled (no registry): the tests build an OCI archive from
# busybox-static and import it with `ctr images import`.

CONTAINERD_PID=
CONTAINERD_DIR=

start_containerd() {
	command -v containerd >/dev/null || {
		echo "start_containerd: no containerd binary (apt-get install containerd)" >&2
		return 1
	}
	CONTAINERD_DIR=$(mktemp -d /tmp/kc-containerd.XXXXXX)
	local d=$CONTAINERD_DIR
	mkdir -p "$d/root" "$d/state" "$d/tmp"
	cat >"$d/config.toml" <<CONF
# Written by .ci/lib/containerd.sh for the tests only.
version = 2
root = "$d/root"
state = "$d/state"
# CRI is off here: it is exercised by its own containerd in the CRI test.
disabled_plugins = ["io.containerd.grpc.v1.cri"]

[grpc]
  address = "$d/containerd.sock"

[ttrpc]
  address = "$d/containerd.sock.ttrpc"

[debug]
  address = ""
CONF
	# TMPDIR: a stack dump (containerd.<pid>.stacks.log) stays in our dir.
	TMPDIR="$d/tmp" containerd --config "$d/config.toml" >"$d/containerd.log" 2>&1 </dev/null &
	CONTAINERD_PID=$!
	local i
	for i in $(seq 150); do
		if [ -S "$d/containerd.sock" ] && timeout 5 ctr -a "$d/containerd.sock" version >/dev/null 2>&1 </dev/null; then
			export KC_TEST_CONTAINERD_ADDRESS=$d/containerd.sock
			echo "==> private containerd pid $CONTAINERD_PID on $KC_TEST_CONTAINERD_ADDRESS" >&2
			return 0
		fi
		if ! kill -0 "$CONTAINERD_PID" 2>/dev/null; then
			cat "$d/containerd.log" >&2
			echo "start_containerd: containerd exited" >&2
			return 1
		fi
		sleep 0.2
	done
	tail -n 30 "$d/containerd.log" >&2
	echo "start_containerd: containerd did not answer on $d/containerd.sock in 30s" >&2
	return 1
}

stop_containerd() {
	local d=$CONTAINERD_DIR
	if [ -n "$CONTAINERD_PID" ] && kill -0 "$CONTAINERD_PID" 2>/dev/null; then
		echo "==> stopping private containerd (pid $CONTAINERD_PID)" >&2
		# Tasks the tests left behind: killed, then deleted (a shim exits
		# only once its task is deleted, and nothing else here deletes
		# one: the CRI plugin is off), and their containers removed.
		local ns id
		for ns in $(ctr -a "$d/containerd.sock" namespaces ls -q 2>/dev/null </dev/null); do
			for id in $(ctr -a "$d/containerd.sock" -n "$ns" tasks ls -q 2>/dev/null </dev/null); do
				ctr -a "$d/containerd.sock" -n "$ns" tasks kill -s KILL "$id" >/dev/null 2>&1 </dev/null || true
				ctr -a "$d/containerd.sock" -n "$ns" tasks delete -f "$id" >/dev/null 2>&1 </dev/null || true
			done
			for id in $(ctr -a "$d/containerd.sock" -n "$ns" containers ls -q 2>/dev/null </dev/null); do
				ctr -a "$d/containerd.sock" -n "$ns" containers rm "$id" >/dev/null 2>&1 </dev/null || true
			done
		done
		kill -TERM "$CONTAINERD_PID" 2>/dev/null || true
		for _ in $(seq 100); do kill -0 "$CONTAINERD_PID" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$CONTAINERD_PID" 2>/dev/null || true
		wait "$CONTAINERD_PID" 2>/dev/null || true
	fi
	CONTAINERD_PID=
	if [ -n "$d" ]; then
		# Snapshots may still be mounted (overlayfs) if a task survived.
		{ grep -o " $d/[^ ]*" /proc/mounts 2>/dev/null | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done; } || true
		rm -rf "$d"
	fi
	CONTAINERD_DIR=
}
