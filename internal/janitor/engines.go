package janitor

// The built-in engines register themselves with package engine when
// linked; Select and Detect (--engine auto) find them there. Linking them
// here, where engines are selected, keeps package engine free of its
// clients and kc-hook free of all of them.
import (
	_ "github.com/kc-watchman/kc-watchman/internal/engine/containerd"
	_ "github.com/kc-watchman/kc-watchman/internal/engine/cri"
	_ "github.com/kc-watchman/kc-watchman/internal/engine/docker"
	_ "github.com/kc-watchman/kc-watchman/internal/engine/podman"
)
