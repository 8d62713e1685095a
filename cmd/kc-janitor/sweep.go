package main

import "github.com/urfave/cli/v2"

func sweepCommand() *cli.Command {
	return &cli.Command{
		Name:  "sweep",
		Usage: "not implemented yet",
		Action: func(c *cli.Context) error {
			return cli.Exit("sweep: not implemented yet", exitFailed)
		},
	}
}
