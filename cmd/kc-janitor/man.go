package main

import (
	"fmt"

	"github.com/urfave/cli/v2"
)

// manCommand prints the man page generated from the app's own commands and
// flags, so it never drifts from --help. `make install` installs it.
func manCommand() *cli.Command {
	return &cli.Command{
		Name:   "man",
		Usage:  "print the kc-janitor(8) man page (roff)",
		Hidden: true,
		Action: func(c *cli.Context) error {
			page, err := docs.ManPage(c.App)
			if err != nil {
				return cli.Exit(fmt.Sprintf("man: %v", err), exitFailed)
			}
			_, err = c.App.Writer.Write(page)
			return err
		},
	}
}
