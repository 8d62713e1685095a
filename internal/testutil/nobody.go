package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// Nobody is the UID and GID tests run a process of another, unprivileged
// user as.
const Nobody = 65534

// NobodyCredential is Nobody's, without the caller's supplementary
// groups (root's would let it read what nobody may not).
func NobodyCredential() *syscall.Credential {
	return &syscall.Credential{Uid: Nobody, Gid: Nobody, Groups: []uint32{}}
}

// OpenTempDir makes a directory of the given mode in os.TempDir(), removed
// when t ends. t.TempDir's parent is 0700, closed to another user. One
// that others may write is sticky: no one removes or renames another's
// files in it.
func OpenTempDir(t testing.TB, prefix string, mode os.FileMode) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if mode&0o002 != 0 {
		mode |= os.ModeSticky
	}
	// MkdirTemp's 0700 is under the umask's reach; Chmod is not.
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	return dir
}

// SelfAsNobody returns a command that runs a copy of the running test
// binary, made as the new file name in dir (a directory nobody can reach:
// OpenTempDir; a name already there fails t),
// as Nobody, running no test: the package's TestMain (or init) finds its
// task in the environment, which is this process's plus env.
func SelfAsNobody(t testing.TB, dir, name string, env ...string) *exec.Cmd {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, name)
	if err := CopyNew(self, exe, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: NobodyCredential()}
	return cmd
}
