package doctor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/trust"
)

// StateDir checks the janitor's state dir: present, a directory, writable
// (a file is created and removed), not writable by others (the ledger
// names processes to kill), and every ledger record readable.
func StateDir(dir string) Check {
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return missingStateDir(dir)
	case err != nil:
		return newCheck(NameStateDir, Error, "%v", err)
	case !st.IsDir():
		return newCheck(NameStateDir, Error, "%s is not a directory", dir)
	}
	euid := uint32(os.Geteuid())
	// As ledger.LockApply will find it: a state dir another user could
	// hold or swap makes every --apply run refuse to act.
	var lst unix.Stat_t
	if err := unix.Lstat(dir, &lst); err == nil {
		if err := trust.Stat(dir, &lst, unix.S_IFDIR, false, euid); err != nil {
			c := newCheck(NameStateDir, Error, "%v: --apply runs refuse it, so nothing is reaped", err)
			c.Remedy = fmt.Sprintf("make it a directory (not a symlink) of UID %d, mode 0700", euid)
			return c
		}
	}
	var items []string
	verdict := OK
	for _, d := range []string{dir, filepath.Join(dir, "containers")} {
		if err := probeWritable(d); err != nil {
			if errors.Is(err, fs.ErrNotExist) && d != dir {
				continue // the hook creates it with the first record
			}
			return newCheck(NameStateDir, Error, "%s is not writable: %v", d, err)
		}
		if err := unix.Lstat(d, &lst); err == nil {
			if err := trust.Stat(d, &lst, unix.S_IFDIR, false, euid); err != nil {
				verdict = Warn
				items = append(items, fmt.Sprintf("%v: others could change the ledger, which names processes to kill (want UID %d's, 0700)", err, euid))
			}
		}
	}
	store, err := ledger.OpenReadOnly(dir)
	if errors.Is(err, trust.ErrUntrusted) {
		// The hook and reconcile do not use it: trees only its records
		// tie to a container are not found, and nothing is recorded.
		c := newCheck(NameStateDir, Error, "%v", err)
		c.Remedy = fmt.Sprintf("make %s and %s directories (not symlinks) of UID %d that others may not write (0700), under directories of root or UID %d", dir, filepath.Join(dir, "containers"), euid, euid)
		c.Items = items
		return c
	}
	if err != nil {
		c := newCheck(NameStateDir, verdict, "%s writable; no ledger records yet", dir)
		c.Items = items
		return c
	}
	recs, errs := store.List()
	current := 0
	for _, r := range recs {
		if store.Current(r) {
			current++
		}
	}
	for _, e := range errs {
		verdict = Warn
		items = append(items, "unreadable record: "+e.Error())
	}
	detail := fmt.Sprintf("%s writable; %s (%d from this boot)", dir, plural(len(recs), "ledger record", "ledger records"), current)
	if len(errs) > 0 {
		detail += fmt.Sprintf("; %d unreadable (reconcile ignores them)", len(errs))
	}
	c := newCheck(NameStateDir, verdict, "%s", detail)
	if len(errs) > 0 {
		// A record of a newer schema is a janitor older than its hook.
		c.Remedy = "upgrade kc-janitor to kc-hook's version where the items say \"written by a newer kc-watchman\"; else remove the records listed (their containers lose what the ledger knew of their trees)"
	}
	c.Items = items
	return c
}

// probeWritable creates and removes a file in dir.
func probeWritable(dir string) error {
	f, err := os.CreateTemp(dir, ".doctor-probe-*")
	if err != nil {
		return err
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}

// missingStateDir says whether kc-hook, running as the same user, can
// create dir on its first run. A rootless user's default lives in
// /run/user/<uid>, which only exists while logind keeps a session (or
// lingering) for them.
func missingStateDir(dir string) Check {
	// The nearest ancestor that exists is where creation would start.
	parent := filepath.Dir(dir)
	st, err := os.Stat(parent)
	for errors.Is(err, fs.ErrNotExist) && parent != "/" {
		parent = filepath.Dir(parent)
		st, err = os.Stat(parent)
	}
	switch {
	case err != nil:
		return newCheck(NameStateDir, Error, "%s does not exist and kc-hook cannot create it: %v", dir, err)
	case !st.IsDir():
		return newCheck(NameStateDir, Error, "%s does not exist and kc-hook cannot create it: %s is not a directory", dir, parent)
	}
	if missing := filepath.Dir(dir); missing != parent {
		c := newCheck(NameStateDir, Error, "%s does not exist and kc-hook cannot create it: %s does not exist", dir, missing)
		if strings.HasPrefix(missing, "/run/user/") {
			c.Items = []string{"there is no login session for this user: `loginctl enable-linger` keeps /run/user/<uid>, or create it (mode 0700, owned by the user) at boot"}
		}
		return c
	}
	if err := unix.Access(parent, unix.W_OK|unix.X_OK); err != nil {
		return newCheck(NameStateDir, Error, "%s does not exist and kc-hook (uid %d) cannot create it: %s: %v", dir, os.Geteuid(), parent, err)
	}
	c := newCheck(NameStateDir, Warn, "%s does not exist: kc-hook creates it on its first run; until then reconcile has no ledger", dir)
	c.Remedy = "start a container with the hook installed, or run kc-janitor reconcile, which creates it"
	return c
}
