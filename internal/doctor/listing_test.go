package doctor

import (
	"strings"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/proctable"
	"github.com/kc-watchman/kc-watchman/internal/proctable/taskiter"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// TestListing runs where the tests run: as root on a kernel with BTF, so
// auto and on take the iterator and off never tries it.
func TestListing(t *testing.T) {
	for _, tt := range []struct {
		lister proctable.Lister
		want   string
	}{
		{proctable.ListAuto, "BPF " + bpfMethod(t) + ": "},
		{proctable.ListBPF, "BPF " + bpfMethod(t) + ": "},
		{proctable.ListProc, "/proc; --bpf off"},
	} {
		t.Run(tt.lister.String(), func(t *testing.T) {
			c := Listing(tt.lister)
			if c.Name != NameListing || c.Verdict != OK || !strings.HasPrefix(c.Detail, tt.want) {
				t.Errorf("Listing(%v) = %+v, want ok starting %q", tt.lister, c, tt.want)
			}
		})
	}
}

// TestListingWhereTheIteratorCannotRun: as PID 1 of a new PID namespace
// the iterator refuses to list (it reports the host's numbers); auto then
// says scans use /proc and why, and on is an error, since every scan
// would fail.
func TestListingWhereTheIteratorCannotRun(t *testing.T) {
	type summary struct{ Auto, On Check }
	if proc.InPIDNamespace() {
		proc.EnterPIDNamespace(t)
		proc.WriteSummary(t, summary{Auto: Listing(proctable.ListAuto), On: Listing(proctable.ListBPF)})
		return
	}
	var got summary
	proc.RunInPIDNamespace(t, "TestListingWhereTheIteratorCannotRun", time.Minute, &got)
	if got.Auto.Verdict != OK || !strings.HasPrefix(got.Auto.Detail, "/proc; the BPF task iterator cannot be used here") || !strings.Contains(got.Auto.Detail, "pid namespace") {
		t.Errorf("auto in another PID namespace: %+v; want ok, /proc and the reason", got.Auto)
	}
	if got.On.Verdict != Error || !strings.Contains(got.On.Detail, "--bpf on") {
		t.Errorf("on in another PID namespace: %+v; want an error naming --bpf on", got.On)
	}
}

// bpfMethod is how this host's BPF program lists: the walk where the
// kernel has the open-coded task iterator, else the task iterator.
func bpfMethod(t *testing.T) string {
	t.Helper()
	p, err := taskiter.Load()
	if err != nil {
		t.Skipf("no BPF listing here: %v", err)
	}
	defer p.Close()
	return p.Method()
}

// TestListingCheck: an auto listing that fell back to /proc is ok when
// the host cannot run the iterator, a warning when a pass went wrong here.
func TestListingCheck(t *testing.T) {
	for _, tt := range []struct {
		name    string
		l       *proctable.Listing
		verdict Verdict
		want    string
	}{
		{"host without the iterator", &proctable.Listing{Lister: "proc", Fallback: "BPF task iterator unavailable: operation not permitted"}, OK, "/proc; the BPF task iterator cannot be used here: BPF task iterator unavailable: operation not permitted"},
		{"pass refused", &proctable.Listing{Lister: "proc", Fallback: "BPF task iterator unavailable: the listing disagrees with /proc", Refused: true}, Warn, "/proc; the BPF task iterator runs here, but its pass was refused: BPF task iterator unavailable: the listing disagrees with /proc"},
		{"listed", &proctable.Listing{Lister: "bpf", Method: "walk", PIDs: []int{1, 2}}, OK, "BPF walk: 2 processes in 1ms; it listed every process"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := listingCheck(proctable.ListAuto, tt.l, nil, time.Millisecond)
			if c.Verdict != tt.verdict || !strings.HasPrefix(c.Detail, tt.want) {
				t.Errorf("listingCheck = %v %q; want %v, starting %q", c.Verdict, c.Detail, tt.verdict, tt.want)
			}
		})
	}
}
