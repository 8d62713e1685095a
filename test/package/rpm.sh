#!/usr/bin/env bash
# Installs a kc-watchman .rpm with rpm into a throwaway root (its own
# database, so the host is never touched) and checks what rpm alone
# decides: the files land where the .deb puts them, the settings file is a
# config file, every directory of the package's own is owned by it, and
# an erase leaves none of it behind. The scriptlets are not run here:
# they are the .deb's maintainer scripts, which deb.sh runs, rpm's erase
# branch (postrm 0) included.
#
#   test/package/rpm.sh dist/kc-watchman-<version>-1.<arch>.rpm   (as root)
set -euo pipefail

pkg=${1:?usage: rpm.sh PACKAGE.rpm}
[ "$(id -u)" = 0 ] || { echo "rpm.sh: needs root (rpm --root)" >&2; exit 2; }
command -v rpm >/dev/null || { echo "rpm.sh: no rpm here: skipped" >&2; exit 0; }
pkg=$(realpath "$pkg")

root=$(mktemp -d "${TMPDIR:-/tmp}/kc-rpm-test.XXXXXX")
trap 'rm -rf "$root"' EXIT
fail() { echo "rpm.sh: FAIL: $*" >&2; exit 1; }
r() { rpm --root "$root" --dbpath /var/lib/rpm "$@"; }

r --initdb
r -i --nodeps --noscripts --nosignature "$pkg" || fail "rpm -i exited $?"
for f in /usr/bin/kc-janitor /usr/libexec/kc-watchman/kc-hook \
	/usr/share/containers/oci/hooks.d/kc-hook-poststop.json \
	/usr/share/containers/oci/hooks.d/kc-hook-createruntime.json \
	/usr/lib/systemd/system/kc-janitor.timer /usr/share/man/man8/kc-janitor.8 \
	/usr/share/kc-watchman/containerd/base-runtime-spec.json /etc/default/kc-janitor; do
	[ -f "$root$f" ] || fail "$f is not installed"
done
[ -x "$root/usr/libexec/kc-watchman/kc-hook" ] || fail "kc-hook is not executable"
r -qc kc-watchman | grep -xF /etc/default/kc-janitor >/dev/null || fail "/etc/default/kc-janitor is not a config file"
# rpm removes on erase only the directories a package owns.
own=$(cd "$root" && find . -path ./var -prune -o -type d -name 'kc-watchman*' -print | sed 's|^\.||')
[ -n "$own" ] || fail "no kc-watchman directory installed"
for d in $own; do
	r -qf "$d" >/dev/null || fail "$d is owned by no package: an erase would leave it"
done

r -e --nodeps --noscripts kc-watchman || fail "rpm -e exited $?"
left=$(cd "$root" && find . -path ./var -prune -o \( -type f -o -type l -o -name 'kc-*' \) -print)
[ -z "$left" ] || fail "left after the erase: $left"

echo "rpm.sh: ok: $(basename "$pkg") installs its files and config file, owns its directories, erases clean"
