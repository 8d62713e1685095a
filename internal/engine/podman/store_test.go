package podman

import (
	"testing"
)

func TestParseStoreArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want storeArgs
	}{
		{nil, storeArgs{}},
		{[]string{"--log-level=error"}, storeArgs{}},
		{[]string{"--root=/a", "--runroot", "/b"}, storeArgs{"/a", "/b"}},
		{[]string{"--root", "/a", "--storage-driver=vfs"}, storeArgs{root: "/a"}},
		{[]string{"--root"}, storeArgs{}},
	} {
		if got := parseStoreArgs(tc.args); got != tc.want {
			t.Errorf("parseStoreArgs(%q) = %+v, want %+v", tc.args, got, tc.want)
		}
	}
}

func TestStoreCheck(t *testing.T) {
	s := storeArgs{root: "/srv/storage/", runroot: "/run/x"}
	if err := s.check("/srv/storage", "/run/x"); err != nil {
		t.Errorf("same store refused: %v", err)
	}
	if err := s.check("/var/lib/containers/storage", "/run/x"); err == nil {
		t.Error("a service on another graph root was accepted")
	}
	if err := s.check("/srv/storage", "/run/containers/storage"); err == nil {
		t.Error("a service on another run root was accepted")
	}
}
