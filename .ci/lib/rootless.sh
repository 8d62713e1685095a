# shellcheck shell=bash
# A throwaway ordinary user for the rootless podman tests (issue 20):
# subordinate UID/GID ranges, /run/user/<uid> (there is no logind session
# to create it), and a per-user podman setup as such a user would write it:
# runc (crun fails here), vfs storage, cgroupfs, a file events log, the
# rlimits internal/testutil/podman sets and a hooks_dir of their own. Containers need
# `--network none`: /dev/net/tun is root-only here, so slirp4netns cannot
# run.
#
#   . .ci/lib/rootless.sh; start_rootless; ...; stop_rootless
#
# start_rootless exports KC_TEST_ROOTLESS_USER. stop_rootless kills the
# user's processes (podman's pause process, conmon, API services) one PID
# at a time, then removes the user, its home and its runtime dir. Needs
# root, useradd/userdel and uidmap (newuidmap).

ROOTLESS_USER=
ROOTLESS_UID=

rootless_log() { printf '==> rootless: %s\n' "$*" >&2; }

# rootless_free_range prints the first 65536-ID range at or above 200000
# that no entry of the file overlaps.
rootless_free_range() {
	local file=$1 start=200000 s c moved=1
	while [ "$moved" = 1 ]; do
		moved=0
		while IFS=: read -r _ s c; do
			[ -n "$s" ] && [ -n "$c" ] || continue
			if [ "$start" -lt $((s + c)) ] && [ $((start + 65536)) -gt "$s" ]; then
				start=$((s + c))
				moved=1
			fi
		done <"$file"
	done
	echo "$start"
}

start_rootless() {
	command -v newuidmap >/dev/null || { rootless_log "newuidmap missing (apt-get install uidmap)"; return 1; }
	# Called as `start_rootless || die`, where errexit is off: every step
	# that later ones build on says so itself. The user is ours to remove
	# (stop_rootless) only once useradd made it: a name that exists is
	# someone else's.
	local name=kcrl$$ uid home gid
	useradd --create-home --shell /bin/sh --no-user-group --gid nogroup "$name" || return 1
	ROOTLESS_USER=$name
	uid=$(id -u "$name") && [ -n "$uid" ] && [ "$uid" -gt 0 ] || return 1
	ROOTLESS_UID=$uid
	home=$(getent passwd "$ROOTLESS_USER" | cut -d: -f6) && [ -n "$home" ] || return 1
	gid=$(id -g "$ROOTLESS_USER") || return 1
	touch /etc/subuid /etc/subgid
	# Debian's useradd adds ranges itself; add them where it did not.
	grep -q "^$ROOTLESS_USER:" /etc/subuid || usermod --add-subuids "$(rootless_free_range /etc/subuid)-$(($(rootless_free_range /etc/subuid) + 65535))" "$ROOTLESS_USER"
	grep -q "^$ROOTLESS_USER:" /etc/subgid || usermod --add-subgids "$(rootless_free_range /etc/subgid)-$(($(rootless_free_range /etc/subgid) + 65535))" "$ROOTLESS_USER"

	install -d -m 0700 -o "$ROOTLESS_UID" -g "$gid" "/run/user/$ROOTLESS_UID" || return 1
	install -d -m 0700 -o "$ROOTLESS_UID" -g "$gid" "$home/.config" "$home/.config/containers" "$home/.config/containers/oci" "$home/.config/containers/oci/hooks.d" || return 1
	cat >"$home/.config/containers/containers.conf" <<CONF
# Written by .ci/lib/rootless.sh for a throwaway test user.
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
netns = "none"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
hooks_dir = ["$home/.config/containers/oci/hooks.d"]
CONF
	cat >"$home/.config/containers/storage.conf" <<CONF
[storage]
driver = "vfs"
CONF
	chown "$ROOTLESS_UID:$gid" "$home/.config/containers/containers.conf" "$home/.config/containers/storage.conf" || return 1
	export KC_TEST_ROOTLESS_USER=$ROOTLESS_USER
	rootless_log "user $ROOTLESS_USER (uid $ROOTLESS_UID), subuid $(grep "^$ROOTLESS_USER:" /etc/subuid | cut -d: -f2-)"
}

# rootless_pids prints the PIDs of the user's processes (real UID).
rootless_pids() {
	local d uid
	for d in /proc/[0-9]*; do
		uid=$(awk '/^Uid:/ {print $2; exit}' "$d/status" 2>/dev/null) || continue
		[ "$uid" = "$ROOTLESS_UID" ] && echo "${d#/proc/}"
	done
}

stop_rootless() {
	[ -n "$ROOTLESS_USER" ] || return 0
	local pid _
	if [ -z "$ROOTLESS_UID" ]; then
		# useradd made the user but its UID was never known: nothing to
		# kill or remove under /run/user by it.
		userdel --remove "$ROOTLESS_USER" 2>/dev/null || true
		ROOTLESS_USER=
		return 0
	fi
	for pid in $(rootless_pids); do kill -TERM "$pid" 2>/dev/null || true; done
	for _ in $(seq 50); do [ -z "$(rootless_pids)" ] && break; sleep 0.1; done
	for pid in $(rootless_pids); do kill -KILL "$pid" 2>/dev/null || true; done
	for _ in $(seq 50); do [ -z "$(rootless_pids)" ] && break; sleep 0.1; done
	# vfs leaves no mounts; anything below the home or runtime dir goes.
	rm -rf "/run/user/${ROOTLESS_UID:?}"
	userdel --remove "$ROOTLESS_USER" 2>/dev/null || userdel "$ROOTLESS_USER" || true
	sed -i "/^$ROOTLESS_USER:/d" /etc/subuid /etc/subgid
	rootless_log "removed user $ROOTLESS_USER"
	ROOTLESS_USER= ROOTLESS_UID=
	unset KC_TEST_ROOTLESS_USER
}
