package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// TestReportsEscapeWhatUsersName: a supervisor's comm, a socket's name
// and a kernel supervisor's session fields are chosen by whoever runs
// them. In the text reports a newline in one must not start a line of its
// own, nor an escape sequence reach the operator's terminal; the name is
// still shown, escaped.
func TestReportsEscapeWhatUsersName(t *testing.T) {
	const forged = "FORGED"
	id := strings.Repeat("7", 64)
	// A socket directory a supervisor's --socket-dir can name (a pattern,
	// so no brackets).
	socks := filepath.Join(t.TempDir(), "d\x1bc\n"+forged) // ESC c resets a terminal
	if err := os.Mkdir(socks, 0o700); err != nil {
		t.Fatal(err)
	}
	orphanSock(t, socks, goneSockName(t))
	testutil.StartKCServer(t, t.TempDir(), testutil.Fake{ContainerID: id, Comm: "k\n" + forged})
	sessions := writeSessions(t, `[{"session_id":"s\n`+forged+`","language":"\u001b[2J","status":"idle","connected":false,
  "idle_seconds":90000,"working_directory":"/h\r`+forged+`","resource_usage":{"memory_bytes":1}}]`)
	culled := t.TempDir()
	testutil.StartKCServer(t, culled, testutil.Fake{Sessions: sessions})
	t.Setenv("PATH", t.TempDir()) // no podman CLI
	t.Setenv("KC_CULLER_LOG", filepath.Join(t.TempDir(), "culler.log"))
	dir := `d\x1bc\nFORGED/kc-`
	for _, tc := range []struct {
		args []string
		want []string // escaped, as the report must show them
	}{
		{[]string{"status", "--state-dir", t.TempDir(), "--socket-dir", socks, "--podman-url", "unix:///nonexistent/podman.sock",
			"--min-age", "0s", "--container", id}, []string{`"k\nFORGED"(`, dir}},
		{[]string{"sweep", "--socket-dir", socks}, []string{dir}},
		{[]string{"cull", "--socket-dir", culled}, []string{`"s\nFORGED"`, `"\x1b[2J"`, `"/h\rFORGED"`}},
	} {
		t.Run(tc.args[0], func(t *testing.T) {
			_, out := runJanitorCapture(t, tc.args...)
			if i := strings.IndexAny(out, "\x1b\r"); i >= 0 {
				t.Errorf("a control character reached the report at byte %d:\n%q", i, out)
			}
			for _, line := range strings.Split(out, "\n") {
				if strings.HasPrefix(line, forged) {
					t.Errorf("a user's newline started a line:\n%s", out)
				}
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("no %s in:\n%s", w, out)
				}
			}
		})
	}
}
