package podman

import (
	"errors"
	"os"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/engine"
)

// IDs from testdata/ps-4.3.1.json, captured from Debian's podman 4.3.1
// (runc) with one container each running, created, exited and paused.
const (
	idRunning = "f42f18001b7374827d29bf73169b3dfdceaa6921283e13ada4e90a659a4c0147"
	idCreated = "c38a7724233ca266be8f465988cedbfcb90539ecf3c42caaf68c6e64e37bcf6d"
	idExited  = "698dd9198c3abc8d3b3b1ff31b5accc62942640ff76b8aed6d04d9e2e66fda47"
	idPaused  = "ca3307853582d63de491fa6e864fd0e9ab4340067f97290568a37a6b700f0a1b"
)

func id(c byte) string { return strings.Repeat(string(c), 64) }

func TestParseCLI(t *testing.T) {
	real431, err := os.ReadFile("testdata/ps-4.3.1.json")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		in      string
		live    []string
		states  map[string]string
		wantErr bool
	}{
		{
			name:   "podman 4.3.1",
			in:     string(real431),
			live:   []string{idCreated, idPaused, idRunning},
			states: map[string]string{idRunning: "running", idCreated: "created", idExited: "exited", idPaused: "paused"},
		},
		{name: "empty output", in: "", wantErr: true},
		{name: "whitespace only", in: " \n", wantErr: true},
		{name: "null", in: "null\n", wantErr: true},
		{name: "empty list", in: "[]\n", states: map[string]string{}},
		{name: "garbage", in: "Error: something went wrong\n", wantErr: true},
		{name: "truncated JSON", in: `[{"Id": "` + id('a') + `", "State": "runn`, wantErr: true},
		{name: "object not list", in: `{"Id": "` + id('a') + `", "State": "running"}`, wantErr: true},
		{name: "trailing data", in: `[] []`, wantErr: true},
		{
			name: "every raw state",
			in: `[
				{"Id": "` + id('1') + `", "State": "created", "Status": "Created"},
				{"Id": "` + id('2') + `", "State": "configured"},
				{"Id": "` + id('3') + `", "State": "initialized"},
				{"Id": "` + id('4') + `", "State": "running", "Status": "Up 3 minutes"},
				{"Id": "` + id('5') + `", "State": "paused"},
				{"Id": "` + id('6') + `", "State": "stopping"},
				{"Id": "` + id('7') + `", "State": "stopped"},
				{"Id": "` + id('8') + `", "State": "exited", "Status": "Up 3 minutes"},
				{"Id": "` + id('9') + `", "State": "removing"},
				{"Id": "` + id('a') + `", "State": "unknown"}
			]`,
			live: []string{id('1'), id('2'), id('3'), id('4'), id('5'), id('6')},
			states: map[string]string{
				id('1'): "created", id('2'): "configured", id('3'): "initialized",
				id('4'): "running", id('5'): "paused", id('6'): "stopping",
				id('7'): "stopped", id('8'): "exited", id('9'): "removing",
				id('a'): "unknown",
			},
		},
		// A state podman never names: not its output, and not "not live".
		{name: "a state podman never names", in: `[{"Id": "` + id('a') + `", "State": "running"}, {"Id": "` + id('b') + `", "State": "Running"}]`, wantErr: true},
		{name: "a status for a state", in: `[{"Id": "` + id('a') + `", "State": "Up 3 minutes"}]`, wantErr: true},
		// One entry without a full ID fails the list: the container it
		// stands for would be missing from a list whose absences say gone.
		{name: "a short ID among full ones", in: `[{"Id": "` + id('a') + `", "State": "running"}, {"Id": "f42f18001b73", "State": "running"}]`, wantErr: true},
		{name: "an upper-case ID", in: `[{"Id": "` + strings.ToUpper(idRunning) + `", "State": "running"}]`, wantErr: true},
		{name: "a missing ID", in: `[{"Id": "` + id('a') + `", "State": "running"}, {"State": "running"}]`, wantErr: true},
		{name: "an object", in: `{"Id": "` + id('a') + `", "State": "running"}`, wantErr: true},
		{
			name:    "all IDs truncated",
			in:      `[{"Id": "f42f18001b73", "State": "running"}, {"Id": "c38a7724233c", "State": "exited"}]`,
			wantErr: true,
		},
		{name: "state missing", in: `[{"Id": "` + id('a') + `"}]`, wantErr: true},
		{name: "state null", in: `[{"Id": "` + id('a') + `", "State": null}]`, wantErr: true},
		{name: "state numeric", in: `[{"Id": "` + id('a') + `", "State": 3}]`, wantErr: true},
		{
			name:   "duplicate ID",
			in:     `[{"Id": "` + id('a') + `", "State": "running"}, {"Id": "` + id('a') + `", "State": "running"}]`,
			live:   []string{id('a')},
			states: map[string]string{id('a'): "running"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := parseCLI([]byte(tt.in))
			if tt.wantErr {
				if err == nil {
					t.Fatalf("parseCLI: want error, got %+v", l)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseCLI: %v", err)
			}
			if got := liveIDs(l.Live); !slices.Equal(got, sorted(tt.live)) {
				t.Errorf("live = %v, want %v", got, sorted(tt.live))
			}
			if !reflect.DeepEqual(l.States, tt.states) {
				t.Errorf("states = %v, want %v", l.States, tt.states)
			}
		})
	}
}

