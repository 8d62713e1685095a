package main

import (
	"errors"
	"os"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/kc-watchman/kc-watchman/internal/cliapp"
	"github.com/kc-watchman/kc-watchman/internal/janitor"
)

// auditLogEnv names, per command, the seed scripts' variable giving its
// log file when --log-file is not set.
var auditLogEnv = map[string]string{
	"sweep": "KC_SWEEPER_LOG",
	"cull":  "KC_CULLER_LOG",
}

// withAudit wraps a command's action so that a run that fails leaves a
// line in its log file whatever stage it failed at: a usage error before
// the log was opened (a container name no engine knows), a container that
// is not running, an engine that cannot be asked. The line carries the
// error, the container asked for and the exit code.
func withAudit(name string, action cli.ActionFunc) cli.ActionFunc {
	return func(c *cli.Context) error {
		err := action(c)
		code := exitCodeOf(err)
		if code == exitOK || code == stoppedBy(syscall.SIGINT) || code == stoppedBy(syscall.SIGTERM) {
			// A watch stopped by a signal logged its stop itself.
			return err
		}
		file := sharedString(c, flagLogFile)
		if env := auditLogEnv[name]; file == "" && env != "" {
			file = os.Getenv(env)
		}
		if file == "" {
			return err
		}
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		if code == exitUsage {
			// As stderr says it: by the variable, where one gave the value.
			msg = cliapp.FromEnv(c.App, commandLine(c), msg)
		}
		if msg == "" {
			msg = "see the records above"
		}
		attrs := []any{"exit", code, "err", msg}
		if ct := containerAsked(c); ct != "" {
			attrs = append(attrs, "container", ct)
		}
		l := janitor.Log{File: file, JSON: sharedString(c, flagLogFormat) == "json"}
		// A usage error may be the log file itself, already said on stderr.
		if aerr := janitor.AppendFailure(l, name, attrs...); aerr != nil && code != exitUsage {
			warnf(c, "%v", aerr)
		}
		return err
	}
}

// exitCodeOf is the exit status run gives err.
func exitCodeOf(err error) int {
	if err == nil {
		return exitOK
	}
	var ec cli.ExitCoder
	if errors.As(err, &ec) {
		return ec.ExitCode()
	}
	return exitUsage
}

// containerAsked is the --container value(s) of c's command, as given.
func containerAsked(c *cli.Context) string {
	if !hasFlag(c.Command, flagContainer) {
		return ""
	}
	if v := c.StringSlice(flagContainer); len(v) > 0 {
		return strings.Join(v, ",")
	}
	return c.String(flagContainer)
}

func hasFlag(cmd *cli.Command, name string) bool {
	if cmd == nil {
		return false
	}
	for _, f := range cmd.Flags {
		for _, n := range f.Names() {
			if n == name {
				return true
			}
		}
	}
	return false
}

// stoppedBy is the exit status of a watch stopped by sig.
func stoppedBy(sig syscall.Signal) int { return 128 + int(sig) }

// auditParseError leaves the audit line of a run whose command line could
// not be parsed (an unknown flag): no flag was read, so the log file is
// the one the environment names (KC_LOG_FILE, or the command's seed
// variable), in the environment's log format.
func auditParseError(name, msg string) {
	file := os.Getenv("KC_LOG_FILE")
	if env := auditLogEnv[name]; file == "" && env != "" {
		file = os.Getenv(env)
	}
	attrs := []any{"exit", exitUsage, "err", msg}
	if ct := os.Getenv("KC_CONTAINER"); ct != "" {
		attrs = append(attrs, "container", ct)
	}
	// Best effort: the usage error itself is said on stderr.
	_ = janitor.AppendFailure(janitor.Log{File: file, JSON: os.Getenv("KC_LOG_FORMAT") == "json"}, name, attrs...)
}
