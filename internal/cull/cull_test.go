package cull

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/kallichore"
	"github.com/kc-watchman/kc-watchman/internal/sockets"
	"github.com/kc-watchman/kc-watchman/internal/sweep"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

func TestIsCandidate(t *testing.T) {
	const day = 86400
	tests := []struct {
		name      string
		connected bool
		status    string
		idle      int64
		want      bool
	}{
		{"idle, disconnected, over threshold", false, "idle", day + 1, true},
		{"exactly at threshold", false, "idle", day, false},
		{"one second under", false, "idle", day - 1, false},
		{"connected", true, "idle", day * 10, false},
		{"busy", false, "busy", day * 10, false},
		{"ready is not idle", false, "ready", day * 10, false},
		{"starting", false, "starting", day * 10, false},
		{"exited", false, "exited", day * 10, false},
		{"offline", false, "offline", day * 10, false},
		{"status case matters", false, "Idle", day * 10, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := kallichore.ActiveSession{SessionID: "s", Connected: tt.connected, Status: tt.status, IdleSeconds: tt.idle}
			if got := IsCandidate(s, day); got != tt.want {
				t.Errorf("IsCandidate = %v, want %v", got, tt.want)
			}
		})
	}
	if !IsCandidate(kallichore.ActiveSession{Status: "idle", IdleSeconds: 1}, 0) {
		t.Error("threshold 0: any idle second counts")
	}
}

