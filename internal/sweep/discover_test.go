package sweep

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

func TestFlagValues(t *testing.T) {
	tests := []struct {
		argv []string
		want map[string]string
	}{
		{[]string{"kcserver", "--socket-dir", "/a", "--unix-socket=/b/c.sock"}, map[string]string{"--socket-dir": "/a", "--unix-socket": "/b/c.sock"}},
		{[]string{"kcserver", "--socket-dir=/a"}, map[string]string{"--socket-dir": "/a"}},
		{[]string{"kcserver", "--socket-dir"}, map[string]string{}},
		{[]string{"kcserver", "--socket-directory=/x", "--", "--socket-dir=/y"}, map[string]string{}},
		{[]string{"--socket-dir=/argv0-is-not-a-flag"}, map[string]string{}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.argv, " "), func(t *testing.T) {
			got := flagValues(tt.argv, socketFlags)
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// TestSweepLearnsHostDirs: with no directories given, sweep looks in the
// --socket-dir of a live kcserver's argv and in the XDG_RUNTIME_DIR and
// TMPDIR of its environment, and says so; a relative or globbing value is
// not followed.
func TestSweepLearnsHostDirs(t *testing.T) {
	// A comm of this test's own: discovery and the owner gate then see
	// only this test's supervisor.
	const comm = "kcsrv-discover"
	argvDir, xdg, tmp := shortTemp(t), shortTemp(t), shortTemp(t)
	k := testutil.StartKCServer(t, argvDir, testutil.Fake{Comm: comm, OpenChannels: true,
		Env: []string{"XDG_RUNTIME_DIR=" + xdg, "TMPDIR=" + tmp}})
	stale := []string{
		orphanSocket(t, argvDir, fmt.Sprintf("kc-%d.sock", deadPID(t))),
		orphanSocket(t, xdg, fmt.Sprintf("kc-%d.sock", deadPID(t))),
		orphanSocket(t, tmp, fmt.Sprintf("kc-%d.sock", deadPID(t))),
	}

	cfg := fastConfig()
	cfg.SupervisorComms = []string{comm}
	rep, err := Sweep(context.Background(), cfg) // a dry run: the host's own dirs are swept too
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*Socket{}
	for _, s := range rep.Sockets {
		got[s.Path] = s
	}
	if s := got[k.Socket]; s == nil || s.Verdict != VerdictLive {
		t.Errorf("the live kcserver's socket in its --socket-dir: %+v", s)
	}
	for _, p := range stale {
		if s := got[p]; s == nil || s.Verdict != VerdictStale || s.Action != ActionWouldUnlink {
			t.Errorf("%s: %+v, want stale (would-unlink)", p, s)
		}
	}
	who := fmt.Sprintf("%s %d ", comm, k.PID)
	for dir, src := range map[string]string{argvDir: who + "--socket-dir", xdg: who + "XDG_RUNTIME_DIR", tmp: who + "TMPDIR", "/tmp": "default"} {
		i := slices.IndexFunc(rep.Dirs, func(d Dir) bool { return d.Path == dir })
		if i < 0 || !slices.Contains(rep.Dirs[i].Sources, src) {
			t.Errorf("dirs lack %s from %q: %+v", dir, src, rep.Dirs)
		}
	}
}

func TestDiscoverSkipsRelativeAndGlobs(t *testing.T) {
	const comm = "kcsrv-disc-bad"
	k := testutil.StartKCServer(t, "", testutil.Fake{Comm: comm, Args: []string{"--unix-socket=" + shortTemp(t) + "/c.sock"},
		Env: []string{"XDG_RUNTIME_DIR=relative/dir", "TMPDIR=/tmp/*"}})
	found := discoverDirs(hostView("/proc"), Target{}, []string{comm})
	if len(found) != 1 || !strings.HasSuffix(k.Socket, "/c.sock") || found[0].Path+"/c.sock" != k.Socket {
		t.Errorf("found %+v, want only the --unix-socket's directory of %s", found, k.Socket)
	}
}

// shortTemp is a temporary directory with a short path (sun_path is 108
// bytes).
func shortTemp(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "kcd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}
