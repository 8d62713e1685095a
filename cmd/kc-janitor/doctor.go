package main

import "github.com/urfave/cli/v2"

func doctorCommand() *cli.Command {
	return &cli.Command{
		Name:  "doctor",
		Usage: "not implemented yet",
		Action: func(c *cli.Context) error {
			return cli.Exit("doctor: not implemented yet", exitFailed)
		},
	}
}
