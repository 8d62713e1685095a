package main

import "github.com/urfave/cli/v2"

func reconcileCommand() *cli.Command {
	return &cli.Command{
		Name:  "reconcile",
		Usage: "not implemented yet",
		Action: func(c *cli.Context) error {
			return cli.Exit("reconcile: not implemented yet", exitFailed)
		},
	}
}
