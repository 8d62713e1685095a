package doctor

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"time"
)

// settingsTimeout bounds one kc-hook settings check: it parses and exits.
const settingsTimeout = 5 * time.Second

// settingsRefused starts kc-hook's answer to --check-settings when it
// cannot use what the descriptor gives it.
const settingsRefused = "kc-hook: settings refused: "

// HookSettings runs the descriptor's kc-hook as the runtime would — its
// path, its args, exactly its env and no other — with --check-settings
// first, and returns why kc-hook refuses them, or "" when it accepts them
// or cannot tell (a kc-hook older than the check, another program). A
// pre-start stage only warns of settings it cannot use, on a stderr the
// runtime throws away; this is how an operator hears of it.
func HookSettings(ctx context.Context, d Descriptor) string {
	if d.Path == "" {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, settingsTimeout)
	defer cancel()
	argv := []string{d.Path, "--check-settings"}
	if len(d.Args) > 0 {
		argv = append([]string{d.Args[0], "--check-settings"}, d.Args[1:]...)
	}
	cmd := exec.CommandContext(ctx, d.Path)
	cmd.Args = argv
	// Non-nil, so that nothing of doctor's own environment is inherited.
	cmd.Env = append([]string{}, d.Env...)
	cmd.Dir = "/"
	out := &capped{max: 4 << 10}
	cmd.Stdout = out
	cmd.WaitDelay = time.Second
	_ = cmd.Run() // the answer is on stdout; its exit status only repeats it
	line, _, _ := bytes.Cut(out.buf.Bytes(), []byte("\n"))
	if why, ok := strings.CutPrefix(string(line), settingsRefused); ok {
		return why
	}
	return ""
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
