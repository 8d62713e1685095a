package oneshot

import (
	"math"
	"os"
	"os/exec"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
)

// TestTune runs each case in a child process: the settings are the
// process's.
func TestTune(t *testing.T) {
	if os.Getenv("ONESHOT_CHILD") == "1" {
		Tune()
		gc := debug.SetGCPercent(100)
		limit := debug.SetMemoryLimit(-1)
		os.Stdout.WriteString(strconv.Itoa(gc) + " " + strconv.FormatInt(limit, 10) + "\n")
		os.Exit(0)
	}
	tests := []struct {
		name  string
		env   []string
		gc    int
		limit int64
	}{
		{"defaults", nil, -1, MemoryLimit},
		{"GOGC set", []string{"GOGC=50"}, 50, math.MaxInt64},
		{"GOGC off by the operator", []string{"GOGC=off"}, -1, math.MaxInt64},
		{"GOMEMLIMIT set", []string{"GOMEMLIMIT=1GiB"}, 100, 1 << 30},
		{"GOMEMLIMIT off", []string{"GOMEMLIMIT=off"}, 100, math.MaxInt64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestTune$")
			cmd.Env = []string{"ONESHOT_CHILD=1"}
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, "GOGC=") && !strings.HasPrefix(kv, "GOMEMLIMIT=") {
					cmd.Env = append(cmd.Env, kv)
				}
			}
			cmd.Env = append(cmd.Env, tt.env...)
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("child: %v", err)
			}
			want := strconv.Itoa(tt.gc) + " " + strconv.FormatInt(tt.limit, 10)
			if got := strings.TrimSpace(string(out)); got != want {
				t.Errorf("GC percent and memory limit after Tune: %s, want %s", got, want)
			}
		})
	}
}
