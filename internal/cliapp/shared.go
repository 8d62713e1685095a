package cliapp

import (
	"os"
	"strings"

	"github.com/urfave/cli/v2"
)

// SharedString resolves a global flag given either after the command name
// (the command's own copy) or before it (the app's copy); urfave/cli/v2
// would otherwise only ever see the command's copy. A flag typed on the
// command line beats the environment at either position: urfave/cli
// reports both as "set", so a copy whose value differs from the
// environment's is the one the user typed. flags are the global flags,
// for their variables.
func SharedString(c *cli.Context, name string, flags []cli.Flag) string {
	env, fromEnv := envValue(flags, name)
	for _, lc := range c.Lineage() {
		if lc.IsSet(name) && (!fromEnv || lc.String(name) != env) {
			return lc.String(name)
		}
	}
	return c.String(name)
}

// SharedBool is SharedString for a boolean global flag: set at either
// position.
func SharedBool(c *cli.Context, name string) bool {
	for _, lc := range c.Lineage() {
		if lc.IsSet(name) && lc.Bool(name) {
			return true
		}
	}
	return false
}

// envValue returns the value the environment gives the flag name.
func envValue(flags []cli.Flag, name string) (string, bool) {
	for _, f := range flags {
		sf, ok := f.(*cli.StringFlag)
		if !ok || sf.Name != name {
			continue
		}
		for _, ev := range sf.EnvVars {
			if v, ok := os.LookupEnv(ev); ok {
				return v, true
			}
		}
	}
	return "", false
}

// SharedSlice is SharedString for a repeatable flag: the innermost
// position that set it wins.
func SharedSlice(c *cli.Context, name string) []string {
	for _, lc := range c.Lineage() {
		if lc.IsSet(name) {
			var out []string
			for _, v := range lc.StringSlice(name) {
				if v = strings.TrimSpace(v); v != "" {
					out = append(out, v)
				}
			}
			return out
		}
	}
	return nil
}
