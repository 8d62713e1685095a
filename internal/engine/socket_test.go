package engine

import (
	"errors"
	"testing"
)

func TestSocketPath(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		bad      bool
	}{
		{in: "/run/containerd/containerd.sock", want: "/run/containerd/containerd.sock"},
		{in: "unix:///run/crio/crio.sock", want: "/run/crio/crio.sock"},
		{in: "unix:///run//crio/../crio/crio.sock", want: "/run/crio/crio.sock"},
		{in: "/run//containerd/", want: "/run/containerd"},
		{in: "", bad: true},
		{in: "containerd.sock", bad: true},
		{in: "unix://", bad: true},
		{in: "tcp://127.0.0.1:1", bad: true},
		{in: "npipe:////./pipe/containerd", bad: true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := SocketPath(tc.in)
			if tc.bad {
				if !errors.Is(err, ErrSocketPath) {
					t.Fatalf("SocketPath(%q) = %q, %v; want ErrSocketPath", tc.in, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("SocketPath(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		})
	}
}
