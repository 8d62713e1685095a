package reconcile

import (
	"log/slog"
	"os"
	"os/exec"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/engine"
)

// TestStaleLive: a container the engine still calls live is taken as gone
// only when the engine names, as its init, the PID the kernel saw exit and
// no running process holds that PID; a restart (another PID, or the PID
// running again), an engine that names none and a death not seen by the
// kernel leave it live.
func TestStaleLive(t *testing.T) {
	exited := exec.Command("true")
	if err := exited.Run(); err != nil {
		t.Fatal(err)
	}
	dead, self := exited.Process.Pid, os.Getpid()
	const id = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	for _, tc := range []struct {
		name     string
		exitedAt int // the PID the kernel saw exit; 0: not seen by it
		named    int // the engine's init PID
		live     bool
	}{
		{"the engine names the init the kernel buried", dead, dead, false},
		{"the engine names another init: restarted", dead, self, true},
		{"the PID is held by a running process again", self, self, true},
		{"the engine names no init", dead, 0, true},
		{"the death was the engine's word only", 0, dead, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set := engine.Set{Live: map[string]bool{id: true}, PIDs: map[string]int{}}
			if tc.named > 0 {
				set.PIDs[id] = tc.named
			}
			opt := Options{InitExited: map[string]int{}}
			if tc.exitedAt > 0 {
				opt.InitExited[id] = tc.exitedAt
			}
			got := staleLive(opt, slog.New(slog.DiscardHandler), set)
			if got.IsLive(id) != tc.live {
				t.Errorf("live = %v, want %v", got.IsLive(id), tc.live)
			}
			if !set.IsLive(id) {
				t.Error("the engine's own answer was changed")
			}
		})
	}
}
