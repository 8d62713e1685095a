package main

import (
	"slices"

	"github.com/urfave/cli/v2"

	"github.com/kc-watchman/kc-watchman/internal/cliapp"
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

// helpArg shows a command's help for "COMMAND help" (or "h"), as
// urfave/cli's help subcommand did, before anything is run; what follows
// the word is a usage error (audited as such).
func helpArg(action cli.ActionFunc) cli.ActionFunc {
	return func(c *cli.Context) error {
		if first := c.Args().First(); first == "help" || first == "h" {
			if c.NArg() > 1 {
				return usageErr("%s %s takes nothing after it, but was given %q (see kc-janitor %s --help)",
					c.Command.Name, first, c.Args().Get(1), c.Command.Name)
			}
			if l := c.Lineage(); len(l) > 1 {
				return cli.ShowCommandHelp(l[1], c.Command.Name)
			}
		}
		return action(c)
	}
}

// notRead are the flags a command accepts with a shared set but does not
// read: its help does not list them (status never signals anything nor
// writes the ledger, so --kill-grace, --max-reap and --ledger-retention
// mean nothing to it).
var notRead = map[string][]string{
	"status": {"kill-grace", "max-reap", "ledger-retention"},
}

// ownHelp leaves in a command's help only the flags it reads and that are
// its own: the global flags every command also takes (global, by name)
// are described once, in kc-janitor --help, and accepted after the
// command name all the same.
func ownHelp(c *cli.Command, global map[string]bool) {
	cliapp.HideFlags(c, func(name string) bool {
		return global[name] || slices.Contains(notRead[c.Name], name)
	})
}
