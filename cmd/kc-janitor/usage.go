package main

import (
	"github.com/urfave/cli/v2"
)

// noStrayArgs refuses positional arguments for a command that takes none:
// `sweep /some/dir` would otherwise sweep the default directories and say
// nothing about the one that was meant.
func noStrayArgs(action cli.ActionFunc) cli.ActionFunc {
	return func(c *cli.Context) error {
		if c.Command.ArgsUsage == "" && c.NArg() > 0 {
			return usageErr("%s takes no arguments, but was given %q (options are written --name value; see kc-janitor %s --help)",
				c.Command.Name, c.Args().First(), c.Command.Name)
		}
		return action(c)
	}
}
