#!/usr/bin/env bash
# Installs a kc-watchman .deb with dpkg into a throwaway root (its own
# dpkg database, so the host's packages and hooks.d are never touched and
# a podman running beside the test does not start running the hook), then
# checks what DESIGN §15 promises of the package:
#   - kc-janitor doctor, run inside that root, finds the hook descriptors
#     and the packaged kc-hook they name;
#   - no systemd unit is enabled by the install (audit first);
#   - /etc/default/kc-janitor is a conffile: kept on remove, gone on purge;
#   - a removal is refused while a file in /etc still names its kc-hook;
#   - the maintainer scripts touch no systemd under dpkg --root; a purge
#     drops the links enabling the package's units and nothing else (an
#     operator's own unit of the same name stays enabled);
#   - run as on a live systemd host (a private /run), they start nothing
#     on install, restart a running watch on upgrade, stop the units on
#     removal and start the ones that ran when the package comes back;
#   - after the purge the root holds exactly what it held before.
#
#   test/package/deb.sh dist/kc-watchman_<version>_<arch>.deb   (as root)
set -euo pipefail

deb=${1:?usage: deb.sh PACKAGE.deb}
[ "$(id -u)" = 0 ] || { echo "deb.sh: needs root (dpkg --root, chroot)" >&2; exit 2; }
command -v dpkg >/dev/null || { echo "deb.sh: no dpkg here: skipped" >&2; exit 0; }
deb=$(realpath "$deb")

root=$(mktemp -d "${TMPDIR:-/tmp}/kc-deb-test.XXXXXX")
aside=$(mktemp -d "${TMPDIR:-/tmp}/kc-deb-test-aside.XXXXXX")
trap 'rm -rf "$root" "$aside"' EXIT
fail() { echo "deb.sh: FAIL: $*" >&2; exit 1; }
# A systemctl that only writes down how it was called: the scripts run on
# this host (--force-script-chrootless), and must not reach its systemd.
mkdir "$aside/bin"
# is-enabled fails for the units named in $aside/disabled.
cat >"$aside/bin/systemctl" <<SH
#!/bin/sh
echo "\$*" >>"$aside/calls"
[ "\$1" != is-enabled ] || ! grep -qxF "\$3" "$aside/disabled" 2>/dev/null
SH
chmod 755 "$aside/bin/systemctl"
: >"$aside/calls"
pkg() { PATH="$aside/bin:$PATH" dpkg --root="$root" --force-script-chrootless "$@" >"$aside/log" 2>&1 || { cat "$aside/log" >&2; fail "dpkg $*"; }; }
listing() { (cd "$root" && find . -path ./var/lib/dpkg -prune -o -print | sort); }

mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" "$root/etc" "$root/tmp"
touch "$root/var/lib/dpkg/status"
# A host's /etc is never empty; an empty one would go with the purge.
echo kc-deb-test >"$root/etc/hostname"
before=$(listing)

pkg -i "$deb"
name=$(dpkg-deb -f "$deb" Package)
# dpkg --root must have told the scripts (DPKG_ROOT) before they could
# reach this host's systemd or /var/lib.
[ ! -s "$aside/calls" ] || fail "the install's scripts under dpkg --root called systemctl: $(cat "$aside/calls")"

# doctor as an operator on that host runs it: the binary is static, so a
# chroot into the package's files is that host. Its exit status speaks of
# engines and state dirs a bare root lacks; the hook's checks are ours.
out=$(chroot "$root" /usr/bin/kc-janitor doctor --format json 2>/dev/null) || true
hook=$(printf '%s\n' "$out" | grep -A3 '"check": "hook-installed"') || fail "doctor has no hook-installed check: $out"
printf '%s\n' "$hook" | grep -q '"verdict": "ok"' || fail "doctor does not find the hook: $hook"
printf '%s\n' "$hook" | grep -q '/usr/share/containers/oci/hooks.d/kc-hook-poststop.json' || fail "doctor names no packaged descriptor: $hook"
printf '%s\n' "$hook" | grep -q '/usr/libexec/kc-watchman/kc-hook' || fail "doctor names no packaged kc-hook: $hook"
[ -x "$root/usr/libexec/kc-watchman/kc-hook" ] || fail "kc-hook not installed"
# containerd's base spec must name the packaged kc-hook: one naming a
# missing hook fails every container of its handler.
spec=$root/usr/share/kc-watchman/containerd/base-runtime-spec.json
[ "$(grep -c '"path": "/usr/libexec/kc-watchman/kc-hook"' "$spec")" = 2 ] && ! grep -q /usr/local/libexec "$spec" ||
	fail "the packaged base spec does not name the packaged kc-hook: $(grep '"path"' "$spec")"
