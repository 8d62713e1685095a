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
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/headbuf"
	"github.com/kc-watchman/kc-watchman/internal/pgkill"
	"github.com/kc-watchman/kc-watchman/internal/trust"
)

// settingsTimeout bounds one kc-hook settings check: it parses and exits.
const settingsTimeout = 5 * time.Second

// settingsRefused starts kc-hook's answer to --check-settings when it
// cannot use what the descriptor gives it.
const settingsRefused = "kc-hook: settings refused: "

var (
	// errCannotRun: the program could not be executed at all.
	errCannotRun = errors.New("cannot run")
	// errNotChecked: doctor would not run the program (runnableHook).
	errNotChecked = errors.New("settings not checked")
	// errNotKCHook: the descriptor runs a program not named kc-hook.
	errNotKCHook = errors.New("not kc-hook")
)

// hookSettings runs the descriptor's kc-hook as the runtime would — its
// path, its args, exactly its env and no other — with --check-settings
// first, and returns why kc-hook refuses them. A pre-start stage only
// warns of settings it cannot use, on a stderr the runtime throws away;
// this is how an operator hears of it.
//
// It runs only a kc-hook (by its path's name) that no other user could
// have written (runnableHook; errNotChecked says why not): doctor runs as
// root, and a descriptor's file name alone makes it kc-hook's. The stage
// argument is given as poststop, whose
// settings are every stage's: a kc-hook older than the check refuses the
// flag there without a trace line, and is taken as "cannot tell" ("",
// nil). err says the program could not be run or did not answer.
func hookSettings(ctx context.Context, d Descriptor) (refused string, err error) {
	if len(d.Args) < 2 {
		return "", nil
	}
	if err := runnableHook(d); err != nil {
		return "", fmt.Errorf("%w: %w", errNotChecked, err)
	}
	ctx, cancel := context.WithTimeout(ctx, settingsTimeout)
	defer cancel()
	argv := append([]string{d.Args[0], "--check-settings"}, d.Args[1:len(d.Args)-1]...)
	cmd := exec.Command(d.Path)
	cmd.Args = append(argv, "poststop")
	// Non-nil, so that nothing of doctor's own environment is inherited.
	cmd.Env = append([]string{}, d.Env...)
	cmd.Dir = "/"
	out := &headbuf.Buffer{Max: 4 << 10}
	// Pipes, not /dev/null, which a chroot (the package's test) may lack.
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(""), out, io.Discard
	// Whatever it starts goes with it, when it overstays and when it exits.
	cmd.WaitDelay = time.Second
	timedOut, runErr := pgkill.RunOwnGroup(ctx, cmd)
	line, _, _ := bytes.Cut(out.Bytes(), []byte("\n"))
	if why, ok := strings.CutPrefix(string(line), settingsRefused); ok {
		return why, nil
	}
	var exit *exec.ExitError
	switch {
	case timedOut:
		return "", fmt.Errorf("%s --check-settings did not answer within %s", d.Path, settingsTimeout)
	case errors.Is(runErr, exec.ErrWaitDelay):
		// Something it started left its group and kept the output open.
		return "", fmt.Errorf("%s --check-settings left a process holding its output", d.Path)
	case runErr != nil && !errors.As(runErr, &exit):
		return "", fmt.Errorf("%w %s: %w", errCannotRun, d.Path, runErr)
	}
	return "", nil
}

// runnableHook says why doctor will not run the descriptor's program:
// it is not kc-hook by name (a wrapper may do anything), or the program,
// the descriptor that gives its env, or a directory either is reached
// through could have been written or swapped by a user other than root
// or this one. The runtime runs it as root all the same, so the latter
// is a hole in itself.
func runnableHook(d Descriptor) error {
	owners := []uint32{0, uint32(os.Geteuid())}
	file, err := filepath.Abs(d.File)
	if err == nil {
		_, err = trust.Path(file, unix.S_IFREG, owners...)
	}
	if err != nil {
		return fmt.Errorf("the descriptor: %w", err)
	}
	// Before the name: the runtime runs a wrapper as root too.
	resolved, err := trust.Path(d.Path, unix.S_IFREG, owners...)
	if err != nil {
		return err
	}
	if filepath.Base(d.Path) != HookName {
		return fmt.Errorf("%w: %s", errNotKCHook, d.Path)
	}
	if filepath.Base(resolved) != HookName {
		return fmt.Errorf("%w: %s leads to %s", errNotKCHook, d.Path, resolved)
	}
	return nil
}
