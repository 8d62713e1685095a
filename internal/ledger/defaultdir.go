package ledger

import (
	"path/filepath"
	"strconv"
)

// RootStateDir is the state dir of root's hook and janitor.
const RootStateDir = "/run/kc-watchman"

// DefaultDir is the state dir the hook and the janitor use when none is
// given, for a process whose host UID is hostUID. An ordinary user (a
// rootless podman's hook runs as one, whatever its namespace UID) cannot
// write root's /run/kc-watchman, so each keeps a ledger in the runtime dir
// systemd-logind gives them (XDG_RUNTIME_DIR, which a hook's empty
// environment does not carry).
func DefaultDir(hostUID int) string {
	if hostUID == 0 {
		return RootStateDir
	}
	return filepath.Join(UserRuntimeDir(hostUID), "kc-watchman")
}

// UserRuntimeDir is /run/user/<uid>, the runtime dir logind creates for a
// user's sessions.
func UserRuntimeDir(hostUID int) string {
	return "/run/user/" + strconv.Itoa(hostUID)
}
