package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// lookupEnv reads the environment. Tests replace it so that the tester's
// own KC_* variables cannot change their outcome.
var lookupEnv = os.LookupEnv

// newFlagSet returns a flag set that prints nothing: its caller reports a
// usage error as one line (DESIGN "The outside"), not as the flag package's usage.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// parse sets fs's flags from their environment variables (env maps a flag
// to its variable), then from args, so that a flag beats its variable,
// which beats the default. A variable that does not parse is an error even
// when its flag is given: it is wrong either way. parse returns the
// arguments after the flags and whether the flags held -h or --help.
func parse(fs *flag.FlagSet, env map[string]string, args []string) (rest []string, help bool, err error) {
	fs.VisitAll(func(f *flag.Flag) {
		if g, ok := f.Value.(flag.Getter); ok {
			if _, done := g.(explained); !done {
				f.Value = explained{g}
			}
		}
	})
	fs.VisitAll(func(f *flag.Flag) {
		key := env[f.Name]
		if key == "" || err != nil {
			return
		}
		val, set := lookupEnv(key)
		// Setting the Value, not the FlagSet, keeps fs.Visit to what the
		// command line gave, which supervise's fallback to the global
		// flags relies on.
		_, isString := f.Value.(flag.Getter).Get().(string)
		// An empty variable empties a string but leaves a number, duration
		// or boolean at its default, as it always has.
		if !set || (val == "" && !isString) {
			return
		}
		if e := f.Value.Set(val); e != nil {
			err = fmt.Errorf("invalid value %q for $%s (--%s): %w", val, key, f.Name, e)
		}
	})
	if err == nil {
		if err = fs.Parse(args); err != nil && !errors.Is(err, flag.ErrHelp) {
			err = reworded(err)
		}
	}
	if errors.Is(err, flag.ErrHelp) {
		return nil, true, nil
	}
	return fs.Args(), false, err
}

// reworded names the flag in package flag's errors as it is typed
// (--kill-grace, -q), as kc-janitor's errors do: "-kill-grace" is no
// flag an operator wrote.
func reworded(err error) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: "); ok {
		name = strings.TrimLeft(name, "-")
		if name == checkSettingsFlag[2:] {
			return fmt.Errorf("%s must be the first argument, spelled exactly so", checkSettingsFlag)
		}
		return fmt.Errorf("unknown flag %s", dashed(name))
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: "); ok {
		return fmt.Errorf("%s needs a value", dashed(strings.TrimLeft(name, "-")))
	}
	for _, marker := range []string{" for flag -", " for -"} {
		i := strings.Index(msg, marker)
		if i < 0 {
			continue
		}
		name, why, ok := strings.Cut(msg[i+len(marker):], ": ")
		if !ok {
			break
		}
		return fmt.Errorf("%s for %s: %s", msg[:i], dashed(name), why)
	}
	return err
}

// dashed is a flag's name as it is typed: -q, --kill-grace.
func dashed(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// explained gives a flag's own parser's message for a value it refuses:
// package flag reports every refused number or duration as a bare "parse
// error", which leaves the operator to guess what is wrong with "5".
type explained struct{ flag.Getter }

func (e explained) Set(s string) error {
	// A bare number of seconds, as kc-janitor's durations take it.
	if _, isDur := e.Get().(time.Duration); isDur {
		if _, err := strconv.ParseFloat(strings.TrimSpace(s), 64); err == nil && !strings.ContainsAny(s, "eEnNiIxX") {
			s = strings.TrimSpace(s) + "s"
		}
	}
	err := e.Getter.Set(s)
	if err == nil {
		return nil
	}
	switch e.Get().(type) {
	case time.Duration:
		// time's own words: "missing unit", "invalid duration".
		if _, why := time.ParseDuration(s); why != nil {
			return why
		}
	case int:
		if _, why := strconv.ParseInt(s, 0, strconv.IntSize); why != nil {
			return errors.New("not a whole number")
		}
	case bool:
		if _, why := strconv.ParseBool(s); why != nil {
			return errors.New("want true or false")
		}
	}
	return err
}

// IsBoolFlag keeps -v working without a value.
func (e explained) IsBoolFlag() bool {
	b, ok := e.Getter.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// helpAsked reports whether args, the arguments after the flags, hold -h or
// --help before any "--": flag parsing stops at the first argument, and
// `kc-hook poststop --help` should still show help.
func helpAsked(args []string) bool {
	if i := slices.Index(args, "--"); i >= 0 {
		args = args[:i]
	}
	return slices.ContainsFunc(args, func(a string) bool {
		return a == "-h" || a == "-help" || a == "--help"
	})
}

// usageError reports a bad command line or variable and returns exit
// status 2.
func usageError(stderr io.Writer, cmd string, err error) int {
	fmt.Fprintf(stderr, "%s: %s (see %s --help)\n", cmd, oneLine(err), cmd)
	return exitBadInput
}

// oneLine is err's message on one line, whatever the flag package echoes
// back from argv.
func oneLine(err error) string {
	return strings.ReplaceAll(err.Error(), "\n", `\n`)
}

// helpWidth is the width help is wrapped at, as kc-janitor's.
const helpWidth = 80

// writeOptions lists fs's flags: name and placeholder in a column, then
// what it does, its default and its variable as [$KC_…] (the form the
// reliability suite reads back), wrapped at helpWidth under the start of
// the text. Flags without usage (help and version, which have two names)
// are left to the caller's extra lines, "NAMES\tTEXT".
func writeOptions(w io.Writer, fs *flag.FlagSet, env map[string]string, extra ...string) {
	type row struct {
		names string
		words []string
	}
	var rows []row
	fs.VisitAll(func(f *flag.Flag) {
		if f.Usage == "" {
			return
		}
		// The placeholder is named after the value's own type.
		bare := *f
		if e, ok := f.Value.(explained); ok {
			bare.Value = e.Getter
		}
		meta, usage := flag.UnquoteUsage(&bare)
		r := row{names: strings.TrimSpace("--" + f.Name + " " + meta), words: strings.Fields(usage)}
		// A zero default is either meaningless or explained by the usage.
		if d := f.DefValue; d != "" && d != "0s" && d != "false" {
			r.words = append(r.words, "(default: "+d+")")
		}
		if e := env[f.Name]; e != "" {
			r.words = append(r.words, "[$"+e+"]")
		}
		rows = append(rows, r)
	})
	for _, l := range extra {
		names, text, _ := strings.Cut(l, "\t")
		rows = append(rows, row{names: names, words: strings.Fields(text)})
	}
	width := 0
	for _, r := range rows {
		width = max(width, len(r.names))
	}
	col := 3 + width + 2
	for _, r := range rows {
		fmt.Fprintf(w, "   %-*s  %s\n", width, r.names, fill(r.words, col))
	}
}

// fill puts words on lines of at most helpWidth columns, the first
// starting at column indent and the others indented by as much; a word
// may hold spaces, and one longer than a line is left whole.
func fill(words []string, indent int) string {
	var b strings.Builder
	col := indent
	for i, word := range words {
		switch {
		case i == 0:
		case col+1+len(word) > helpWidth:
			b.WriteString("\n" + strings.Repeat(" ", indent))
			col = indent
		default:
			b.WriteByte(' ')
			col++
		}
		b.WriteString(word)
		col += len(word)
	}
	return b.String()
}
