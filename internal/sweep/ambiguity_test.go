package sweep

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// TestSweepPIDNameDisagreeingWithStatus: a kc-<pid>.sock whose PID check
// and /status disagree is unknown, never stale. The name may be a hashed
// session socket whose hash has no letter, or another server's socket.
func TestSweepPIDNameDisagreeingWithStatus(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string) string
		want  Verdict
		in    string
	}{
		{
			name: "a live server's socket under a dead PID's name: /status names the server",
			setup: func(t *testing.T, dir string) string {
				k := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{})
				p := filepath.Join(dir, fmt.Sprintf("kc-%d.sock", deadPID(t)))
				if err := os.Link(k.Socket, p); err != nil {
					t.Fatal(err)
				}
				return p
			},
			want: VerdictUnknown, in: "reads as a PID",
		},
		{
			name: "a live session channel under an all-digit name: listening, /status silent",
			setup: func(t *testing.T, dir string) string {
				k := testutil.StartKCServer(t, shortTemp(t), testutil.Fake{OpenChannels: true})
				return linkFakeSession(t, k, dir, fmt.Sprintf("kc-%d.sock", deadPID(t)))
			},
			want: VerdictUnknown, in: "listening",
		},
		{
			// Dead under either reading: no owner, nothing bound, silent.
			name: "a dead all-digit name",
			setup: func(t *testing.T, dir string) string {
				return orphanSocket(t, dir, fmt.Sprintf("kc-%d.sock", deadPID(t)))
			},
			want: VerdictStale, in: "silent twice",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			p := tt.setup(t, dir)
			cfg := fastConfig(dir)
			cfg.Apply = true
			s := sweep(t, cfg)[p]
			if s == nil {
				t.Fatalf("%s not reported", p)
			}
			if s.Verdict != tt.want || !strings.Contains(s.Reason, tt.in) {
				t.Errorf("verdict %s (%s), want %s with %q", s.Verdict, s.Reason, tt.want, tt.in)
			}
			if gone := !testutil.PathExists(p); gone != (tt.want == VerdictStale) {
				t.Errorf("unlinked: %v, verdict %s", gone, s.Verdict)
			}
		})
	}
}

// TestStatusGateAnotherPIDIsNotStale: an answer naming another process_id
// is never evidence of death, whatever gates 1 and 2 said.
func TestStatusGateAnotherPIDIsNotStale(t *testing.T) {
	g3, why := statusGate(4711, statusTry{answered: true, pid: 31000})
	if g3 == sayStale {
		t.Fatalf("gate 3 stale on an answer: %s", why)
	}
	v, reason := compose([3]say{sayStale, sayStale, g3}, [3]string{"no process 4711", "connect refused", why})
	if v != VerdictUnknown {
		t.Errorf("verdict %s (%s), want unknown", v, reason)
	}
}
