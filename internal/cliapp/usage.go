package cliapp

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/urfave/cli/v2"
)

// UnknownCommand words the error for a first argument that names no
// command, with the nearest command name when one is close.
func UnknownCommand(app *cli.App, name string) string {
	msg := fmt.Sprintf("%q is not a %s command", name, app.Name)
	var names []string
	for _, c := range app.Commands {
		if c.Name != "help" {
			names = append(names, c.Name)
		}
	}
	if best := nearest(name, names); best != "" {
		return msg + fmt.Sprintf("; did you mean %s?", best)
	}
	return msg + fmt.Sprintf(" (see %s --help)", app.Name)
}

// nearest is the one of names a typo of name most likely meant: the
// fewest edits away (two at most), or the first that name abbreviates;
// "" when none is close.
func nearest(name string, names []string) string {
	best, bestDist := "", 3 // farther than two edits is no typo
	for _, n := range names {
		d := editDistance(name, n)
		if strings.HasPrefix(n, name) && len(name) >= 3 {
			d = 0
		}
		if d < bestDist {
			best, bestDist = n, d
		}
	}
	return best
}

// UnknownFlag words the error for a flag the command being parsed does
// not take, with the nearest flag it does take when one is close: its
// own, or a global one. name is as the flag package reports it, without
// dashes.
func UnknownFlag(c *cli.Context, name string) string {
	msg := "unknown flag " + Dashed(name)
	if c == nil || c.App == nil || c.Command == nil {
		return msg + " (see --help)"
	}
	// The root command is the app itself: no command of that name.
	cmd := c.App.Command(c.Command.Name)
	var names []string
	for _, n := range flagNames(c.App, cmd) {
		names = append(names, strings.TrimPrefix(n, "--"))
	}
	if best := nearest(strings.TrimLeft(name, "-"), names); best != "" {
		return msg + fmt.Sprintf("; did you mean --%s?", best)
	}
	help := c.App.Name
	if cmd != nil {
		help += " " + cmd.Name
	}
	return msg + fmt.Sprintf(" (see %s --help)", help)
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// The expressions below are compiled when first needed (a usage error),
// not at every start of the programs.
var (
	// A flag's name after "for flag" (urfave/cli's words for a variable
	// it could not parse, without dashes) or "for -" (package flag's).
	goFlagName   = compiled(`\b(?:for flag -{0,2}|for -{1,2})([A-Za-z0-9][A-Za-z0-9_-]*)`)
	undefinedArg = compiled(`^flag provided but not defined: -{1,2}(.*)$`)
	missingValue = compiled(`^flag needs an argument: -{1,2}(.*)$`)
)

// compiled returns a function that compiles expr on its first call.
func compiled(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}

// DurationHint is what every duration flag accepts, as usage errors say.
const DurationHint = "want a duration such as 90s, 5m or 1h30m, or a number of seconds"

// UsageMessage rewords the flag package's errors: flags by the name they
// are typed with (--min-age, not -min-age), and a refused value with what
// would be accepted instead of a bare "parse error".
func UsageMessage(err error, cmds []*cli.Command) string {
	return UsageMessageIn(nil, err, cmds)
}

// UsageMessageIn is UsageMessage for an error met while parsing the
// command of c (the app's own flags when c is the app's): an unknown
// flag is worded by UnknownFlag, with the flag it likely meant.
func UsageMessageIn(c *cli.Context, err error, cmds []*cli.Command) string {
	msg := err.Error()
	if m := undefinedArg().FindStringSubmatch(msg); m != nil {
		return UnknownFlag(c, m[1])
	}
	if m := missingValue().FindStringSubmatch(msg); m != nil {
		return fmt.Sprintf("%s needs a value", Dashed(m[1]))
	}
	var name string
	if m := goFlagName().FindStringSubmatch(msg); m != nil {
		name = m[1]
	}
	msg = goFlagName().ReplaceAllStringFunc(msg, func(s string) string {
		return "for " + Dashed(goFlagName().FindStringSubmatch(s)[1])
	})
	hints := map[string]string{"duration": DurationHint, "bool": "want true or false", "int": "want a whole number"}
	if hint, ok := hints[flagKind(cmds, name)]; ok && (strings.Contains(msg, "invalid") || strings.Contains(msg, "could not parse")) {
		if i := strings.Index(msg, "for "+Dashed(name)); i >= 0 {
			msg = msg[:i+4+len(Dashed(name))] + ": " + hint
		}
	}
	return strings.ReplaceAll(msg, "\n", " ")
}

// Dashed is a flag's name as it is typed: -q, --min-age.
func Dashed(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// flagKind is "duration", "bool", "int" or "" for the flag name, looked up
// in the flags of cmds.
func flagKind(cmds []*cli.Command, name string) string {
	if name == "" {
		return ""
	}
	for _, c := range cmds {
		for _, f := range c.Flags {
			if !slices.Contains(namesOf(f), name) {
				continue
			}
			switch f.(type) {
			case *cli.DurationFlag:
				return "duration"
			case *cli.BoolFlag:
				return "bool"
			case *cli.IntFlag, *cli.Int64Flag, *cli.UintFlag:
				return "int"
			}
			return ""
		}
	}
	return ""
}

// NormalizeDurations gives every duration flag the same forms --idle
// always took: a Go duration (90s, 1h30m) or a bare number of seconds.
// Bare numbers on the command line and in the flags' KC_* variables get
// an "s", so urfave/cli's parser sees a duration. It returns a copy.
func NormalizeDurations(app *cli.App, args []string) []string {
	names := map[string]bool{}
	collect := func(flags []cli.Flag) {
		for _, f := range flags {
			if d, ok := f.(*cli.DurationFlag); ok {
				for _, n := range namesOf(d) {
					names[n] = true
				}
				for _, ev := range d.EnvVars {
					if v, ok := os.LookupEnv(ev); ok && isBareNumber(v) {
						os.Setenv(ev, strings.TrimSpace(v)+"s")
					}
				}
			}
		}
	}
	collect(app.Flags)
	for _, c := range app.Commands {
		collect(c.Flags)
	}
	out := slices.Clone(args)
	for i := 1; i < len(out); i++ {
		a := out[i]
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, val, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !names[name] {
			continue
		}
		switch {
		case hasValue && isBareNumber(val):
			out[i] = a + "s"
		case !hasValue && i+1 < len(out) && isBareNumber(out[i+1]):
			out[i+1] += "s"
			i++
		}
	}
	return out
}

// isBareNumber says whether s is a plain decimal number.
func isBareNumber(s string) bool {
	s = strings.TrimSpace(s)
	if s == "" {
		return false
	}
	_, err := strconv.ParseFloat(s, 64)
	return err == nil && !strings.ContainsAny(s, "eEnNiIxX") // not 1e3, NaN, Inf, 0x10
}

// leadingFlag is the flag a usage message starts with: "--format must be …".
var leadingFlag = compiled(`^--([a-z0-9][a-z0-9-]*)`)

// commandLine is what a scan of the arguments finds: the command named
// (nil for none), whether the version flag came before it, and the flags
// typed, by every name they have.
type commandLine struct {
	cmd     *cli.Command
	version bool
	typed   map[string]bool
}

// scan reads args (without the program name) as urfave/cli will: the
// app's flags, the command, then the command's flags; a flag's value is
// skipped, so that a value such as "--" or "--x" is not read as a flag.
func scan(app *cli.App, args []string) commandLine {
	cl := commandLine{typed: map[string]bool{}}
	flags := app.Flags
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			if cl.cmd != nil {
				continue // an argument of the command
			}
			if cl.cmd = app.Command(a); cl.cmd == nil {
				break
			}
			flags = cl.cmd.Flags
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if cl.cmd == nil && cli.VersionFlag != nil && slices.Contains(cli.VersionFlag.Names(), name) {
			on, err := strconv.ParseBool(value)
			cl.version = !hasValue || (err == nil && on)
			continue
		}
		for _, f := range flags {
			if !slices.Contains(namesOf(f), name) {
				continue
			}
			for _, n := range namesOf(f) {
				cl.typed[n] = true
			}
			if _, isBool := f.(*cli.BoolFlag); !isBool && !hasValue {
				i++
			}
			break
		}
	}
	return cl
}

// Typed reports whether args (without the program name) hold the flag
// name, before or after the command name.
func Typed(app *cli.App, args []string, name string) bool {
	return scan(app, args).typed[name]
}

// FromEnv names the variable a refused value came from: a message that
// starts with a flag the command line (args, without the program name)
// does not hold, while one of that flag's variables (the command's own
// flag's, where the command has one of that name) is set, starts with the
// variable instead: "$KC_FORMAT (--format) must be …". An operator who
// never typed --format looks for it in the unit's environment file, not
// in the cron line.
func FromEnv(app *cli.App, args []string, msg string) string {
	m := leadingFlag().FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	cl := scan(app, args)
	if cl.typed[m[1]] {
		return msg
	}
	flags := app.Flags
	if cl.cmd != nil {
		flags = append(slices.Clone(cl.cmd.Flags), flags...)
	}
	for _, f := range flags {
		if !slices.Contains(namesOf(f), m[1]) {
			continue
		}
		if ev, ok := f.(interface{ GetEnvVars() []string }); ok {
			for _, e := range ev.GetEnvVars() {
				if _, set := os.LookupEnv(e); set {
					return "$" + e + " (" + m[0] + ")" + msg[len(m[0]):]
				}
			}
		}
		break
	}
	return msg
}

// VersionWithCommand finds a command after the version flag (args without
// the program name): urfave/cli prints the version and runs nothing, so
// `kc-janitor -v reconcile`, -v meant as "verbose", would exit 0 having
// done nothing.
func VersionWithCommand(app *cli.App, args []string) (string, bool) {
	cl := scan(app, args)
	if cl.version && cl.cmd != nil {
		return cl.cmd.Name, true
	}
	return "", false
}

// CommandIn returns the name of the command args (without the program
// name) run, or "" when they name none.
func CommandIn(app *cli.App, args []string) string {
	if cl := scan(app, args); cl.cmd != nil {
		return cl.cmd.Name
	}
	return ""
}