chroot "$root" /usr/libexec/kc-watchman/kc-hook --version >/dev/null || fail "the packaged kc-hook does not run"

# Enabling a unit is a symlink under /etc/systemd; the package makes none.
if [ -e "$root/etc/systemd" ]; then
	fail "the install touched /etc/systemd: $(cd "$root" && find etc/systemd)"
fi
if command -v systemctl >/dev/null; then
	for u in kc-janitor.timer kc-janitor-watch.service kc-janitor.service; do
		state=$(systemctl --root="$root" is-enabled "$u" 2>/dev/null) || true
		case $state in enabled*) fail "$u is $state after the install" ;; esac
	done
fi

dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${Conffiles}\n' "$name" | grep -q '^ /etc/default/kc-janitor ' ||
	fail "/etc/default/kc-janitor is not a conffile"
echo 'KC_APPLY=1' >>"$root/etc/default/kc-janitor"
# What `systemctl enable` would make, beside a unit of another package
# and a file that is not a link.
wants=$root/etc/systemd/system/timers.target.wants
mkdir -p "$wants" "$root/etc/systemd/system/multi-user.target.wants"
ln -s /usr/lib/systemd/system/kc-janitor.timer "$wants/kc-janitor.timer"
ln -s /usr/lib/systemd/system/kc-janitor-container@.timer "$wants/kc-janitor-container@0123abcd.timer"
ln -s /usr/lib/systemd/system/kc-janitor-watch.service "$root/etc/systemd/system/multi-user.target.wants/kc-janitor-watch.service"
mkdir -p "$root/etc/systemd/user/default.target.wants"
ln -s /usr/lib/systemd/user/kc-janitor-watch.service "$root/etc/systemd/user/default.target.wants/kc-janitor-watch.service"
ln -s /usr/lib/systemd/system/other.timer "$wants/other.timer"
# Links of the package's names that enable another file, or climb out.
ln -s /usr/lib/systemd/system/other.timer "$root/etc/systemd/system/multi-user.target.wants/kc-janitor.timer"
ln -s /usr/lib/systemd/system/../../../../etc/kc.service "$root/etc/systemd/system/multi-user.target.wants/kc-janitor.service"
# An operator's own unit of the package's name, in /etc, and enabled.
own=$root/etc/systemd/system/graphical.target.wants/kc-janitor.service
mkdir -p "${own%/*}"
ln -s /etc/systemd/system/kc-janitor.service "$own"
echo 'not a link' >"$wants/kc-janitor.service"
# An operator's copy naming the packaged kc-hook (a descriptor in /etc,
# containerd's base spec) makes the removal refuse: runc would fail every
# container it applies to once the binary is gone.
# A link to the packaged base spec (relative here: dpkg --root) counts,
# and so does a user's own descriptor.
for copy in etc/containers/oci/hooks.d/kc-hook-poststop.json:usr/share/containers/oci/hooks.d/kc-hook-poststop.json \
	etc/containerd/kc-watchman-base-spec.json:usr/share/kc-watchman/containerd/base-runtime-spec.json \
	link:etc/containerd/kc-watchman-base-spec.json:../../usr/share/kc-watchman/containerd/base-runtime-spec.json \
	home/kc/.config/containers/oci/hooks.d/kc-hook-poststop.json:usr/share/containers/oci/hooks.d/kc-hook-poststop.json; do
	case $copy in
	link:*)
		copy=${copy#link:}
		mkdir -p "$root/$(dirname "${copy%%:*}")"
		ln -s "${copy#*:}" "$root/${copy%%:*}"
		;;
	*)
		mkdir -p "$root/$(dirname "${copy%%:*}")"
		cp "$root/${copy#*:}" "$root/${copy%%:*}"
		;;
	esac
	PATH="$aside/bin:$PATH" dpkg --root="$root" --force-script-chrootless -r "$name" >"$aside/log" 2>&1 &&
		fail "dpkg -r removed the package while ${copy%%:*} names its kc-hook"
	grep -q "not removed: these files still run /usr/libexec/kc-watchman/kc-hook" "$aside/log" && grep -qF "/${copy%%:*}" "$aside/log" ||
		fail "the refused removal does not say why: $(cat "$aside/log")"
	[ -x "$root/usr/libexec/kc-watchman/kc-hook" ] || fail "the refused removal deleted kc-hook"
	rm "$root/${copy%%:*}"
