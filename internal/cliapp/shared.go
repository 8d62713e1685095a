package cliapp

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
)

// A global flag is given to the app and to every command, so that it can
// be typed before or after the command name; urfave/cli/v2 keeps a copy
// of it at each position and a command sees only its own. The Shared
// functions resolve which copy the user typed. A flag typed on the
// command line beats the environment at either position: urfave/cli
// reports a copy the environment filled as "set" too, so a copy whose
// value differs from the environment's is the one the user typed; the
// command's own copy (the environment's value, or the default) is taken
// when neither was typed. flags are the global flags, for their
// variables.

// SharedString resolves a global string flag.
func SharedString(c *cli.Context, name string, flags []cli.Flag) string {
	return typed(c, name, flags, func(lc *cli.Context, env string) bool {
		return lc.String(name) == env
	}).String(name)
}

// SharedBool resolves a global boolean flag.
func SharedBool(c *cli.Context, name string, flags []cli.Flag) bool {
	return typed(c, name, flags, func(lc *cli.Context, env string) bool {
		// urfave/cli reads an empty variable as false.
		b := false
		if env != "" {
			var err error
			if b, err = strconv.ParseBool(env); err != nil {
				return false
			}
		}
		return lc.Bool(name) == b
	}).Bool(name)
}

// SharedDuration resolves a global duration flag.
func SharedDuration(c *cli.Context, name string, flags []cli.Flag) time.Duration {
	return typed(c, name, flags, func(lc *cli.Context, env string) bool {
		d, err := time.ParseDuration(env)
		return err == nil && lc.Duration(name) == d
	}).Duration(name)
}

// SharedSlice resolves a global repeatable flag, its values trimmed and
// empty ones left out.
func SharedSlice(c *cli.Context, name string, flags []cli.Flag) []string {
	return values(typed(c, name, flags, func(lc *cli.Context, env string) bool {
		// urfave/cli splits a variable's value at commas.
		return slices.Equal(values(lc.StringSlice(name)), values(strings.Split(env, ",")))
	}).StringSlice(name))
}

func values(vs []string) []string {
	var out []string
	for _, v := range vs {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// typed returns the context whose copy of the flag name the user typed,
// or c. fromEnv says whether a copy holds what the environment gave it.
func typed(c *cli.Context, name string, flags []cli.Flag, fromEnv func(lc *cli.Context, env string) bool) *cli.Context {
	env, set := envValue(flags, name)
	for _, lc := range c.Lineage() {
		if lc.IsSet(name) && (!set || !fromEnv(lc, env)) {
			return lc
		}
	}
	return c
}

// envValue returns the value the environment gives the flag name.
func envValue(flags []cli.Flag, name string) (string, bool) {
	for _, f := range flags {
		df, ok := f.(cli.DocGenerationFlag)
		if !ok || !slices.Contains(namesOf(f), name) {
			continue
		}
		for _, ev := range df.GetEnvVars() {
			if v, ok := os.LookupEnv(ev); ok {
				return v, true
			}
		}
	}
	return "", false
}

// names is namesOf(f) without its cost: urfave/cli runs a regular
// expression over every name (to cut a v1 "name, alias" string), and
// the janitor's start-up looks its hundred flags up many times over, once
// per argument for a command line of a hundred --container values. The
// programs' flag types are named; any other falls back to Names().
// TestNamesAsUrfaveHasThem holds it to Names() for every flag.
func namesOf(f cli.Flag) []string {
	var name string
	var aliases []string
	switch f := f.(type) {
	case *cli.BoolFlag:
		name, aliases = f.Name, f.Aliases
	case *cli.StringFlag:
		name, aliases = f.Name, f.Aliases
	case *cli.StringSliceFlag:
		name, aliases = f.Name, f.Aliases
	case *cli.DurationFlag:
		name, aliases = f.Name, f.Aliases
	case *cli.IntFlag:
		name, aliases = f.Name, f.Aliases
	default:
		return f.Names()
	}
	return append([]string{name}, aliases...)
}
