package cull

import (
	"slices"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/sockets"
	"github.com/kc-watchman/kc-watchman/internal/sweep"
)

func TestSources(t *testing.T) {
	swept := []*sweep.Socket{
		{Path: "/run/kc-10.sock", PID: 10, Kind: sockets.KindControl, Verdict: sweep.VerdictLive},
		{Path: "/run/kc-10.abc.sock", PID: 10, Kind: sockets.KindSession, Verdict: sweep.VerdictLive},
		{Path: "/run/kc-11.sock", PID: 11, Kind: sockets.KindControl, Verdict: sweep.VerdictStale},
		{Path: "/run/kc-12.sock", PID: 12, Kind: sockets.KindControl, Verdict: sweep.VerdictUnknown},
		{Path: "/run/kc-1f.sock", Kind: sockets.KindSession, Hashed: true, Verdict: sweep.VerdictLive},
		{Path: "/run/kc-13.sock", PID: 13, Kind: sockets.KindControl, Verdict: sweep.VerdictLive},
	}
	tests := []struct {
		name    string
		notLive bool
	}{
		{"without a callback", false},
		{"telling what is left out", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var left []string
			var cb func(*sweep.Socket)
			if tt.notLive {
				cb = func(s *sweep.Socket) { left = append(left, s.Path) }
			}
			var got []Source
			for _, s := range Sources(swept, cb) {
				if s.Pin == nil {
					t.Errorf("%s: no pin through the sweep's directory", s.Socket)
				}
				got = append(got, Source{Socket: s.Socket, PID: s.PID})
			}
			want := []Source{{Socket: "/run/kc-10.sock", PID: 10}, {Socket: "/run/kc-13.sock", PID: 13}}
			if !slices.EqualFunc(got, want, func(a, b Source) bool { return a.Socket == b.Socket && a.PID == b.PID }) {
				t.Errorf("Sources = %+v, want %+v", got, want)
			}
			if wantLeft := []string{"/run/kc-11.sock", "/run/kc-12.sock"}; tt.notLive && !slices.Equal(left, wantLeft) {
				t.Errorf("left out %q, want %q (control sockets that are not live, and only those)", left, wantLeft)
			}
		})
	}
}

// TestSourcesOneFileOnce: names of one socket file (a user hard-links her
// live socket into a directory the sweep also looks in) are one
// supervisor, audited and counted once.
func TestSourcesOneFileOnce(t *testing.T) {
	file := sockets.File{Dev: 7, Ino: 42}
	swept := []*sweep.Socket{
		{Path: "/tmp/kc-10.sock", PID: 10, Kind: sockets.KindControl, Verdict: sweep.VerdictLive, ID: file},
		{Path: "/tmp/m/kc-10.sock", PID: 10, Kind: sockets.KindControl, Verdict: sweep.VerdictLive, ID: file},
		{Path: "/tmp/kc-11.sock", PID: 11, Kind: sockets.KindControl, Verdict: sweep.VerdictLive, ID: sockets.File{Dev: 7, Ino: 43}},
	}
	var got []string
	for _, s := range Sources(swept, nil) {
		got = append(got, s.Socket)
	}
	if want := []string{"/tmp/kc-10.sock", "/tmp/kc-11.sock"}; !slices.Equal(got, want) {
		t.Errorf("Sources = %q, want %q", got, want)
	}
}
