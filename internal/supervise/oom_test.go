package supervise_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/testutil/supervise"
)

// TestCommandGetsTheInitsOOMScore: the command runs with the container
// init's oom_score_adj, not the one the wrapper inherited from the
// runtime (the test's own here), whether that is higher or lower; the
// wrapper keeps its own.
func TestCommandGetsTheInitsOOMScore(t *testing.T) {
	data, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		t.Fatal(err)
	}
	inherited, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	for _, score := range []int{inherited + 300, inherited - 100} {
		t.Run(strconv.Itoa(score), func(t *testing.T) {
			_, init := supervisetest.Process(t, "sleep", "1000000")
			if err := os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", init.PID), []byte(strconv.Itoa(score)), 0); err != nil {
				t.Skipf("cannot set the init's oom_score_adj: %v", err)
			}
			out := filepath.Join(t.TempDir(), "score")
			w := startWrapper(t, init, nil, "/bin/sh", "-c", `cat /proc/self/oom_score_adj > "$1.tmp" && mv "$1.tmp" "$1"; exec sleep 1000000`, "sh", out)
			var got string
			supervisetest.Eventually(t, 10*time.Second, "the command did not report its oom_score_adj", func() bool {
				data, err := os.ReadFile(out)
				got = strings.TrimSpace(string(data))
				return err == nil
			})
			if got != strconv.Itoa(score) {
				t.Errorf("the command's oom_score_adj is %s, want the init's %d (the wrapper inherited %d)", got, score, inherited)
			}
			// The wrapper keeps its own: outside the container's memory
			// cgroup, it is what watches the tree.
			own, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", w.st.PID))
			if err != nil {
				t.Fatal(err)
			}
			if strings.TrimSpace(string(own)) != strconv.Itoa(inherited) {
				t.Errorf("the wrapper's oom_score_adj is %s, want its own %d", strings.TrimSpace(string(own)), inherited)
			}
		})
	}
}
