package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"
)

// exitStatus is each command's exit codes, shown at the end of its help,
// in the man page and in docs/COMMANDS.md's generated twin,
// docs/CONFIGURATION.md. A usage error is 2 everywhere.
var exitStatus = map[string]string{
	"reconcile": "0 ok (nothing stray, all reaped, or a dry run); 1 a tree would not die, or another error; 2 usage error; 3 ground truth unknown (no engine could be asked): nothing was touched.",
	"sweep":     "0 ok; 1 an unlink failed, a socket directory could not be read or --container could not be resolved; 2 usage error.",
	"cull":      "0 ok; 1 a supervisor could not be read (the others are still reported); 2 usage error.",
	"doctor":    "0 all ok; 1 the worst verdict is WARN; 2 it is ERROR, or a usage error.",
	"status":    "0, whatever it finds; 2 usage error.",
	"watch":     "0 when stopped by SIGTERM or SIGINT; with --once the round's worst: 0 ok, 1 a step failed, 3 ground truth unknown; 2 usage error.",
	"version":   "0; 2 usage error.",
}

// withExitStatus appends a command's exit codes to its description unless
// the description already states them.
func withExitStatus(c *cli.Command) {
	st, ok := exitStatus[c.Name]
	if !ok || strings.Contains(c.Description, "Exit status:") {
		return
	}
	if c.Description != "" {
		c.Description += "\n\n"
	}
	c.Description += "Exit status: " + st
}

// configDocCommand prints docs/CONFIGURATION.md, generated from the flag
// definitions; a test fails when the committed file differs.
func configDocCommand() *cli.Command {
	return &cli.Command{
		Name:   "config-doc",
		Usage:  "print docs/CONFIGURATION.md (markdown), generated from the flags",
		Hidden: true,
		Action: func(c *cli.Context) error {
			_, err := fmt.Fprint(c.App.Writer, configDoc(c.App))
			return err
		},
	}
}

// flagRow is one flag as the generated documents show it.
type flagRow struct {
	names, env, def, usage string
}

func rowOf(f cli.Flag) flagRow {
	var r flagRow
	var names []string
	for _, n := range f.Names() {
		if len(n) == 1 {
			names = append(names, "-"+n)
		} else {
			names = append(names, "--"+n)
		}
	}
	r.names = strings.Join(names, ", ")
	d, ok := f.(cli.DocGenerationFlag)
	if !ok {
		return r
	}
	if d.TakesValue() {
		if _, isDur := f.(*cli.DurationFlag); isDur {
			r.names += " DURATION"
		} else {
			r.names += " " + placeholder(d.GetUsage())
		}
	}
	var env []string
	for _, e := range d.GetEnvVars() {
		env = append(env, e)
	}
	r.env = strings.Join(env, ", ")
	r.def = strings.Trim(d.GetDefaultText(), `"`)
	if _, isBool := f.(*cli.BoolFlag); r.def == "[]" || isBool && r.def == "false" {
		r.def = "" // an unset switch needs no default
	}
	r.usage = strings.ReplaceAll(d.GetUsage(), "`", "")
	return r
}

// placeholder is the word a usage string marks with backquotes, else VALUE.
func placeholder(usage string) string {
	if _, rest, ok := strings.Cut(usage, "`"); ok {
		if p, _, ok := strings.Cut(rest, "`"); ok {
			return p
		}
	}
	return "VALUE"
}

// visible returns the flags that are not hidden, without --help.
func visible(flags []cli.Flag) []cli.Flag {
	var out []cli.Flag
	for _, f := range flags {
		if vf, ok := f.(cli.VisibleFlag); ok && !vf.IsVisible() {
			continue
		}
		if slices.Contains(f.Names(), "help") {
			continue
		}
		out = append(out, f)
	}
	return out
}

// ownFlags are a command's flags that are not global.
func ownFlags(app *cli.App, c *cli.Command) []cli.Flag {
	global := map[string]bool{}
	for _, f := range app.Flags {
		global[f.Names()[0]] = true
	}
	var out []cli.Flag
	for _, f := range visible(c.Flags) {
		if !global[f.Names()[0]] {
			out = append(out, f)
		}
	}
	return out
}

// documented are the commands the documents describe, in their order.
func documented(app *cli.App) []*cli.Command {
	var out []*cli.Command
	for _, c := range app.Commands {
		if !c.Hidden && c.Name != "help" {
			out = append(out, c)
		}
	}
	return out
}

func mdCell(s string) string {
	if s == "" {
		return "—"
	}
	return strings.ReplaceAll(s, "|", `\|`)
}

func flagTable(b *strings.Builder, flags []cli.Flag) {
	b.WriteString("| flag | environment | default | meaning |\n|---|---|---|---|\n")
	for _, f := range flags {
		r := rowOf(f)
		env := ""
		if r.env != "" {
			env = "`" + strings.ReplaceAll(r.env, ", ", "`, `") + "`"
		}
		def := ""
		if r.def != "" {
			def = "`" + r.def + "`"
		}
		fmt.Fprintf(b, "| `%s` | %s | %s | %s |\n", r.names, mdCell(env), mdCell(def), mdCell(r.usage))
	}
}

// configDoc renders docs/CONFIGURATION.md.
func configDoc(app *cli.App) string {
	var b strings.Builder
	b.WriteString("<!-- Generated from kc-janitor's flag definitions by `make docs`; do not edit by hand. -->\n")
	b.WriteString("# Configuration\n\n")
	b.WriteString("Every kc-janitor option, its environment variable and its default. A flag\n" +
		"given on the command line beats its variable, which beats the default. A\n" +
		"duration takes a Go duration (`90s`, `5m`, `1h30m`) or a number of seconds.\n" +
		"The systemd units read the variables from `/etc/default/kc-janitor`.\n" +
		"kc-hook's options are in `kc-hook --help` and kc-hook(8); the commands\n" +
		"themselves in [COMMANDS.md](COMMANDS.md).\n\n")
	b.WriteString("## Global options\n\nEvery command takes these, before or after its name.\n\n")
	flagTable(&b, visible(app.Flags))
	for _, c := range documented(app) {
		fmt.Fprintf(&b, "\n## %s\n\n%s.\n\n", c.Name, strings.TrimSuffix(c.Usage, "."))
		if own := ownFlags(app, c); len(own) > 0 {
			flagTable(&b, own)
			b.WriteString("\n")
		}
		if st, ok := exitStatus[c.Name]; ok {
			fmt.Fprintf(&b, "Exit status: %s\n", st)
		}
	}
	b.WriteString("\n## Other variables\n\n")
	for _, v := range otherEnv {
		fmt.Fprintf(&b, "- `%s`: %s\n", v[0], v[1])
	}
	return b.String()
}

// otherEnv are the variables that belong to no flag.
var otherEnv = [][2]string{
	{"KC_SWEEPER_LOG", "sweep's log file when --log-file is not given (as in the seed kc-sweeper.sh); every run appends its summary"},
	{"KC_CULLER_LOG", "cull's log file when --log-file is not given (as in the seed kc-culler.sh); every run appends its summary"},
	{"CONTAINER_HOST", "podman's API URL when --podman-url is not given"},
	{"DOCKER_HOST", "the Docker Engine API URL when --docker-url is not given"},
	{"JOURNAL_STREAM", "set by systemd when stderr is the journal: log lines then carry no time= (journald stamps them)"},
}
