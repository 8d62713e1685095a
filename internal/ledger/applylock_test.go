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

// TestLockApplyRefusesStateDir: a state dir another user could hold or
// swap is refused before any lock file is made in it, so an --apply run
// that cannot trust its lock signals nothing.
func TestLockApplyRefusesStateDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it gives a dir to another user")
	}
	tests := []struct {
		name    string
		prepare func(t *testing.T, dir string) string // returns the state dir to lock
		refused bool
	}{
		{name: "this user's, closed to writers", prepare: func(t *testing.T, dir string) string { return dir }},
		{name: "missing: created 0700", prepare: func(t *testing.T, dir string) string { return filepath.Join(dir, "new") }},
		{name: "another user's", refused: true, prepare: func(t *testing.T, dir string) string {
			chown(t, dir, 65534)
			return dir
		}},
		{name: "writable by others", refused: true, prepare: func(t *testing.T, dir string) string {
			chmod(t, dir, 0o777)
			return dir
		}},
		{name: "writable by its group", refused: true, prepare: func(t *testing.T, dir string) string {
			chmod(t, dir, 0o770)
			return dir
		}},
		{name: "sticky and writable by others", refused: true, prepare: func(t *testing.T, dir string) string {
			chmod(t, dir, 0o777|os.ModeSticky)
			return dir
		}},
		{name: "a symlink to this user's dir", refused: true, prepare: func(t *testing.T, dir string) string {
			link := filepath.Join(t.TempDir(), "state")
			if err := os.Symlink(dir, link); err != nil {
				t.Fatal(err)
			}
			return link
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			state := tc.prepare(t, dir)
			unlock, err := LockApply(context.Background(), state, 10*time.Millisecond)
			if !tc.refused {
				if err != nil {
					t.Fatalf("LockApply: %v", err)
				}
				unlock()
				if st, err := os.Stat(state); err != nil || st.Mode().Perm()&0o022 != 0 {
					t.Errorf("state dir %s: %v; want it closed to writers", state, err)
				} else if state != dir && st.Mode().Perm() != 0o700 {
					t.Errorf("state dir %s made with mode %v, want 0700", state, st.Mode())
				}
				return
			}
			if err == nil {
				unlock()
				t.Fatal("LockApply took the lock")
			}
			if !errors.Is(err, trust.ErrUntrusted) {
				t.Errorf("LockApply: %v, want it to say the state dir is not trusted", err)
			}
			if _, err := os.Lstat(filepath.Join(dir, ApplyLockName)); err == nil {
				t.Errorf("a lock file was made in the refused dir")
			}
		})
	}
}

func chown(t *testing.T, p string, uid int) {
	t.Helper()
	if err := os.Chown(p, uid, uid); err != nil {
		t.Fatal(err)
	}
}

func chmod(t *testing.T, p string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}
