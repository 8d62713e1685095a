package main

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/ledger"
)

// TestStatus: podman unreachable, a ledger with one record, one orphan
// socket: status shows all three, exits 0, and writes nothing.
func TestStatus(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	st, err := ledger.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	id := strings.Repeat("5", 64)
	if err := st.Update(id, func(r *ledger.Record) error {
		r.Stages = map[string]time.Time{"createRuntime": time.Now().Add(-time.Hour), "poststop": time.Now()}
		r.Outcome = "reaped"
		r.Trees = []ledger.Tree{{PGID: 77, Members: []ledger.Process{{PID: 77}, {PID: 78}}}}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	socks := t.TempDir()
	sock := orphanSock(t, socks, goneSockName(t))
	t.Setenv("PATH", t.TempDir())
	base := []string{"status", "--state-dir", state, "--socket-dir", socks, "--podman-url", "unix:///nonexistent/podman.sock",
		"--container", id} // only this test's records and trees

	code, out := runJanitorCapture(t, append(base, "--format", "json")...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, out)
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got := sortedKeys(raw); !reflect.DeepEqual(got, []string{"errors", "liveness_known", "records", "sockets", "source", "state_dir", "trees"}) {
		t.Errorf("keys %v", got)
	}
	var rep statusJSON
	json.Unmarshal([]byte(out), &rep)
	if rep.LivenessKnown || len(rep.Records) != 1 || len(rep.Sockets) != 1 || len(rep.Errors) == 0 {
		t.Fatalf("%+v", rep)
	}
	r := rep.Records[0]
	if r.ContainerID != id || !r.CurrentBoot || r.Outcome != "reaped" || r.Trees != 1 || r.Members != 2 || len(r.Stages) != 2 || r.ContainerNow != "?" {
		t.Errorf("record %+v", r)
	}
	if s := rep.Sockets[0]; s.Path != sock || s.Verdict != "stale" || s.Action != "would-unlink" {
		t.Errorf("socket %+v", s)
	}

	code, out = runJanitorCapture(t, base...)
	if code != exitOK {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"LEDGER " + state + ": 1 record", id[:12], "createRuntime,poststop", "reaped",
		"TREES (ground truth unknown: podman was asked and did not answer, see PROBLEMS)", "SOCKETS: 1 socket", sock, "stale", "PROBLEMS"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	if r2, _ := st.Load(id); !r2.UpdatedAt.Equal(r.UpdatedAt) {
		t.Error("status wrote the ledger")
	}
}
