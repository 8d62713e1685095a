package reconcile

import (
	"encoding/json"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/trees"
)

// IDs of this package's own: trees' tests start real trees with other
// packages' IDs at the same time, and the supervise wrapper counts as a
// supervisor whatever the comm, so a shared ID would make their trees ours.
const (
	cidLive = "7e57113e7e57113e7e57113e7e57113e7e57113e7e57113e7e57113e7e57113e"
	cidGone = "7e579013e7e579013e7e579013e7e579013e7e579013e7e579013e7e579013e7"
)

func TestDecide(t *testing.T) {
	live := engine.Set{Source: engine.SourceAPI, Live: map[string]bool{cidLive: true}, UID: 0}
	stray := trees.Tree{ContainerID: cidGone, UID: 0, AgeKnown: true, Age: time.Hour, Members: make([]fingerprint.Identity, 1)}
	with := func(f func(*trees.Tree)) trees.Tree { t := stray; f(&t); return t }
	tests := []struct {
		name string
		tree trees.Tree
		want action.Action
	}{
		{"stray", stray, action.WouldReap},
		{"exactly min age is old enough", with(func(t *trees.Tree) { t.Age = 90 * time.Second }), action.WouldReap},
		{"live container", with(func(t *trees.Tree) { t.ContainerID = cidLive }), action.SkipLive},
		{"young", with(func(t *trees.Tree) { t.Age = 89 * time.Second }), action.SkipYoung},
		{"age unknown", with(func(t *trees.Tree) { t.AgeKnown = false }), action.SkipAgeUnknown},
		{"foreign", with(func(t *trees.Tree) { t.Foreign = true }), action.SkipForeign},
		{"ambiguous", with(func(t *trees.Tree) { t.Ambiguous = true; t.ContainerID = "" }), action.SkipAmbiguous},
		{"other uid", with(func(t *trees.Tree) { t.UID = 1000 }), action.SkipOtherUID},
		{"mixed uids", with(func(t *trees.Tree) { t.UID = -1 }), action.SkipOtherUID},
		{"foreign beats live", with(func(t *trees.Tree) { t.Foreign = true; t.ContainerID = cidLive }), action.SkipForeign},
		{"live beats young", with(func(t *trees.Tree) { t.ContainerID = cidLive; t.Age = 0 }), action.SkipLive},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Decide(tt.tree, live, 90*time.Second); got != tt.want {
				t.Errorf("Decide = %q, want %q", got, tt.want)
			}
		})
	}
	t.Run("ground truth for another uid", func(t *testing.T) {
		rootless := live
		rootless.UID = 1000
		if got := Decide(stray, rootless, 90*time.Second); got != action.SkipOtherUID {
			t.Errorf("Decide = %q, want %q", got, action.SkipOtherUID)
		}
	})
}

// TestReportJSONShape pins the outside contract of DESIGN "The outside".
func TestReportJSONShape(t *testing.T) {
	msg := "boom"
	rep := Report{LivenessKnown: true, Source: "api", DryRun: true, Trees: []Tree{{
		ContainerID: cidGone, PGID: 10, UID: 0, AgeSeconds: 100,
		Members: []Member{{PID: 10, StartTicks: 5, Comm: "kcserver"}}, Action: action.WouldNotDie, Error: &msg,
	}, {ContainerID: cidLive, PGID: 11, Members: []Member{}, Action: action.SkipLive}}}
	data, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	keys := func(m map[string]any) []string {
		var ks []string
		for k := range m {
			ks = append(ks, k)
		}
		sort.Strings(ks)
		return ks
	}
	if k := keys(got); !reflect.DeepEqual(k, []string{"dry_run", "ledger_collected", "liveness_known", "source", "trees"}) {
		t.Errorf("top-level keys %v", k)
	}
	tr := got["trees"].([]any)
	first := tr[0].(map[string]any)
	if k := keys(first); !reflect.DeepEqual(k, []string{"action", "age_seconds", "container_id", "error", "members", "pgid", "uid"}) {
		t.Errorf("tree keys %v", k)
	}
	if k := keys(first["members"].([]any)[0].(map[string]any)); !reflect.DeepEqual(k, []string{"comm", "escaped", "pid", "start_ticks"}) {
		t.Errorf("member keys %v", k)
	}
	if first["error"] != "boom" || tr[1].(map[string]any)["error"] != nil {
		t.Errorf("error fields: %v, %v", first["error"], tr[1].(map[string]any)["error"])
	}
}
