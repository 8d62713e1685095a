package trees

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

func TestHoldsCaller(t *testing.T) {
	me := fingerprint.Identity{Stat: fingerprint.Stat{PID: os.Getpid()}}
	tests := []struct {
		name string
		tree Tree
		want bool
	}{
		{"own group", Tree{PGID: unix.Getpgrp()}, true},
		{"caller is a member", Tree{PGID: 1 << 22, Members: []fingerprint.Identity{me}}, true},
		{"another group", Tree{PGID: 1 << 22, Members: []fingerprint.Identity{{Stat: fingerprint.Stat{PID: 1 << 22}}}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.tree.HoldsCaller(); got != tt.want {
				t.Errorf("HoldsCaller = %v, want %v", got, tt.want)
			}
		})
	}
}