func TestParseIdle(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr bool
	}{
		{"86400", 86400, false},
		{"0", 0, false},
		{"24h", 86400, false},
		{"90m", 5400, false},
		{"1.5s", 1, false},
		{" 3600 ", 3600, false},
		{"-1", 0, true},
		{"-1h", 0, true},
		{"", 0, true},
		{"a day", 0, true},
	}
	for _, tt := range tests {
		got, err := ParseIdle(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseIdle(%q) = %d, %v; want %d, err %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

type sess struct {
	ID        string `json:"session_id"`
	Language  string `json:"language"`
	Status    string `json:"status"`
	Connected bool   `json:"connected"`
	Idle      int64  `json:"idle_seconds"`
	WD        string `json:"working_directory"`
	// Argv is what a supervisor says at length and the audit does not
	// report.
	Argv  []string `json:"argv,omitempty"`
	Usage *struct {
		Mem int64 `json:"memory_bytes"`
	} `json:"resource_usage,omitempty"`
}

func mem(n int64) *struct {
	Mem int64 `json:"memory_bytes"`
} {
	return &struct {
		Mem int64 `json:"memory_bytes"`
	}{n}
}

func sessionsFile(t *testing.T, ss ...sess) string {
	t.Helper()
	if ss == nil {
		ss = []sess{}
	}
	data, err := json.Marshal(ss)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "sessions.json")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestAudit(t *testing.T) {
	dir := t.TempDir()
	a := testutil.StartKCServer(t, dir, testutil.Fake{Sessions: sessionsFile(t,
		sess{ID: "py-old", Language: "python", Status: "idle", Idle: 90000, WD: "/home/a", Argv: []string{"python3", "-m", "ipykernel"}, Usage: mem(100)},
		sess{ID: "py-edge", Language: "python", Status: "idle", Idle: 86400, Usage: mem(20)},
		sess{ID: "r-conn", Language: "r", Status: "idle", Connected: true, Idle: 99999, Usage: mem(3)},
		sess{ID: "r-busy", Language: "r", Status: "busy", Idle: 0},
	)})
	b := testutil.StartKCServer(t, dir, testutil.Fake{Sessions: sessionsFile(t)})
	hung := testutil.StartKCServer(t, dir, testutil.Fake{Hang: true})
	orphan := filepath.Join(dir, "kc-1.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: orphan, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()

	srcs := []Source{{Socket: a.Socket, PID: a.PID}, {Socket: b.Socket, PID: b.PID}, {Socket: hung.Socket, PID: hung.PID}, {Socket: orphan, PID: 1}}
	c := &kallichore.Client{Timeout: 300 * time.Millisecond}
	got := Audit(context.Background(), c, srcs, 86400, 2)
	if len(got) != 4 {
		t.Fatalf("%d results", len(got))
	}
	if s := got[0]; s.Err != nil || s.SessionsTotal != 4 || s.MemoryBytes != 123 || len(s.Candidates) != 1 ||
		s.Candidates[0].SessionID != "py-old" || s.Candidates[0].WorkingDirectory != "/home/a" || s.Candidates[0].MemoryBytes() != 100 ||
		s.Candidates[0].Argv != nil {
		t.Errorf("a: %+v", s)
	}
	if s := got[1]; s.Err != nil || s.SessionsTotal != 0 || s.MemoryBytes != 0 || len(s.Candidates) != 0 {
		t.Errorf("b: %+v", s)
	}
	if s := got[2]; !kallichore.IsTimeout(s.Err) {
		t.Errorf("hung: %+v", s)
	}
	if s := got[3]; !kallichore.IsRefused(s.Err) || !strings.Contains(s.Err.Error(), orphan) {
		t.Errorf("orphan: %+v, want refused, naming its path", s)
	}
	for i, s := range got {
		if s.Socket != srcs[i].Socket || s.PID != srcs[i].PID {
			t.Errorf("result %d is for %s, want %s", i, s.Socket, srcs[i].Socket)
		}
	}
}

// TestAuditBoundsWhatItLists: supervisors (anyone can run one) listing
// many idle sessions have at most maxListed each, an equal share of
// maxListedAll, listed, their working directories clipped; the rest are
// counted, with their memory.
func TestAuditBoundsWhatItLists(t *testing.T) {
	const sups, each = 9, maxListed + 6
	long := "/home/" + strings.Repeat("d", 1500)
	ss := make([]sess, each)
	for i := range ss {
		ss[i] = sess{ID: fmt.Sprintf("s%d", i), Language: "python", Status: "idle", Idle: 90000, WD: long, Usage: mem(1)}
	}
	file := sessionsFile(t, ss...)
	dir := t.TempDir()
	var srcs []Source
	for range sups {
		k := testutil.StartKCServer(t, dir, testutil.Fake{Sessions: file})
		srcs = append(srcs, Source{Socket: k.Socket, PID: k.PID})
	}
	got := Audit(context.Background(), &kallichore.Client{Timeout: 10 * time.Second}, srcs, 86400, 2)
	listed, unlisted, unlistedMem := 0, 0, int64(0)
	for _, s := range got {
		if s.Err != nil || len(s.Candidates) > maxListed || len(s.Candidates)+s.Unlisted != each {
			t.Fatalf("%s: %d listed, %d not, err %v; want at most %d listed, %d in all", s.Socket, len(s.Candidates), s.Unlisted, s.Err, maxListed, each)
		}
		for _, c := range s.Candidates {
			if len(c.WorkingDirectory) > maxShownPath+len("…") || !strings.HasPrefix(long, strings.TrimSuffix(c.WorkingDirectory, "…")) {
				t.Fatalf("working directory of %d bytes listed, want at most %d", len(c.WorkingDirectory), maxShownPath)
			}
		}
		listed += len(s.Candidates)
		unlisted += s.Unlisted
		unlistedMem += s.UnlistedMemoryBytes
	}
	share := maxListedAll / sups
	if listed != sups*share || unlisted != sups*each-listed || unlistedMem != int64(unlisted) {
		t.Errorf("%d listed, %d unlisted holding %d bytes; want %d each listed, the rest counted", listed, unlisted, unlistedMem, share)
	}
	for _, s := range got {
		if len(s.Candidates) != share {
			t.Errorf("%s: %d listed, want its share %d", s.Socket, len(s.Candidates), share)
		}
	}
	var text strings.Builder
	if err := WriteText(&text, 86400, got); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%d sessions idle", sups*each); !strings.Contains(text.String(), want) {
		t.Errorf("text report's totals lack %q", want)
	}
}

// TestAuditStopsAtTheDeadline: supervisors that stall every request to
// the client's timeout cannot make an audit outlast its context; the
// sources whose turn had not come when it ended are reported not
// audited, in their places.
func TestAuditStopsAtTheDeadline(t *testing.T) {
	dir := t.TempDir()
	var srcs []Source
	for range 6 {
		h := testutil.StartKCServer(t, dir, testutil.Fake{Hang: true})
		srcs = append(srcs, Source{Socket: h.Socket, PID: h.PID})
	}
	c := &kallichore.Client{Timeout: 30 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	got := Audit(ctx, c, srcs, 86400, 2)
	// One worker's timeout alone is 30 s: an audit that waited for any
	// would take that long, six of them, three rounds.
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the audit took %v past a 300ms deadline", took)
	}
	notAudited := 0
	for i, s := range got {
		if s.Socket != srcs[i].Socket || s.Err == nil {
			t.Errorf("result %d: %+v", i, s)
		}
		if errors.Is(s.Err, ErrNotAudited) {
			notAudited++
		}
	}
	if notAudited < len(srcs)-2 {
		t.Errorf("%d of %d sources reported not audited, want all but the first two workers'", notAudited, len(srcs))
	}
}

// TestAuditPinsTheSocket: between the sweep that found two live
// supervisors and the audit, a user put unserved FUSE mounts of his
// (allow_other, default_permissions: any look inside asks the server,
// which never answers) over the first one's socket directory, and over
// the second one's socket name (its server still running). The first is
// audited through the directory the sweep holds open, as if nothing had
// been mounted; the second is refused as changed. Sockets named by path
// under such mounts are refused too. Nothing waits on a mount.
func TestAuditPinsTheSocket(t *testing.T) {
	const opts = "allow_other,default_permissions"
	base := testutil.OpenTempDir(t, "kccull", 0o755)
	under, over := filepath.Join(base, "under"), filepath.Join(base, "over")
	for _, d := range []string{under, over} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	a := testutil.StartKCServer(t, under, testutil.Fake{Sessions: sessionsFile(t, sess{ID: "py", Language: "python", Status: "idle", Idle: 5})})
	b := testutil.StartKCServer(t, over, testutil.Fake{Sessions: sessionsFile(t)})
	rep, err := sweep.Sweep(context.Background(), sweep.Config{Dirs: []string{under, over}, KeepDirs: true, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Close()
	srcs := Sources(rep.Sockets, nil)
	if len(srcs) != 2 {
		t.Fatalf("the sweep found %d live supervisors, want 2: %+v", len(srcs), rep.Sockets)
	}

	testutil.MountFUSE(t, base, "under", opts)
	if err := os.Remove(b.Socket); err != nil {
		t.Fatal(err)
	}
	testutil.MountFUSE(t, over, filepath.Base(b.Socket), opts)
	srcs = append(srcs, Source{Socket: a.Socket, PID: a.PID}, Source{Socket: b.Socket, PID: b.PID})

	got := testutil.Within(t, 20*time.Second, "the audit", func() []Supervisor {
		return Audit(context.Background(), &kallichore.Client{Timeout: 2 * time.Second}, srcs, 86400, 1)
	})
	if len(got) != 4 {
		t.Fatalf("%d results for 4 sources", len(got))
	}
	byPID := map[int]Supervisor{}
	for _, s := range got[:2] {
		byPID[s.PID] = s
	}
	if s := byPID[a.PID]; s.Err != nil || s.SessionsTotal != 1 {
		t.Errorf("the supervisor under the mount: %+v, want its one session read through the sweep's directory", s)
	}
	if s := byPID[b.PID]; !errors.Is(s.Err, sockets.ErrChanged) {
		t.Errorf("the supervisor whose socket name is a mount now: %v, want changed", s.Err)
	}
	for _, s := range got[2:] {
		if s.Err == nil || !strings.Contains(s.Err.Error(), "FUSE mount") {
			t.Errorf("%s named by path: %v, want refused, on a user's FUSE mount", s.Socket, s.Err)
		}
	}
}
