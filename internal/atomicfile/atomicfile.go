// Package atomicfile replaces a file so that a reader sees the old content
// or the new, never part of either, and the new survives a crash once
// Write returns: kc-hook's ledger records and kc-janitor's metrics file.
package atomicfile

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Write writes data to a new file in dir, named by pattern (as
// os.CreateTemp takes it), with mode, syncs it, renames it over path and
// syncs dir. The temporary file is created with O_EXCL, so a name planted
// there beforehand, symlink included, is never opened; the rename
// replaces whatever is at path without following it. what names the file
// in errors ("ledger record").
func Write(dir, pattern, path string, data []byte, mode os.FileMode, what string) error {
	tmp, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return fmt.Errorf("writing %s: %w", what, err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", what, err)
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", what, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("syncing %s: %w", what, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", what, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("committing %s: %w", what, err)
	}
	if err := SyncDir(dir); err != nil {
		return fmt.Errorf("syncing the directory of %s: %w", what, err)
	}
	return nil
}

// SyncDir makes a rename in dir durable. A filesystem that cannot sync a
// directory (EINVAL) has nothing to make durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, unix.EINVAL) {
		return err
	}
	return nil
}
