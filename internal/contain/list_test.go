package contain

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestListFindPopulate: List and Find name kc-watchman's cgroups without
// reading them, and count every one as populated until Populate reads
// it: a cgroup taken for empty is removed, and must be.
func TestListFindPopulate(t *testing.T) {
	for _, kind := range []Kind{KindCgroup2, KindFreezer} {
		t.Run(string(kind), func(t *testing.T) {
			empty, full := contained(t, kind), contained(t, kind)
			cmd := startIn(t, full, "sleep", "1000000")
			if !within(5*time.Second, func() bool { return len(cgroupProcs(t, full)) > 0 }) {
				t.Fatalf("pid %d did not enter the cgroup", cmd.Process.Pid)
			}
			ids := map[string]bool{empty.containerID: true, full.containerID: true}
			all, err := List(Options{})
			if err != nil {
				t.Fatal(err)
			}
			var ours []Listed
			for _, l := range all {
				if ids[l.ContainerID] && l.Record.Kind == string(kind) {
					ours = append(ours, l)
				}
			}
			if len(ours) != 2 {
				t.Fatalf("List: %d of the 2 cgroups on %s (all: %+v)", len(ours), kind, all)
			}
			for _, l := range ours {
				if !l.Populated {
					t.Errorf("%s listed as empty before it was read", l.Record.Path)
				}
			}
			if err := Populate(ours); err != nil {
				t.Fatal(err)
			}
			for _, l := range ours {
				if want := l.ContainerID == full.containerID; l.Populated != want {
					t.Errorf("%s: populated %v, want %v", l.Record.Path, l.Populated, want)
				}
			}

			found, err := Find(Options{}, full.containerID)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, l := range found {
				got = append(got, l.Record.Kind+":"+l.Record.Path)
				if l.ContainerID != full.containerID || !strings.HasSuffix(l.Record.Path, full.containerID) {
					t.Errorf("Find(%s) = %+v", full.containerID, l)
				}
			}
			if !slices.Contains(got, string(kind)+":"+Dir+"/"+full.containerID) {
				t.Errorf("Find: %v, want %s among them", got, Dir+"/"+full.containerID)
			}
			if none, err := Find(Options{}, newID(t)); err != nil || len(none) != 0 {
				t.Errorf("Find of a container with no cgroup: %+v, %v", none, err)
			}
			if _, err := Find(Options{}, "../"+full.containerID[3:]); err == nil {
				t.Error("Find took a path for a container ID")
			}
		})
	}
}

// TestMountTableReadOnce: the listing, lookups and detection of one
// decision share one read of the mount table, and find what reads of
// their own find.
func TestMountTableReadOnce(t *testing.T) {
	c := contained(t, KindCgroup2)
	opt := Options{Mounts: NewMountTable()}
	for range 3 {
		all, err := List(opt)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(all, func(l Listed) bool { return l.ContainerID == c.containerID }) {
			t.Errorf("List with a shared table: %s not listed", c.containerID)
		}
		found, err := Find(opt, c.containerID)
		if err != nil || len(found) == 0 {
			t.Errorf("Find with a shared table: %+v, %v", found, err)
		}
		if got, want := Detect(opt).Kind, Detect(Options{}).Kind; got != want {
			t.Errorf("Detect with a shared table: %s, want %s", got, want)
		}
	}
	if opt.Mounts.reads != 1 {
		t.Errorf("the mount table was read %d times, want once", opt.Mounts.reads)
	}
}
