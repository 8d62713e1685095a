package main

import "github.com/urfave/cli/v2"

func cullCommand() *cli.Command {
	return &cli.Command{
		Name:  "cull",
		Usage: "not implemented yet",
		Action: func(c *cli.Context) error {
			return cli.Exit("cull: not implemented yet", exitFailed)
		},
	}
}
