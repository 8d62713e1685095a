package main

import "github.com/urfave/cli/v2"

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "not implemented yet",
		Action: func(c *cli.Context) error {
			return cli.Exit("status: not implemented yet", exitFailed)
		},
	}
}
