package ledger

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/trust"
)

// TestLedgerOthersCouldWriteIsNotUsed: a ledger in a state dir, or a
// containers directory, that another user could write or swap (through a
// parent he may write, unless sticky) is neither read nor written:
// records there name processes to kill. A containers directory others
// may write is refused, not closed and used. Open changes nothing outside
// the ledger: a containers symlink's target keeps its mode (Open made it
// 0700, following the link).
func TestLedgerOthersCouldWriteIsNotUsed(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it gives directories away")
	}
	for _, tc := range []struct {
		name string
		// prepare lays out base/state and returns the state dir to open.
		prepare   func(t *testing.T, base string) string
		open      bool // Open accepts it (after closing containers)
		readOnly  bool // OpenReadOnly accepts it
		untouched string
	}{
		{name: "ours, 0700", open: true, readOnly: true, prepare: func(t *testing.T, base string) string {
			return mkdirs(t, base, 0o700, 0o700)
		}},
		{name: "ours, 0755", open: true, readOnly: true, prepare: func(t *testing.T, base string) string {
			return mkdirs(t, base, 0o755, 0o755)
		}},
		{name: "state dir others may write", prepare: func(t *testing.T, base string) string {
			return mkdirs(t, base, 0o777, 0o700)
		}},
		{name: "state dir a symlink", prepare: func(t *testing.T, base string) string {
			real := mkdirs(t, base, 0o700, 0o700)
			link := filepath.Join(base, "link")
			if err := os.Symlink(real, link); err != nil {
				t.Fatal(err)
			}
			return link
		}},
		{name: "state dir another user's", prepare: func(t *testing.T, base string) string {
			d := mkdirs(t, base, 0o700, 0o700)
			chown(t, d, 65534)
			return d
		}},
		{name: "a parent others may write", prepare: func(t *testing.T, base string) string {
			open := filepath.Join(base, "open")
			if err := os.Mkdir(open, 0o700); err != nil {
				t.Fatal(err)
			}
			chmod(t, open, 0o777)
			return mkdirs(t, open, 0o700, 0o700)
		}},
		{name: "a sticky parent others may write", open: true, readOnly: true, prepare: func(t *testing.T, base string) string {
			tmp := filepath.Join(base, "tmp")
			if err := os.Mkdir(tmp, 0o700); err != nil {
				t.Fatal(err)
			}
			chmod(t, tmp, 0o777|os.ModeSticky)
			return mkdirs(t, tmp, 0o700, 0o700)
		}},
		{name: "containers others may write", prepare: func(t *testing.T, base string) string {
			return mkdirs(t, base, 0o700, 0o777)
		}},
		{name: "containers another user's", prepare: func(t *testing.T, base string) string {
			d := mkdirs(t, base, 0o700, 0o700)
			chown(t, filepath.Join(d, "containers"), 65534)
			return d
		}},
		{name: "containers a symlink", untouched: "elsewhere", prepare: func(t *testing.T, base string) string {
			d := filepath.Join(base, "state")
			if err := os.Mkdir(d, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(filepath.Join(base, "elsewhere"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Join(base, "elsewhere"), filepath.Join(d, "containers")); err != nil {
				t.Fatal(err)
			}
			return d
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			dir := tc.prepare(t, base)
			for _, o := range []struct {
				name string
				open func(string) (*Store, error)
				ok   bool
			}{{"OpenReadOnly", OpenReadOnly, tc.readOnly}, {"Open", Open, tc.open}} {
				_, err := o.open(dir)
				switch {
				case o.ok && err != nil:
					t.Errorf("%s: %v", o.name, err)
				case !o.ok && !errors.Is(err, trust.ErrUntrusted):
					t.Errorf("%s = %v, want it refused as untrusted", o.name, err)
				}
			}
			if tc.untouched != "" {
				st, err := os.Stat(filepath.Join(base, tc.untouched))
				if err != nil || st.Mode().Perm() != 0o755 {
					t.Errorf("%s outside the ledger: %v, %v; want it left 0755", tc.untouched, st.Mode(), err)
				}
			}
			if tc.open {
				st, err := os.Lstat(filepath.Join(dir, "containers"))
				if err != nil || st.Mode().Perm() != 0o700 {
					t.Errorf("containers after Open: %v, %v; want 0700", st.Mode(), err)
				}
			}
		})
	}
}

// TestOpenMakesNothingThroughAnUntrustedParent: a missing state dir is
// made only below directories Open trusts; one named through another
// user's symlink in a directory others may write is refused before
// anything is made where the link points.
func TestOpenMakesNothingThroughAnUntrustedParent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it gives directories away")
	}
	base := t.TempDir()
	open, target := filepath.Join(base, "open"), filepath.Join(base, "target")
	for _, d := range []string{open, target} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	chmod(t, open, 0o777)
	chown(t, open, 65534)
	link := filepath.Join(open, "lnk")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	openers := []struct {
		name string
		open func(dir string) error
	}{
		{"Open", func(dir string) error { _, err := Open(dir); return err }},
		// A reconcile --apply takes its lock before it opens the store.
		{"LockApply", func(dir string) error {
			unlock, err := LockApply(context.Background(), dir, 10*time.Millisecond)
			if err == nil {
				unlock()
			}
			return err
		}},
	}
	for _, o := range openers {
		t.Run(o.name, func(t *testing.T) {
			for _, dir := range []string{filepath.Join(link, "state"), filepath.Join(link, "a", "state")} {
				if err := o.open(dir); !errors.Is(err, trust.ErrUntrusted) {
					t.Errorf("%s(%s) = %v, want it refused as untrusted", o.name, dir, err)
				}
			}
			if left, _ := os.ReadDir(target); len(left) != 0 {
				t.Errorf("the link's target holds %v; want nothing made there", left)
			}
		})
	}
}

// mkdirs makes base/state with mode state and base/state/containers with
// mode containers, and returns base/state.
func mkdirs(t *testing.T, base string, state, containers os.FileMode) string {
	t.Helper()
	d := filepath.Join(base, "state")
	for _, m := range []struct {
		path string
		mode os.FileMode
	}{{d, state}, {filepath.Join(d, "containers"), containers}} {
		if err := os.Mkdir(m.path, 0o700); err != nil {
			t.Fatal(err)
		}
		chmod(t, m.path, m.mode)
	}
	return d
}
