package doctor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// settingsTimeout bounds one kc-hook settings check: it parses and exits.
const settingsTimeout = 5 * time.Second

// settingsRefused starts kc-hook's answer to --check-settings when it
// cannot use what the descriptor gives it.
const settingsRefused = "kc-hook: settings refused: "

// hookSettings runs the descriptor's kc-hook as the runtime would — its
// path, its args, exactly its env and no other — with --check-settings
// first, and returns why kc-hook refuses them. A pre-start stage only
// warns of settings it cannot use, on a stderr the runtime throws away;
// this is how an operator hears of it.
//
// It runs only a kc-hook (by path or argv[0]) that no other user could
// have written: doctor runs as root, and a descriptor's file name alone
// makes it kc-hook's. The stage argument is given as poststop, whose
// settings are every stage's: a kc-hook older than the check refuses the
// flag there without a trace line, and is taken as "cannot tell" ("",
// nil). err says the program could not be run or did not answer.
func hookSettings(ctx context.Context, d Descriptor) (refused string, err error) {
	if len(d.Args) < 2 || !runnableHook(d) {
		return "", nil
	}
	ctx, cancel := context.WithTimeout(ctx, settingsTimeout)
	defer cancel()
	argv := append([]string{d.Args[0], "--check-settings"}, d.Args[1:len(d.Args)-1]...)
	cmd := exec.CommandContext(ctx, d.Path)
	cmd.Args = append(argv, "poststop")
	// Non-nil, so that nothing of doctor's own environment is inherited.
	cmd.Env = append([]string{}, d.Env...)
	cmd.Dir = "/"
	out := &capped{max: 4 << 10}
	// Pipes, not /dev/null, which a chroot (the package's test) may lack.
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(""), out, io.Discard
	// Whatever it starts goes with it when it overstays.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	runErr := cmd.Run()
	line, _, _ := bytes.Cut(out.buf.Bytes(), []byte("\n"))
	if why, ok := strings.CutPrefix(string(line), settingsRefused); ok {
		return why, nil
	}
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return "", fmt.Errorf("%s --check-settings did not answer within %s", d.Path, settingsTimeout)
	case runErr != nil && !errors.As(runErr, &exit):
		return "", fmt.Errorf("cannot run %s: %w", d.Path, runErr)
	}
	return "", nil
}

// runnableHook reports whether d names a kc-hook that only root or this
// user could have written.
func runnableHook(d Descriptor) bool {
	if filepath.Base(d.Path) != HookName && filepath.Base(d.Args[0]) != HookName {
		return false
	}
	fi, err := os.Stat(d.Path)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o022 != 0 {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && (st.Uid == 0 || int(st.Uid) == os.Geteuid())
}

// capped keeps the first max bytes written to it and drops the rest: a
// program that is not kc-hook may write anything.
type capped struct {
	buf bytes.Buffer
	max int
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.buf.Len(); room > 0 {
		c.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
