# shellcheck shell=bash
# A private dockerd for the tests (Debian's docker.io 20.10): its own
# data root, exec root, socket and pidfile under a temp dir, no iptables,
# no bridge, so the host's own Docker (and its /var/run/docker.sock) is
# never touched. dockerd starts its own containerd under the exec root.
#
#   source .ci/lib/dockerd.sh
#   start_dockerd       # exports KC_TEST_DOCKER_URL, _IMAGE and _CLI
#   ...
#   stop_dockerd        # by PID; removes the temp dir
#
# No registry is reachable: the image kc-busybox is imported from a rootfs
# holding busybox-static (tar -C rootfs -c . | docker import - NAME).

DOCKERD_PID=
DOCKERD_DIR=
# Debian's own client, matching its dockerd: a newer docker CLI elsewhere
# on PATH (28.x) imports an empty layer from a 20.10 daemon.
DOCKER_CLI=docker
[ -x /usr/bin/docker ] && DOCKER_CLI=/usr/bin/docker

start_dockerd() {
	command -v dockerd >/dev/null || {
		echo "start_dockerd: no dockerd binary (apt-get install docker.io)" >&2
		return 1
	}
	# The short /tmp path keeps the socket path under the 108-byte limit.
	DOCKERD_DIR=$(mktemp -d /tmp/kc-dockerd.XXXXXX)
	local d=$DOCKERD_DIR
	mkdir -p "$d/data" "$d/exec" "$d/rootfs/bin" "$d/rootfs/tmp" "$d/tmp"
	# TMPDIR: the containerd dockerd starts writes a stack dump into the
	# temp dir as it comes up (containerd.<pid>.stacks.log); kept in ours,
	# it goes with it.
	TMPDIR="$d/tmp" dockerd --data-root "$d/data" --exec-root "$d/exec" -H "unix://$d/docker.sock" \
		--pidfile "$d/docker.pid" --iptables=false --ip-forward=false --bridge=none \
		--ip-masq=false --userland-proxy=false --storage-driver=vfs --log-level=warn \
		>"$d/dockerd.log" 2>&1 </dev/null &
	DOCKERD_PID=$!
	local i ok=
	for i in $(seq 150); do
		if [ -S "$d/docker.sock" ] && timeout 5 "$DOCKER_CLI" -H "unix://$d/docker.sock" version >/dev/null 2>&1 </dev/null; then
			ok=1
			break
		fi
		if ! kill -0 "$DOCKERD_PID" 2>/dev/null; then
			cat "$d/dockerd.log" >&2
			echo "start_dockerd: dockerd exited" >&2
			return 1
		fi
		sleep 0.2
	done
	if [ -z "$ok" ]; then
		tail -n 30 "$d/dockerd.log" >&2
		echo "start_dockerd: dockerd did not answer on $d/docker.sock in 30s" >&2
		return 1
	fi
	cp /bin/busybox "$d/rootfs/bin/busybox"
	local app
	for app in sh sleep cat ls kill; do ln -sf busybox "$d/rootfs/bin/$app"; done
	tar -C "$d/rootfs" -c . | "$DOCKER_CLI" -H "unix://$d/docker.sock" import - kc-busybox >/dev/null || {
		echo "start_dockerd: docker import failed" >&2
		return 1
	}
	export KC_TEST_DOCKER_URL=unix://$d/docker.sock
	export KC_TEST_DOCKER_IMAGE=kc-busybox
	export KC_TEST_DOCKER_CLI=$DOCKER_CLI
	echo "==> private dockerd pid $DOCKERD_PID on $KC_TEST_DOCKER_URL" >&2
}

stop_dockerd() {
	local d=$DOCKERD_DIR
	if [ -n "$DOCKERD_PID" ] && kill -0 "$DOCKERD_PID" 2>/dev/null; then
		echo "==> stopping private dockerd (pid $DOCKERD_PID)" >&2
		# Containers the tests left behind: killed, so dockerd's containerd
		# and its shims exit with it.
		local ids
		ids=$(timeout 10 "$DOCKER_CLI" -H "unix://$d/docker.sock" ps -q 2>/dev/null </dev/null || true)
		[ -z "$ids" ] || timeout 30 "$DOCKER_CLI" -H "unix://$d/docker.sock" rm -f $ids >/dev/null 2>&1 </dev/null || true
		kill -TERM "$DOCKERD_PID" 2>/dev/null || true
		for _ in $(seq 150); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$DOCKERD_PID" 2>/dev/null || true
		wait "$DOCKERD_PID" 2>/dev/null || true
	fi
	DOCKERD_PID=
	if [ -n "$d" ]; then
		# The vfs layers and any mounts left under the exec root.
		{ grep -o " $d/[^ ]*" /proc/self/mounts 2>/dev/null | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done; } || true
		rm -rf "$d" || true
	fi
	DOCKERD_DIR=
}
