// Package containerid recognises container IDs: 64 lowercase hex
// characters, as podman, CRI-O and runc use them.
package containerid

import "strings"

// Len is the length of a full container ID.
const Len = 64

// Valid reports whether s is a full container ID. Anything else — short
// IDs, names, upper case, path separators — is rejected, which also makes a
// valid ID safe to use as a file name.
func Valid(s string) bool {
	if len(s) != Len {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Short is the ID as docker ps and podman ps print it: its first 12
// characters.
func Short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// FromArg returns the container ID token carried by one argv element: the
// whole element, or the value after the first '=' ("--container-id=<id>").
func FromArg(arg string) (string, bool) {
	if Valid(arg) {
		return arg, true
	}
	if i := strings.IndexByte(arg, '='); i >= 0 && Valid(arg[i+1:]) {
		return arg[i+1:], true
	}
	return "", false
}

// FromArgv returns the distinct container IDs carried by argv, in order of
// first appearance.
func FromArgv(argv []string) []string {
	var ids []string
	for _, a := range argv {
		id, ok := FromArg(a)
		if !ok {
			continue
		}
		dup := false
		for _, seen := range ids {
			if seen == id {
				dup = true
				break
			}
		}
		if !dup {
			ids = append(ids, id)
		}
	}
	return ids
}
