package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/kc-watchman/kc-watchman/internal/cliapp"
)

// flagValues lists the values of flags that take one of a fixed set, for
// completion. A flag added elsewhere with a fixed set adds its line here.
var flagValues = map[string][]string{
	flagFormat:    {"text", "json"},
	flagLogFormat: {"text", "json"},
	flagLogLevel:  {"debug", "info", "warn", "error"},
	"bpf":         {"auto", "on", "off"},
	flagEngine:    {"auto", "podman", "docker", "containerd", "cri"},
}

// flagLists lists what may follow a comma in the flags that take a list
// (auto stands alone).
var flagLists = map[string][]string{
	flagEngine: {"podman", "docker", "containerd", "cri"},
}

// completionCommand prints a shell completion script. Both scripts ask the
// binary (kc-janitor __complete ...) for candidates, with stdin closed.
func completionCommand() *cli.Command {
	return &cli.Command{
		Name:      "completion",
		Usage:     "print a shell completion script: bash or zsh",
		ArgsUsage: "bash|zsh",
		Hidden:    true,
		Action: func(c *cli.Context) error {
			script, ok := cliapp.Script(c.Args().First(), c.App.Name)
			if !ok {
				return usageErr("completion: want bash or zsh, not %q", c.Args().First())
			}
			_, err := fmt.Fprint(c.App.Writer, script)
			return err
		},
	}
}
