package engine

import (
	"errors"
	"slices"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/engine/peercred"
)

// ErrUnknown means an engine that had to be asked did not say which
// containers are alive. Callers must not act on any tree when they see it.
var ErrUnknown = errors.New("ground truth unknown")

// Source says where a Set came from.
type Source string

const (
	// SourceAPI: the engine's API service.
	SourceAPI Source = "api"
	// SourceCLI: the engine's CLI (`podman ps`), podman's fallback.
	SourceCLI Source = "cli"
)

// DefaultTimeout bounds one question to one engine when Config.Timeout
// is zero.
const DefaultTimeout = 10 * time.Second

// UIDUnknown is Set.UID when the endpoint's owner cannot be determined (a
// tcp URL): callers then have ground truth for no UID's trees.
const UIDUnknown = peercred.UIDUnknown

// Set is the engines' view of their containers at one moment: one
// engine's answer, or the Union of several.
type Set struct {
	// Source is where the answer came from: "api" or "cli".
	Source Source
	// Live holds the full (64 lowercase hex) IDs of the containers whose raw
	// state the engine counts as live. A container absent from Live is either
	// not live or unknown to the engines asked.
	Live map[string]bool
	// States maps every listed container's full ID to its engine's raw state
	// string ("running", "exited", ...), live or not.
	States map[string]string
	// Names maps a listed container's full ID to its names (without the
	// leading "/" Docker's API puts there), for resolving --container.
	Names map[string][]string
	// PIDs maps a listed container's full ID to its init process's host
	// PID when the engine said (0 or absent: not running, or not told).
	PIDs map[string]int
	// Pods maps a listed container's full ID to namespace/pod/container
	// when the kubelet made it (its CRI labels): reports and audit lines
	// name the pod an operator knows.
	Pods map[string]string
	// UID owns the engine that answered, and is the only UID whose trees this
	// Set is ground truth for: root's podman does not know a rootless user's
	// containers (and vice versa), so another UID's supervisor tree is not a
	// stray just because it is missing here. For a unix socket it is the
	// socket file's owner; for the plain CLI fallback it is this process's
	// effective UID (the UID podman picks its store by); UIDUnknown for tcp.
	UID int
	// UIDs, when not nil, replaces UID as the set of UIDs this Set is ground
	// truth for: the union of several engines' answers vouches for each
	// engine's UID (see Vouches).
	UIDs []int
	// ListedBy maps a listed container's full ID to the UIDs of the
	// answers listing it (Union); nil for a Set of one answer.
	ListedBy map[string][]int
	// Endpoint describes what was asked: the API URL, or the CLI command.
	Endpoint string
	// Took is how long the successful query took (the failed API attempt
	// before a CLI answer not included).
	Took time.Duration
}

// IsLive reports whether id is a live container in s.
func (s Set) IsLive(id string) bool { return s.Live[id] }

// ListedFor reports whether an answer that is ground truth for trees of
// uid lists id, live or not: a user's engine listing a container of
// root's (an exited one of his, by its ID) says nothing of it to root.
func (s Set) ListedFor(id string, uid int) bool {
	if s.ListedBy == nil {
		_, ok := s.States[id]
		return ok
	}
	return uid >= 0 && slices.Contains(s.ListedBy[id], uid)
}

// Vouches reports whether s is ground truth for trees of uid: the endpoint
// that answered runs as uid (or, for a union, one of them does).
func (s Set) Vouches(uid int) bool {
	if uid < 0 {
		return false
	}
	if s.UIDs != nil {
		for _, u := range s.UIDs {
			if u == uid {
				return true
			}
		}
		return false
	}
	return uid == s.UID
}

// The labels the kubelet puts on every container it creates through CRI;
// containerd and CRI runtimes keep them on the container.
const (
	LabelPodNamespace = "io.kubernetes.pod.namespace"
	LabelPodName      = "io.kubernetes.pod.name"
	LabelContainer    = "io.kubernetes.container.name"
)

// PodName is namespace/pod/container from a container's labels, or ""
// when the kubelet did not make it.
func PodName(labels map[string]string) string {
	ns, pod := labels[LabelPodNamespace], labels[LabelPodName]
	if ns == "" && pod == "" {
		return ""
	}
	return ns + "/" + pod + "/" + labels[LabelContainer]
}
