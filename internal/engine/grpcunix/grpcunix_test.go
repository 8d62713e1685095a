package grpcunix

import (
	"testing"
	"time"
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
