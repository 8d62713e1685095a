package main

import "github.com/urfave/cli/v2"

// superviseCommand runs a supervisor tied to a container's init process
// (the prevention layer, DESIGN §7).
func superviseCommand() *cli.Command {
	return &cli.Command{
		Name:      "supervise",
		Usage:     "run COMMAND as a supervisor that dies with the container (not implemented yet)",
		ArgsUsage: "CONTAINER-ID INIT-PID INIT-START-TICKS -- COMMAND...",
		Action: func(c *cli.Context) error {
			return cli.Exit("kc-hook supervise: not implemented yet", exitFailed)
		},
	}
}
