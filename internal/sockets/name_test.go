package sockets

import (
	"strings"
	"testing"
)

func TestParseName(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
		want Name
	}{
		{"kc-442.sock", true, Name{PID: 442, Kind: KindControl}},
		{"kc-1.sock", true, Name{PID: 1, Kind: KindControl}},
		{"kc-4194304.sock", true, Name{PID: 4194304, Kind: KindControl}},
		{"kc-442.python-0.sock", true, Name{PID: 442, Kind: KindSession, Session: "python-0"}},
		{"kc-442.R_1a2b3c.sock", true, Name{PID: 442, Kind: KindSession, Session: "R_1a2b3c"}},
		{"kc-../../etc.sock", false, Name{}},
		{"kc-1/../../etc.sock", false, Name{}},
		{"kc-1.../x.sock", false, Name{}},
		{"kc-1..sock", false, Name{}},
		{"kc-1.a.b.sock", false, Name{}},
		{"kc-1.a b.sock", false, Name{}},
		{"kc-.sock", false, Name{}},
		{"kc-0.sock", false, Name{}},
		{"kc-0442.sock", false, Name{}},
		{"kc--1.sock", false, Name{}},
		{"kc-+1.sock", false, Name{}},
		{"kc-4194305.sock", true, Name{Kind: KindSession, Hash: "4194305"}}, // past MaxPID: only a hash
		{"kc-99999999999999999999.sock", false, Name{}},                     // 20 digits: neither
		// Kallichore's hashed form, kc-<hex>.sock: a u64 as 1–16 lowercase
		// hex digits, unpadded.
		{"kc-deadbeef.sock", true, Name{Kind: KindSession, Hash: "deadbeef"}},
		{"kc-123456789abcdef0.sock", true, Name{Kind: KindSession, Hash: "123456789abcdef0"}},
		{"kc-1234567a.sock", true, Name{Kind: KindSession, Hash: "1234567a"}},
		{"kc-1f3a9c.sock", true, Name{Kind: KindSession, Hash: "1f3a9c"}},
		{"kc-a.sock", true, Name{Kind: KindSession, Hash: "a"}},
		{"kc-deadbee.sock", true, Name{Kind: KindSession, Hash: "deadbee"}},
		// All decimal: a PID when it reads as one (the ambiguity gate 3
		// handles), else only a hash.
		{"kc-12345678.sock", true, Name{Kind: KindSession, Hash: "12345678"}},
		{"kc-1234567890123456.sock", true, Name{Kind: KindSession, Hash: "1234567890123456"}},
		{"kc-0123456789abcdef.sock", false, Name{}}, // padded
		{"kc-00000000.sock", false, Name{}},
		{"kc-12345678901234567.sock", false, Name{}}, // 17 digits: more than a u64
		{"kc-" + strings.Repeat("a", 17) + ".sock", false, Name{}},
		{"kc-" + strings.Repeat("a", 64) + ".sock", false, Name{}},
		{"kc-DEADBEEF.sock", false, Name{}},
		{"kc-DeadBeef.sock", false, Name{}},
		{"kc-deadbeeg.sock", false, Name{}},
		{"kc-xyz.sock", false, Name{}},
		{"kc-deadbeef.x.sock", false, Name{}},
		{"kc-deadbeef.sock.bak", false, Name{}},
		{"kc-dead beef.sock", false, Name{}},
		{"kc-0xdeadbeef.sock", false, Name{}},
		{"kc-442.sock.bak", false, Name{}},
		{"kc-442", false, Name{}},
		{"xkc-442.sock", false, Name{}},
		{"KC-442.sock", false, Name{}},
		{"kc-442.sock/", false, Name{}},
		{"kc-442." + strings.Repeat("a", 65) + ".sock", false, Name{}},
		{"", false, Name{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := ParseName(tt.name)
			if ok != tt.ok || got != tt.want {
				t.Errorf("ParseName(%q) = %+v, %v; want %+v, %v", tt.name, got, ok, tt.want, tt.ok)
			}
		})
	}
}

func FuzzParseName(f *testing.F) {
	f.Add("kc-442.sock")
	f.Add("kc-442.python-0.sock")
	f.Add("kc-../../etc.sock")
	f.Add("kc-deadbeef.sock")
	f.Fuzz(func(t *testing.T, s string) {
		n, ok := ParseName(s)
		if !ok {
			return
		}
		for i := 0; i < len(s); i++ {
			if s[i] == '/' || s[i] == 0 {
				t.Fatalf("accepted %q", s)
			}
		}
		if n.Hashed() {
			if n.PID != 0 || n.Kind != KindSession || s != "kc-"+n.Hash+".sock" || !validHash(n.Hash) {
				t.Fatalf("hashed %+v from %q", n, s)
			}
			return
		}
		if n.PID < 1 || n.PID > MaxPID {
			t.Fatalf("pid %d from %q", n.PID, s)
		}
	})
}

// TestAllDigitHashReadsAsPID: a hashed session name is a u64 in hex, and
// one made only of decimal digits that reads as a PID is exactly a
// control socket's name. ParseName takes it as the PID; the gates must
// then keep a live socket under that name from being called stale.
func TestAllDigitHashReadsAsPID(t *testing.T) {
	if !validHash("4711") {
		t.Fatal("4711 is a valid u64 hash in hex")
	}
	n, ok := ParseName("kc-4711.sock")
	if !ok || n.PID != 4711 || n.Kind != KindControl || n.Hashed() {
		t.Fatalf("ParseName(kc-4711.sock) = %+v, %v; want the control socket of pid 4711", n, ok)
	}
}
