package userns

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestMapToHost(t *testing.T) {
	rootless := Map{{0, 1001, 1}, {1, 100000, 65536}}
	initial := Map{{0, 0, 1<<32 - 1}}
	for _, tc := range []struct {
		name    string
		m       Map
		in      int
		want    int
		wantErr bool
	}{
		{"rootless: namespace root is the user", rootless, 0, 1001, false},
		{"rootless: first subordinate", rootless, 1, 100000, false},
		{"rootless: last subordinate", rootless, 65536, 165535, false},
		{"rootless: beyond the map", rootless, 65537, -1, true},
		{"rootless: negative", rootless, -1, -1, true},
		{"initial: identity", initial, 1001, 1001, false},
		{"initial: root", initial, 0, 0, false},
		{"empty map maps nothing", Map{}, 0, -1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.m.ToHost(tc.in)
			if got != tc.want || (err != nil) != tc.wantErr {
				t.Fatalf("ToHost(%d) = %d, %v; want %d, error %v", tc.in, got, err, tc.want, tc.wantErr)
			}
			if err != nil && !errors.Is(err, ErrUnmapped) {
				t.Fatalf("error %v is not ErrUnmapped", err)
			}
		})
	}
	if !initial.Initial() || rootless.Initial() {
		t.Fatal("Initial() is wrong")
	}
}

func TestReadMap(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       Map
		wantErr    bool
	}{
		{"rootless podman", "         0       1001          1\n         1     100000      65536\n", Map{{0, 1001, 1}, {1, 100000, 65536}}, false},
		{"initial", "         0          0 4294967295\n", Map{{0, 0, 1<<32 - 1}}, false},
		{"short line", "0 1001\n", nil, true},
		{"not a number", "0 x 1\n", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "uid_map")
			if err := os.WriteFile(p, []byte(tc.text), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := ReadMap(p)
			if (err != nil) != tc.wantErr {
				t.Fatalf("ReadMap: %v, want error %v", err, tc.wantErr)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("ReadMap = %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("ReadMap = %v, want %v", got, tc.want)
				}
			}
		})
	}
}

func TestHostEUIDHere(t *testing.T) {
	// These tests run in the initial namespace (or a mapped one): the
	// host EUID is whatever the map says of the effective UID.
	m, err := Self()
	if err != nil {
		t.Skipf("no uid_map: %v", err)
	}
	want, err := m.ToHost(os.Geteuid())
	if err != nil {
		t.Fatal(err)
	}
	if got := HostEUID(); got != want {
		t.Fatalf("HostEUID() = %d, want %d", got, want)
	}
}

func TestTranslatorOverflow(t *testing.T) {
	rootless := Translator{Map: Map{{0, 1001, 1}, {1, 100000, 65536}}, Overflow: 65534}
	initial := Translator{Map: Map{{0, 0, 1<<32 - 1}}, Overflow: 65534}
	for _, tc := range []struct {
		name string
		tr   Translator
		in   int
		want int
	}{
		// Root's process, seen from rootless podman's namespace.
		{"rootless: the overflow UID is unknown", rootless, 65534, -1},
		{"rootless: the user", rootless, 0, 1001},
		{"initial: nobody is nobody", initial, 65534, 65534},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, _ := tc.tr.Host(tc.in); got != tc.want {
				t.Fatalf("Host(%d) = %d, want %d", tc.in, got, tc.want)
			}
		})
	}
}
