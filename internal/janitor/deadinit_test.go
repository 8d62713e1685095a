package janitor

import (
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/reconcile"
	"github.com/kc-watchman/kc-watchman/internal/testutil/docker"
)

// TestNameDeadInits: for a container whose init the kernel saw exit and
// which dockerd's list still calls running, the decision asks its
// inspect: "not running" takes it out of the live set; a running init
// (the one that died, or a restart's) is named for reconcile to judge;
// a failed inspect and a death the kernel did not see leave it as the
// list said, without asking. An inspect answered by a peer of another UID
// than docker's own list (another user's dockerd where the list's was) is
// not the engine's word and changes nothing, and docker is not asked
// about a container only another engine listed.
func TestNameDeadInits(t *testing.T) {
	id := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		name      string
		exited    int    // the PID the kernel saw exit; 0: not seen
		inspect   string // State of inspect's answer; "" fails it
		wantLive  bool
		wantPID   int
		wantAsked bool
		// otherUID: docker's list came from a UID the fake dockerd,
		// which answers as the test's, does not run as.
		otherUID bool
		// otherEngine: another engine's list called the container live,
		// not docker's.
		otherEngine bool
	}{
		{"inspect says not running", 4242, `{"Running":false,"Pid":0}`, false, 0, true, false, false},
		{"inspect names the dead init", 4242, `{"Running":true,"Pid":4242}`, true, 4242, true, false, false},
		{"inspect names a restart's init", 4242, `{"Running":true,"Pid":5151}`, true, 5151, true, false, false},
		{"inspect fails", 4242, "", true, 0, true, false, false},
		{"the kernel saw no death", 0, `{"Running":false,"Pid":0}`, true, 0, false, false, false},
		{"restarting: live without an init", 4242, `{"Running":true,"Restarting":true,"Pid":0}`, true, 0, true, false, false},
		{"an answer without a state", 4242, `{}`, true, 0, true, false, false},
		{"running with no init PID", 4242, `{"Running":true,"Pid":0}`, true, 0, true, false, false},
		{"inspect from a peer docker's list does not vouch for", 4242, `{"Running":false,"Pid":0}`, true, 0, true, true, false},
		{"a container docker did not list", 4242, `{"Running":false,"Pid":0}`, true, 0, false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var asked atomic.Bool
			u, _ := dockertest.Fake(t, func(w http.ResponseWriter, r *http.Request) {
				if !strings.HasSuffix(r.URL.Path, "/containers/"+id+"/json") {
					http.NotFound(w, r)
					return
				}
				asked.Store(true)
				if tc.inspect == "" {
					http.Error(w, "boom", http.StatusInternalServerError)
					return
				}
				fmt.Fprintf(w, `{"Id":%q,"State":%s}`, id, tc.inspect)
			})
			s := Settings{Engines: []string{"docker"}, Engine: engine.Config{DockerURL: u}}
			opt := reconcile.Options{InitExited: map[string]int{}}
			if tc.exited > 0 {
				opt.InitExited[id] = tc.exited
			}
			// The union vouches for the fake's UID whatever the case: only
			// docker's own answer may decide whose inspect counts.
			live := engine.Set{Live: map[string]bool{id: true}, UIDs: []int{os.Geteuid(), os.Geteuid() + 4321}}
			docker := engine.Answer{Engine: "docker", Endpoint: u, UID: os.Geteuid(), Containers: []engine.Container{{ID: id, Live: true}}}
			if tc.otherUID {
				docker.UID = os.Geteuid() + 4321
			}
			if tc.otherEngine {
				docker.Containers = nil
			}
			listed := live.Live
			s.nameDeadInits(t.Context(), opt, &live, []engine.Answer{docker}, slog.New(slog.DiscardHandler))
			if live.IsLive(id) != tc.wantLive || live.PIDs[id] != tc.wantPID || asked.Load() != tc.wantAsked {
				t.Errorf("live %v, pid %d, asked %v; want %v, %d, %v", live.IsLive(id), live.PIDs[id], asked.Load(), tc.wantLive, tc.wantPID, tc.wantAsked)
			}
			if !listed[id] {
				t.Error("the engine's own answer was changed")
			}
		})
	}
}

// TestDeathsOnly: the engines' answer, asked during the scan, is taken as
// it is only by a run whose every container has its time of death (the
// rule that spares a tree born after it stands in for asking again).
func TestDeathsOnly(t *testing.T) {
	a, b := strings.Repeat("a", 64), strings.Repeat("b", 64)
	now := time.Now()
	for _, tc := range []struct {
		name string
		opt  reconcile.Options
		want bool
	}{
		{"a round", reconcile.Options{}, false},
		{"--container", reconcile.Options{Containers: map[string]bool{a: true}}, false},
		{"one death", reconcile.Options{Containers: map[string]bool{a: true}, DiedAtByID: map[string]time.Time{a: now}}, true},
		{"a burst", reconcile.Options{Containers: map[string]bool{a: true, b: true}, DiedAtByID: map[string]time.Time{a: now, b: now}}, true},
		{"a burst with one undated", reconcile.Options{Containers: map[string]bool{a: true, b: true}, DiedAtByID: map[string]time.Time{a: now}}, false},
		{"one death time for all", reconcile.Options{Containers: map[string]bool{a: true, b: true}, DiedAt: now}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := deathsOnly(tc.opt); got != tc.want {
				t.Errorf("deathsOnly = %v, want %v", got, tc.want)
			}
		})
	}
}
