package main

import "github.com/urfave/cli/v2"

func watchCommand() *cli.Command {
	return &cli.Command{
		Name:  "watch",
		Usage: "not implemented yet",
		Action: func(c *cli.Context) error {
			return cli.Exit("watch: not implemented yet", exitFailed)
		},
	}
}
