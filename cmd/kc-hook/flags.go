package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// option is one command-line option: its flag, the environment variable
// that stands in for the flag, and its line in --help. Exactly one of the
// destinations (str, dur, num, bit) is set.
type option struct {
	name  string
	alias string // a second name, for help and version only
	env   string // "" when the flag has none
	meta  string // placeholder in --help; "" shows "value" (nothing for a boolean)
	usage string
	shown string // the default as --help shows it, when not the value's own
	// noDefault hides the default in --help, where "(default: false)"
	// would only be noise.
	noDefault bool

	str    *string
	strDef string
	dur    *time.Duration
	durDef time.Duration
	num    *int
	numDef int
	bit    *bool
}

func helpOption(p *bool) option {
	return option{name: "help", alias: "h", usage: "show help", bit: p, noDefault: true}
}

func versionOption(p *bool) option {
	return option{name: "version", alias: "v", usage: "print the version", bit: p, noDefault: true}
}

// lookupEnv reads the environment. Tests replace it so that the tester's
// own KC_* variables cannot change their outcome. A variable set to ""
// counts as set.
var lookupEnv = os.LookupEnv

// newFlagSet registers opts with their defaults overridden by their
// environment variables, so that a flag on the command line beats its
// variable, which beats the default. A variable whose value does not parse
// is an error that names it, even when the flag is also given: the
// variable is wrong either way.
func newFlagSet(opts []option) (*flag.FlagSet, error) {
	fs := flag.NewFlagSet(hookName, flag.ContinueOnError)
	// Errors are returned and printed by the caller as one line; the flag
	// package would add its own usage.
	fs.SetOutput(io.Discard)
	for _, o := range opts {
		if err := o.register(fs); err != nil {
			return nil, err
		}
	}
	return fs, nil
}

func (o option) register(fs *flag.FlagSet) error {
	val, set := "", false
	if o.env != "" {
		val, set = lookupEnv(o.env)
	}
	// An empty variable sets a string (to "") but leaves a number or a
	// duration at its default, as urfave/cli did.
	bad := func(kind string, err error) error {
		return fmt.Errorf("could not parse %q as %s value from environment variable %q for flag %s: %w", val, kind, o.env, o.name, err)
	}
	names := []string{o.name}
	if o.alias != "" {
		names = append(names, o.alias)
	}
	switch {
	case o.str != nil:
		def := o.strDef
		if set {
			def = val
		}
		for _, n := range names {
			fs.StringVar(o.str, n, def, o.usage)
		}
	case o.dur != nil:
		def := o.durDef
		if set && val != "" {
			d, err := time.ParseDuration(val)
			if err != nil {
				return bad("duration", err)
			}
			def = d
		}
		for _, n := range names {
			fs.DurationVar(o.dur, n, def, o.usage)
		}
	case o.num != nil:
		def := o.numDef
		if set && val != "" {
			// Base 0, as the flag itself: 0x10 and 010 are numbers too.
			n, err := strconv.ParseInt(val, 0, 64)
			if err != nil {
				return bad("int", err)
			}
			def = int(n)
		}
		for _, n := range names {
			fs.IntVar(o.num, n, def, o.usage)
		}
	case o.bit != nil:
		def := false
		if set && val != "" {
			b, err := strconv.ParseBool(val)
			if err != nil {
				return bad("bool", err)
			}
			def = b
		}
		for _, n := range names {
			fs.BoolVar(o.bit, n, def, o.usage)
		}
	default:
		panic("kc-hook: option " + o.name + " has no destination")
	}
	return nil
}

// parse parses args, stopping at the first argument that is not a flag
// (or after "--"). Giving an option under both its names is refused, as
// urfave/cli did.
func parse(fs *flag.FlagSet, opts []option, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err // already names the flag: "invalid value … for flag -kill-grace"
	}
	seen := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { seen[f.Name] = true })
	for _, o := range opts {
		if o.alias != "" && seen[o.name] && seen[o.alias] {
			//lint:ignore ST1005 urfave/cli's wording, kept for whoever matches on it
			return errors.New("Cannot use two forms of the same flag: " + o.alias + " " + o.name)
		}
	}
	return nil
}

// optionLines is the OPTIONS section of a --help page: one line per
// option, its name and placeholder in one column, then what it does, its
// default and its variable ("[$KC_…]", which the reliability suite reads).
func optionLines(opts []option) string {
	heads := make([]string, len(opts))
	width := 0
	for i, o := range opts {
		h := "--" + o.name
		if o.alias != "" {
			h += ", -" + o.alias
		}
		switch {
		case o.bit != nil:
		case o.meta != "":
			h += " " + o.meta
		default:
			h += " value"
		}
		heads[i] = h
		width = max(width, len(h))
	}
	var b strings.Builder
	for i, o := range opts {
		fmt.Fprintf(&b, "   %-*s  %s", width, heads[i], o.usage)
		if d := o.defaultText(); d != "" {
			fmt.Fprintf(&b, " (default: %s)", d)
		}
		if o.env != "" {
			fmt.Fprintf(&b, " [$%s]", o.env)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// defaultText is the "(default: …)" of a --help line; "" leaves it out.
func (o option) defaultText() string {
	switch {
	case o.noDefault:
		return ""
	case o.shown != "":
		return o.shown
	case o.str != nil && o.strDef != "":
		return strconv.Quote(o.strDef)
	case o.dur != nil:
		return o.durDef.String()
	case o.num != nil:
		return strconv.Itoa(o.numDef)
	case o.bit != nil:
		return "false"
	}
	return ""
}

// indent indents every non-empty line of s by three spaces.
func indent(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = "   " + l
		}
	}
	return strings.Join(lines, "\n")
}