func liveIDs(m map[string]bool) []string {
	var ids []string
	for id, ok := range m {
		if ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func TestIsLiveState(t *testing.T) {
	for _, s := range []string{"created", "configured", "initialized", "running", "paused", "stopping"} {
		if !IsLiveState(s) {
			t.Errorf("IsLiveState(%q) = false", s)
		}
	}
	// Display strings (Status) and the dead states are not live.
	for _, s := range []string{"", "exited", "stopped", "removing", "unknown", "Up 3 minutes", "Created", "Running"} {
		if IsLiveState(s) {
			t.Errorf("IsLiveState(%q) = true", s)
		}
	}
}

func TestParseEndpoint(t *testing.T) {
	tests := []struct {
		in, scheme, path string
		wantErr          bool
	}{
		{in: "unix:///run/podman/podman.sock", scheme: "unix", path: "/run/podman/podman.sock"},
		{in: "unix:///run//podman/./podman.sock", scheme: "unix", path: "/run/podman/podman.sock"},
		{in: "unix://run/podman/podman.sock", scheme: "unix", path: "/run/podman/podman.sock"},
		{in: "tcp://127.0.0.1:8080", scheme: "tcp", path: "127.0.0.1:8080"},
		{in: "unix://", wantErr: true},
		{in: "tcp://", wantErr: true},
		{in: "ssh://core@host/run/podman/podman.sock", wantErr: true},
		{in: "/run/podman/podman.sock", wantErr: true},
		{in: "http://%zz", wantErr: true},
	}
	for _, tt := range tests {
		ep, err := parseEndpoint(tt.in)
		if tt.wantErr {
			if err == nil {
				t.Errorf("parseEndpoint(%q) = %+v, want error", tt.in, ep)
			}
			continue
		}
		if err != nil || ep.Network != tt.scheme || ep.Addr != tt.path {
			t.Errorf("parseEndpoint(%q) = %+v, %v; want %s %q", tt.in, ep, err, tt.scheme, tt.path)
		}
	}
}

func TestDefaultURL(t *testing.T) {
	if os.Geteuid() == 0 {
		if got := DefaultURL(); got != "unix:///run/podman/podman.sock" {
			t.Errorf("DefaultURL() as root = %q", got)
		}
		return
	}
	t.Setenv("XDG_RUNTIME_DIR", "/run/user/4242")
	if got := DefaultURL(); got != "unix:///run/user/4242/podman/podman.sock" {
		t.Errorf("DefaultURL() = %q", got)
	}
}

func TestResolveURL(t *testing.T) {
	t.Setenv("CONTAINER_HOST", "")
	if got := resolveURL(""); got != DefaultURL() {
		t.Errorf("resolveURL(\"\") = %q, want default %q", got, DefaultURL())
	}
	t.Setenv("CONTAINER_HOST", "unix:///tmp/x.sock")
	if got := resolveURL(""); got != "unix:///tmp/x.sock" {
		t.Errorf("resolveURL(\"\") with CONTAINER_HOST = %q", got)
	}
	if got := resolveURL("tcp://h:1"); got != "tcp://h:1" {
		t.Errorf("explicit URL not kept: %q", got)
	}
}

func TestCLIGlobalArgs(t *testing.T) {
	def, err := parseEndpoint(DefaultURL())
	if err != nil {
		t.Fatal(err)
	}
	// The default socket: the plain CLI reads the same store, kept from
	// going remote whatever containers.conf says.
	local := []string{"--remote=false"}
	if got := cliGlobalArgs(def, nil); !slices.Equal(got, local) {
		t.Errorf("default socket: args = %q, want %q", got, local)
	}
	// Spelled differently, still the default.
	alt, _ := parseEndpoint("unix://" + strings.Replace(def.Addr, "/", "//", 1))
	if got := cliGlobalArgs(alt, nil); !slices.Equal(got, local) {
		t.Errorf("default socket (%s): args = %q, want %q", alt.Raw, got, local)
	}
	// Another socket or tcp: the CLI must ask that same service.
	for _, u := range []string{"unix:///tmp/other/podman.sock", "unix:///run/user/1000/podman/podman.sock", "tcp://127.0.0.1:8080"} {
		ep, _ := parseEndpoint(u)
		if got := cliGlobalArgs(ep, nil); !slices.Equal(got, []string{"--url", u}) {
			t.Errorf("%s: args = %q", u, got)
		}
	}
	// An override is used verbatim, even an empty one.
	ep, _ := parseEndpoint("unix:///tmp/other/podman.sock")
	if got := cliGlobalArgs(ep, []string{"--root", "/x"}); !slices.Equal(got, []string{"--root", "/x"}) {
		t.Errorf("override: args = %q", got)
	}
	if got := cliGlobalArgs(ep, []string{}); got == nil || len(got) != 0 {
		t.Errorf("empty override: args = %q", got)
	}
}

func TestCLIEnv(t *testing.T) {
	got := cliEnv([]string{"PATH=/bin", "CONTAINER_HOST=unix:///x", "CONTAINER_CONNECTION=c", "CONTAINERS_CONF=/c", "HOME=/root"})
	want := []string{"PATH=/bin", "CONTAINERS_CONF=/c", "HOME=/root"}
	if !slices.Equal(got, want) {
		t.Errorf("cliEnv = %q, want %q", got, want)
	}
}

func TestListedEmptyState(t *testing.T) {
	var b listed
	if err := b.add(entry{ID: id('a'), State: ""}); err == nil {
		t.Error("empty state accepted")
	}
}

func TestErrUnknownWrapping(t *testing.T) {
	// An unusable URL and no CLI override: unknown, without trying a CLI
	// that would ask some other podman.
	t.Setenv("PATH", t.TempDir()) // no podman at all
	_, err := Query(t.Context(), Options{URL: "ssh://core@host/run/podman/podman.sock"})
	if !errors.Is(err, engine.ErrUnknown) {
		t.Fatalf("err = %v, want ErrUnknown", err)
	}
}

// TestParseCLICostsItsBytes: a list of entries that are no containers
// (16 MiB of "{},", each a struct once decoded) costs a few times its
// bytes; decoded whole it took gigabytes.
func TestParseCLICostsItsBytes(t *testing.T) {
	body := []byte("[" + strings.Repeat("{},", 16<<20/3-1) + "{}]")
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := parseCLI(body)
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "no full 64-hex ID") {
		t.Fatalf("parseCLI = %v, want no full ID among them", err)
	}
	// Garbage included: each entry's decoding allocates a little.
	if got := after.TotalAlloc - before.TotalAlloc; got > 8*uint64(len(body)) {
		t.Errorf("parsing %d bytes allocated %d MiB", len(body), got>>20)
	}
}
