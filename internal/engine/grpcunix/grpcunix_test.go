package grpcunix

import (
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/engine/peercred"
)

// TestKeepaliveWithinTheServersPolicy: containerd's and the CRI runtimes'
// servers take grpc-go's default enforcement (pings at least 5 minutes
// apart, none on a connection without a stream); a client pinging more
// often is sent GOAWAY and its event stream dropped every few minutes.
func TestKeepaliveWithinTheServersPolicy(t *testing.T) {
	const serverMinTime = 5 * time.Minute
	if Keepalive.Time <= serverMinTime || Keepalive.PermitWithoutStream {
		t.Errorf("keepalive %+v: pings must be more than %v apart and only with a stream open", Keepalive, serverMinTime)
	}
	if Keepalive.Timeout <= 0 || Keepalive.Timeout >= Keepalive.Time {
		t.Errorf("keepalive timeout %v: set, and below the ping interval", Keepalive.Timeout)
	}
}

// TestPeersVouchOnlyWhenOne: answers over connections accepted by two
// UIDs (the socket's path swapped between two dials) vouch for neither.
func TestPeersVouchOnlyWhenOne(t *testing.T) {
	for _, tc := range []struct {
		name  string
		dials []int
		want  int
	}{
		{"none yet", nil, peercred.UIDUnknown},
		{"one", []int{0}, 0},
		{"the same again", []int{1000, 1000}, 1000},
		{"another", []int{0, 1000}, peercred.UIDUnknown},
		{"back to the first", []int{0, 1000, 0}, peercred.UIDUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p peers
			for _, uid := range tc.dials {
				p.record(uid)
			}
			if got := p.UID(); got != tc.want {
				t.Errorf("UID after dials by %v = %d, want %d", tc.dials, got, tc.want)
			}
		})
	}
}
