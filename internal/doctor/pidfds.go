package doctor

import "strings"

// Pidfds reports how many live containers watch would follow through
// their init's pidfd (their deaths seen at once) and how many by the
// engines' events and relists, with why (DESIGN "Engines"). That is not a
// fault: the death still comes, later (podman's file events: up to
// 250 ms; an engine without events: the next relist, within 5 s).
func Pidfds(pinnable, eventsOnly int, why []string) Check {
	if eventsOnly == 0 {
		return newCheck(NamePidfds, OK, "%s pinnable by watch", plural(pinnable, "live container", "live containers"))
	}
	return newCheck(NamePidfds, OK, "%s pinnable by watch, %d followed by events and relists: %s",
		plural(pinnable, "live container", "live containers"), eventsOnly, strings.Join(why, "; "))
}

// PidfdsUnknown is Pidfds when the engines could not be asked (or the
// host not scanned): no count is a verified one.
func PidfdsUnknown(why string) Check {
	return newCheck(NamePidfds, Warn, "cannot tell how many live containers watch would pin: %s", why)
}
