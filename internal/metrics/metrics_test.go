package metrics

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

func readBack(t *testing.T, path string) map[string]*dto.MetricFamily {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fams, err := Parse(data)
	if err != nil {
		t.Fatalf("the Prometheus text parser rejects the file: %v\n%s", err, data)
	}
	return fams
}

// value returns the gauge value of name with the given label pairs
// ("k", "v", ...), and whether it exists.
func value(fams map[string]*dto.MetricFamily, name string, kv ...string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
	if f.GetType() != dto.MetricType_GAUGE {
		return 0, false
	}
next:
	for _, m := range f.Metric {
		if len(m.Label) != len(kv)/2 {
			continue
		}
		for i := 0; i < len(kv); i += 2 {
			found := false
			for _, l := range m.Label {
				if l.GetName() == kv[i] && l.GetValue() == kv[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		return m.GetGauge().GetValue(), true
	}
	return 0, false
}

func TestWriteFileParsesBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kc-janitor.prom")
	s := New()
	s.Set(StraysFound, 3)
	s.Set(StraysReaped, 2)
	s.Set(StraysFailed, 1)
	s.Bool(GroundTruthKnown, true, "reconcile")
	s.Set(Trees, 2, "reaped")
	s.Set(Trees, 5, "skipped-live")
	start := time.Unix(1700000000, 0)
	s.Run("reconcile", start, start.Add(1500*time.Millisecond), true)
	if err := WriteFile(path, s); err != nil {
		t.Fatal(err)
	}
	fams := readBack(t, path)
	for _, c := range []struct {
		name string
		kv   []string
		want float64
	}{
		{StraysFound, nil, 3},
		{StraysReaped, nil, 2},
		{StraysFailed, nil, 1},
		{GroundTruthKnown, []string{"command", "reconcile"}, 1},
		{Trees, []string{"action", "reaped"}, 2},
		{Trees, []string{"action", "skipped-live"}, 5},
		{LastRun, []string{"command", "reconcile"}, 1700000001.5},
		{RunDuration, []string{"command", "reconcile"}, 1.5},
		{RunSuccess, []string{"command", "reconcile"}, 1},
	} {
		got, ok := value(fams, c.name, c.kv...)
		if !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.kv, got, ok, c.want)
		}
	}
	if h := fams[StraysFound].GetHelp(); h == "" {
		t.Error("no HELP line")
	}
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want 0644 (node_exporter runs unprivileged)", info.Mode().Perm())
	}
}

// Commands sharing one file keep each other's series; a command's own
// series are replaced.
func TestWriteFileMerges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.prom")
	now := time.Now()

	a := New()
	a.Set(StraysFound, 4)
	a.Run("reconcile", now, now, false)
	if err := WriteFile(path, a); err != nil {
		t.Fatal(err)
	}
	b := New()
	b.Set(SocketsStale, 7)
	b.Run("sweep", now, now, true)
	if err := WriteFile(path, b); err != nil {
		t.Fatal(err)
	}
	c := New()
	c.Set(StraysFound, 0)
	c.Run("reconcile", now, now, true)
	if err := WriteFile(path, c); err != nil {
		t.Fatal(err)
	}

	fams := readBack(t, path)
	if v, _ := value(fams, StraysFound); v != 0 {
		t.Errorf("strays found %v, want the newest value 0", v)
	}
	if v, ok := value(fams, SocketsStale); !ok || v != 7 {
		t.Errorf("sweep's series lost: %v %v", v, ok)
	}
	if v, ok := value(fams, RunSuccess, "command", "reconcile"); !ok || v != 1 {
		t.Errorf("reconcile success %v %v, want 1", v, ok)
	}
	if v, ok := value(fams, RunSuccess, "command", "sweep"); !ok || v != 1 {
		t.Errorf("sweep success %v %v, want 1", v, ok)
	}
	if n := len(fams[RunSuccess].Metric); n != 2 {
		t.Errorf("%d run_success series, want 2", n)
	}
}

func TestWriteFileReplacesGarbage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.prom")
	if err := os.WriteFile(path, []byte("this is { not prometheus\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := New()
	s.Set(SessionsAbandoned, 2)
	if err := WriteFile(path, s); err != nil {
		t.Fatal(err)
	}
	if v, ok := value(readBack(t, path), SessionsAbandoned); !ok || v != 2 {
		t.Errorf("got %v %v", v, ok)
	}
}

func TestWriteFileConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.prom")
	var wg sync.WaitGroup
	cmds := []string{"reconcile", "sweep", "cull", "doctor", "watch"}
	for i := 0; i < 20; i++ {
		for _, cmd := range cmds {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := New()
				s.Run(cmd, time.Now(), time.Now(), true)
				if err := WriteFile(path, s); err != nil {
					t.Error(err)
				}
			}()
		}
	}
	wg.Wait()
	fams := readBack(t, path)
	if n := len(fams[LastRun].Metric); n != len(cmds) {
		t.Errorf("%d last-run series, want %d: a concurrent writer lost another's series", n, len(cmds))
	}
}

func TestNilSetAndEmpty(t *testing.T) {
	var s *Set
	s.Set(StraysFound, 1) // must not panic
	if !s.Empty() {
		t.Error("nil set not empty")
	}
	path := filepath.Join(t.TempDir(), "m.prom")
	if err := WriteFile(path, New()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err == nil {
		t.Error("an empty set wrote a file")
	}
}

func TestUnknownNamePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("no panic for an unknown metric")
		}
	}()
	New().Set("kc_janitor_nonsense", 1)
}

func TestCatalogueNames(t *testing.T) {
	for _, n := range Names() {
		if !strings.HasPrefix(n, "kc_janitor_") {
			t.Errorf("%s: not under the kc_janitor_ prefix", n)
		}
		if h, _ := Help(n); h == "" {
			t.Errorf("%s: no help", n)
		}
	}
}
