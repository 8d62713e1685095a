package pgkill

import "github.com/kc-watchman/kc-watchman/internal/fingerprint"

// SetJoinerSeams installs the test seams of the search for joiners (nil
// leaves one unset) until restore is called. Kill runs them on its own
// goroutine.
func SetJoinerSeams(before func(round int), found func(round int, found []fingerprint.Stat)) (restore func()) {
	oldBefore, oldFound := beforeJoinerScan, joinersFound
	beforeJoinerScan, joinersFound = before, found
	return func() { beforeJoinerScan, joinersFound = oldBefore, oldFound }
}