done
# What does not count: a link to the package's own descriptor (it
# dangles, and podman skips it), a backup no runtime reads.
mkdir -p "$root/etc/containers/oci/hooks.d"
ln -s ../../../../usr/share/containers/oci/hooks.d/kc-hook-poststop.json "$root/etc/containers/oci/hooks.d/kc-hook-poststop.json"
cp "$root/usr/share/containers/oci/hooks.d/kc-hook-poststop.json" "$root/etc/containers/oci/hooks.d/kc-hook-poststop.json.bak"
# Nor the shipped containerd snippet, merged: its comment names the
# packaged base spec, its setting the operator's copy.
mkdir -p "$root/etc/containerd"
cp "$root/usr/share/kc-watchman/containerd/config.toml" "$root/etc/containerd/config.toml"
pkg -r "$name"
rm -r "$root/etc/containers" "$root/etc/containerd" "$root/home"
grep -q '^KC_APPLY=1$' "$root/etc/default/kc-janitor" || fail "remove did not keep the edited /etc/default/kc-janitor"
[ -L "$wants/kc-janitor.timer" ] || fail "remove dropped the operator's enablement of kc-janitor.timer"
pkg -P "$name"
for gone in "$wants/kc-janitor.timer" "$wants/kc-janitor-container@0123abcd.timer" "$root/etc/systemd/system/multi-user.target.wants/kc-janitor-watch.service" \
	"$root/etc/systemd/user/default.target.wants/kc-janitor-watch.service"; do
	[ ! -L "$gone" ] || fail "the purge left ${gone#"$root"}"
done
[ -L "$wants/other.timer" ] && [ -f "$wants/kc-janitor.service" ] && [ ! -L "$wants/kc-janitor.service" ] ||
	fail "the purge removed what is not a kc-watchman unit's link: $(ls -l "$wants")"
[ -L "$own" ] || fail "the purge disabled the operator's own kc-janitor.service in /etc"
for kept in kc-janitor.timer kc-janitor.service; do
	[ -L "$root/etc/systemd/system/multi-user.target.wants/$kept" ] ||
		fail "the purge removed multi-user.target.wants/$kept, which enables no file of the package"
done
[ ! -s "$aside/calls" ] || fail "maintainer scripts under dpkg --root called systemctl: $(cat "$aside/calls")"
rm -r "$root/etc/systemd"

after=$(listing)
if [ "$before" != "$after" ]; then
	diff <(printf '%s\n' "$before") <(printf '%s\n' "$after") >&2 || true
	fail "the purge left files behind"
