package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/kc-watchman/kc-watchman/internal/cliapp"
)

// exitStatus is each command's exit codes, shown at the end of its help,
// in the man page and in docs/COMMANDS.md's generated twin,
// docs/CONFIGURATION.md: the one place they are written. A usage error
// is 2 everywhere.
var exitStatus = map[string]string{
	"reconcile": "0 ok (nothing stray, all reaped, or a dry run); 1 a tree would not die, or another error; 2 usage error; 3 ground truth unknown (no engine could be asked, or the wrong store was): nothing was touched.",
	"sweep":     "0 ok; 1 an unlink failed, a socket directory could not be read, or the --container named is not running (or its engine's init may not be its); 2 usage errors and a --container that matches nothing or several; 3 no engine could be asked to resolve --container.",
	"cull":      "0 ok; 1 a supervisor or socket directory unreadable or not audited in time (the others still reported), or the --container named not running (or its engine's init may not be its); 2 usage errors and a --container that matches nothing or several; 3 no engine could be asked to resolve --container.",
	"doctor":    "0 all ok; 1 the worst verdict is WARN, or the report or the metrics file could not be written; 2 it is ERROR, or a usage error; 3 no engine could be asked to resolve --container.",
	"status":    "0, whatever it finds; 1 its report or --metrics-file cannot be written; 2 usage errors and a --container that matches nothing or several; 3 no engine could be asked to resolve --container.",
	"watch":     "130 or 143 when stopped by SIGINT or SIGTERM (after the current round); with --once the round's worst: 0 ok, 1 a step failed, 3 ground truth unknown; 2 usage error; 3 no engine could be asked to resolve --container at start.",
	"version":   "0; 2 usage error.",
}

// withExitStatus appends a command's exit codes to its description.
func withExitStatus(c *cli.Command) {
	st, ok := exitStatus[c.Name]
	if !ok {
		return
	}
	if c.Description != "" {
		c.Description += "\n\n"
	}
	c.Description += "Exit status: " + st
}

// configDocCommand prints docs/CONFIGURATION.md, generated from the flag
// definitions; a test fails when the committed file differs.
func configDocCommand() *cli.Command {
	return &cli.Command{
		Name:   "config-doc",
		Usage:  "print docs/CONFIGURATION.md (markdown), generated from the flags",
		Hidden: true,
		Action: func(c *cli.Context) error {
			_, err := fmt.Fprint(c.App.Writer, docs.ConfigDoc(c.App))
			return err
		},
	}
}

// docs is what the man page and docs/CONFIGURATION.md say beyond the
// flags and commands.
var docs = cliapp.Doc{
	ExitStatus: exitStatus,
	OtherEnv:   otherEnv,
	Section:    8,
	SeeAlso:    "kc-hook(8), podman(1), oci-hooks(5), and docs/ in the source tree.",
	ConfigIntro: "<!-- Generated from kc-janitor's flag definitions by `make docs`; do not edit by hand. -->\n" +
		"# Configuration\n\n" +
		"Every kc-janitor option, its environment variable and its default. A flag\n" +
		"given on the command line beats its variable, which beats the default. A\n" +
		"duration takes a Go duration (`90s`, `5m`, `1h30m`) or a number of seconds.\n" +
		"The systemd units read the variables from `/etc/default/kc-janitor`.\n" +
		"kc-hook's options are in `kc-hook --help` and kc-hook(8); the commands\n" +
		"themselves in [COMMANDS.md](COMMANDS.md).\n\n",
}

// otherEnv are the variables that belong to no flag.
var otherEnv = [][2]string{
	{"KC_SWEEPER_LOG", "sweep's log file when --log-file is not given (as in the seed kc-sweeper.sh); every run appends its summary"},
	{"KC_CULLER_LOG", "cull's log file when --log-file is not given (as in the seed kc-culler.sh); every run appends its summary"},
	{"CONTAINER_HOST", "podman's API URL (unix:// or tcp://; anything else exits 2) when --podman-url is not given"},
	{"DOCKER_HOST", "the Docker Engine API URL when --docker-url is not given"},
	{"JOURNAL_STREAM", "set by systemd when stderr is the journal: log lines then carry no time= (journald stamps them)"},
}
