package reconcile

import (
	"cmp"
	"log/slog"
	"maps"

	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// staleLive returns live without the containers an engine still calls
// live although the kernel saw their init exit: the engine names, as the
// container's init, the very PID whose pinned pidfd became readable
// (Options.InitExited), and no running process holds that PID now. The
// engine's word is then about the process the kernel buried, and it has
// not caught up yet (podman's cleanup, dockerd's exit handling): waiting
// for it costs hundreds of milliseconds per death. A restarted container
// names a new init, or its init holds the PID again, running: both stay
// live. A container whose engine names no PID stays live too.
func staleLive(opt Options, log *slog.Logger, live engine.Set) engine.Set {
	var stale []string
	for id, pid := range opt.InitExited {
		if pid <= 0 || !live.IsLive(id) || live.PIDs[id] != pid || fingerprint.Running(cmp.Or(opt.Root, fingerprint.DefaultRoot), pid) {
			continue
		}
		stale = append(stale, id)
	}
	if len(stale) == 0 {
		return live
	}
	out := live
	out.Live = maps.Clone(live.Live)
	for _, id := range stale {
		delete(out.Live, id)
		log.Info("the engine still calls the container live, naming the init the kernel saw exit: taken as gone", "container", id, "init_pid", opt.InitExited[id], "state", live.States[id])
	}
	return out
}