fi
# The scripts as on a live systemd host: a private /run holding
# /run/systemd/system, an empty /etc/systemd/system (not this host's
# enablements), $aside/varlib as /var/lib (where the prerm notes
# the units it stopped), the recording systemctl, no DPKG_ROOT. A purge
# is not run so: it would edit this host's /etc/systemd.
dpkg-deb -e "$deb" "$aside/control"
mkdir "$aside/varlib"
note=$aside/varlib/kc-watchman/stopped-units
live() {
	: >"$aside/calls"
	env -u DPKG_ROOT PATH="$aside/bin:$PATH" unshare -m sh -c 'mount -t tmpfs kc-deb-test /run && mkdir -p /run/systemd/system &&
		mount --bind "$0" /var/lib && { [ ! -d /etc/systemd/system ] || mount -t tmpfs kc-deb-test /etc/systemd/system; } && exec sh "$@"' "$aside/varlib" "$aside/control/$1" "${@:2}" ||
		fail "$* exited $?"
	tr '\n' ';' <"$aside/calls"
}
# dpkg's words and rpm's numbers (postrm purge and 0 are not run so: they
# would edit this host's /etc/systemd; 0 is run under DPKG_ROOT below),
# each with no note. The recording
# systemctl says every unit is active and enabled.
stop="stop kc-janitor.timer kc-janitor-container@*.timer kc-janitor-watch.service kc-janitor.service kc-janitor-container@*.service;"
noted="is-active --quiet kc-janitor.timer;is-active --quiet kc-janitor-watch.service;"
for tc in \
	"postinst configure|daemon-reload;" \
	"postinst configure 0.9.0|daemon-reload;try-restart kc-janitor-watch.service;" \
	"postinst 1|daemon-reload;" \
	"postinst 3|daemon-reload;try-restart kc-janitor-watch.service;" \
	"postinst abort-remove|daemon-reload;" \
	"prerm upgrade 1.0.0|" \
	"prerm 1|" \
	"prerm remove|$noted$stop" \
	"prerm 0|$noted$stop" \
	"postrm remove|daemon-reload;" \
	"postrm upgrade 1.0.0|daemon-reload;" \
	"postrm 1|daemon-reload;"; do
	args=${tc%%|*} want=${tc#*|}
	rm -f "$note"
	# shellcheck disable=SC2086 # the script's name and arguments
	got=$(live $args)
	[ "$got" = "$want" ] || fail "$args on a systemd host called systemctl as \"$got\", want \"$want\""
done

# dpkg -r, then the package again: what the removal stopped starts again,
# if still enabled, once.
rm -f "$note"
live prerm remove >/dev/null
[ "$(tr '\n' ';' <"$note")" = "kc-janitor.timer;kc-janitor-watch.service;" ] || fail "prerm remove noted \"$(cat "$note")\""
[ "$(stat -c %a "$aside/varlib/kc-watchman")" = 700 ] || fail "the note's directory is not 0700"
echo kc-janitor-watch.service >"$aside/disabled"
got=$(live postinst configure 1.0.0)
want="daemon-reload;try-restart kc-janitor-watch.service;is-enabled --quiet kc-janitor.timer;start kc-janitor.timer;is-enabled --quiet kc-janitor-watch.service;"
[ "$got" = "$want" ] || fail "a reinstall after dpkg -r called systemctl as \"$got\", want \"$want\""
[ ! -e "$note" ] || fail "the reinstall kept the note"
got=$(live postinst configure 1.0.0)
[ "$got" = "daemon-reload;try-restart kc-janitor-watch.service;" ] || fail "a second configure called systemctl as \"$got\""
# A note starts only the janitor's own units, whatever else it holds.
: >"$aside/disabled"
printf '%s\n' sshd.service 'kc-janitor.timer;x' ../kc-janitor.timer kc-janitor-container@ab12.timer >"$note"
got=$(live postinst abort-remove)
want="daemon-reload;is-enabled --quiet kc-janitor-container@ab12.timer;start kc-janitor-container@ab12.timer;"
[ "$got" = "$want" ] || fail "abort-remove with a foreign note called systemctl as \"$got\", want \"$want\""

# rpm's erase (postrm 0) drops what dpkg's purge does, and only that; run
# under DPKG_ROOT, its links are the throwaway root's.
wants=$root/etc/systemd/system/timers.target.wants
mkdir -p "$wants"
ln -s /usr/lib/systemd/system/kc-janitor.timer "$wants/kc-janitor.timer"
ln -s /etc/systemd/system/kc-janitor.service "$wants/kc-janitor.service"
: >"$aside/calls"
DPKG_ROOT=$root PATH="$aside/bin:$PATH" sh "$aside/control/postrm" 0 || fail "postrm 0 exited $?"
[ ! -L "$wants/kc-janitor.timer" ] || fail "rpm's erase (postrm 0) left the link enabling kc-janitor.timer"
[ -L "$wants/kc-janitor.service" ] || fail "rpm's erase (postrm 0) disabled the operator's own kc-janitor.service"
[ ! -s "$aside/calls" ] || fail "postrm 0 under DPKG_ROOT called systemctl: $(cat "$aside/calls")"
rm -r "$root/etc/systemd"

echo "deb.sh: ok: $(basename "$deb") installs, is found by doctor, enables nothing, stops its units on removal and starts them on a reinstall, purges clean"
