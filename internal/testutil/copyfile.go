package testutil

import (
	"io"
	"os"
	"syscall"
)

// CopyFile copies src to dst, creating dst with mode or truncating it.
// Tests copy binaries (a test binary, busybox, a fake supervisor) to
// where another user, a rootfs or a chosen comm needs them.
func CopyFile(src, dst string, mode os.FileMode) error {
	return copyFile(src, dst, mode, os.O_TRUNC)
}

// CopyNew copies src to a new file dst, never through a name another
// user placed there first: what a test copies as root into a directory
// open to all.
func CopyNew(src, dst string, mode os.FileMode) error {
	return copyFile(src, dst, mode, os.O_EXCL|syscall.O_NOFOLLOW)
}

func copyFile(src, dst string, mode os.FileMode, flags int) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|flags, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
