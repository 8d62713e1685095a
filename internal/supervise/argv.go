package supervise

import (
	"fmt"
	"strconv"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/containerid"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// Spec is what a wrapper is for: a container, the identity of its init
// process, and the command to run.
type Spec struct {
	ContainerID string
	Init        fingerprint.Stat // PID and StartTicks
	Command     []string
}

// WrapperFlags are the `kc-hook supervise` options the hook passes.
type WrapperFlags struct {
	StateDir     string
	KillGrace    time.Duration
	MaxRestarts  int
	RestartDelay time.Duration
	PdeathSig    string
}

// Argv builds the wrapper's command line:
//
//	EXE --state-dir=DIR --kill-grace=D supervise --max-restarts=N
//	    --restart-delay=D --pdeathsig=SIG CONTAINER-ID INIT-PID INIT-START-TICKS -- COMMAND...
//
// Every flag is one "--name=value" element, so the container ID is a whole
// element of argv (the janitor's anchor rule) and ParseArgv can find the
// positional arguments without knowing the flags.
func Argv(exe string, f WrapperFlags, s Spec) []string {
	argv := []string{exe}
	if f.StateDir != "" {
		argv = append(argv, "--state-dir="+f.StateDir)
	}
	if f.KillGrace > 0 {
		argv = append(argv, "--kill-grace="+f.KillGrace.String())
	}
	argv = append(argv, "supervise",
		"--max-restarts="+strconv.Itoa(f.MaxRestarts))
	if f.RestartDelay > 0 {
		argv = append(argv, "--restart-delay="+f.RestartDelay.String())
	}
	if f.PdeathSig != "" {
		argv = append(argv, "--pdeathsig="+f.PdeathSig)
	}
	argv = append(argv, s.ContainerID, strconv.Itoa(s.Init.PID), strconv.FormatUint(s.Init.StartTicks, 10), "--")
	return append(argv, s.Command...)
}

// ParseArgv recognises the argv of a running wrapper (as read from
// /proc/<pid>/cmdline) and returns its Spec. The first "--" element
// follows the three positional arguments; "supervise" precedes them.
func ParseArgv(argv []string) (Spec, error) {
	var s Spec
	sep := -1
	for i, a := range argv {
		if a == "--" {
			sep = i
			break
		}
	}
	if sep < 4 {
		return s, fmt.Errorf("not a kc-hook supervise command line: %q", argv)
	}
	seen := false
	for _, a := range argv[1 : sep-3] {
		if a == "supervise" {
			seen = true
		}
	}
	if !seen {
		return s, fmt.Errorf("not a kc-hook supervise command line: %q", argv)
	}
	return ParseArgs(argv[sep-3:sep], argv[sep+1:])
}

// ParseArgs validates the three positional arguments of `kc-hook
// supervise` and the command after "--".
func ParseArgs(pos, command []string) (Spec, error) {
	var s Spec
	if len(pos) != 3 {
		return s, fmt.Errorf("want CONTAINER-ID INIT-PID INIT-START-TICKS before --, got %q", pos)
	}
	if !containerid.Valid(pos[0]) {
		return s, fmt.Errorf("container id %.80q is not 64 lowercase hex characters", pos[0])
	}
	pid, err := strconv.Atoi(pos[1])
	if err != nil || pid <= 1 {
		return s, fmt.Errorf("init pid %.20q is not a process ID above 1", pos[1])
	}
	ticks, err := strconv.ParseUint(pos[2], 10, 64)
	if err != nil || ticks == 0 {
		return s, fmt.Errorf("init start ticks %.30q is not a positive number", pos[2])
	}
	if len(command) == 0 {
		return s, fmt.Errorf("no command after --")
	}
	s.ContainerID = pos[0]
	s.Init = fingerprint.Stat{PID: pid, StartTicks: ticks}
	s.Command = command
	return s, nil
}
