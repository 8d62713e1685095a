package cliapp

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/cpuguy83/go-md2man/v2/md2man"
	"github.com/urfave/cli/v2"
)

// Doc is what a program's generated documents say beyond its flags and
// commands.
type Doc struct {
	// ExitStatus is each command's exit codes.
	ExitStatus map[string]string
	// OtherEnv are the variables that belong to no flag: name, meaning.
	OtherEnv [][2]string
	// Section is the man page's section; SeeAlso its SEE ALSO line.
	Section int
	SeeAlso string
	// ConfigIntro opens the configuration reference (markdown).
	ConfigIntro string
}

// loneStar is a '*' that is not part of a "**" bold marker.
var loneStar = regexp.MustCompile(`(^|[^*\\])\*([^*]|$)`)

// ManPage renders d's man page from the app's commands and flags: each
// flag with its variables and default, each command's description, EXIT
// STATUS and ENVIRONMENT. Help texts are plain text, so their lone
// '*' (kc-*.sock, KC_*, /run/user/*) and '<' are escaped before markdown
// takes them for emphasis or HTML.
func (d Doc) ManPage(app *cli.App) ([]byte, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "# NAME\n\n%s - %s\n\n", app.Name, app.Usage)
	fmt.Fprintf(&b, "# SYNOPSIS\n\n%s [GLOBAL OPTIONS] COMMAND [OPTIONS]\n\n", app.Name)
	fmt.Fprintf(&b, "# DESCRIPTION\n\n%s\n\n", app.Description)
	b.WriteString("# GLOBAL OPTIONS\n\n")
	manFlags(&b, visible(app.Flags))
	b.WriteString("# COMMANDS\n\n")
	for _, c := range documented(app) {
		fmt.Fprintf(&b, "## %s\n\n%s\n\n", c.Name, c.Usage)
		if c.Description != "" {
			fmt.Fprintf(&b, "%s\n\n", c.Description)
		}
		manFlags(&b, ownFlags(app, c))
	}
	b.WriteString("# EXIT STATUS\n\n")
	for _, c := range documented(app) {
		if st, ok := d.ExitStatus[c.Name]; ok {
			fmt.Fprintf(&b, "**%s**: %s\n\n", c.Name, st)
		}
	}
	b.WriteString("# ENVIRONMENT\n\nEvery option has a variable, shown next to it above; the option, when given, wins.\n\n")
	for _, f := range allFlags(app) {
		r := rowOf(f)
		if r.env != "" {
			fmt.Fprintf(&b, "**%s**: %s\n\n", r.env, strings.TrimSuffix(strings.Fields(r.names)[0], ","))
		}
	}
	for _, v := range d.OtherEnv {
		fmt.Fprintf(&b, "**%s**: %s\n\n", v[0], v[1])
	}
	fmt.Fprintf(&b, "# SEE ALSO\n\n%s\n", d.SeeAlso)
	md := b.String()
	// Twice: a match consumes the character after the star, so "a*b*c"
	// needs a second pass for the second star.
	md = loneStar.ReplaceAllString(md, `$1\*$2`)
	md = loneStar.ReplaceAllString(md, `$1\*$2`)
	md = strings.ReplaceAll(md, "_", `\_`)
	md = strings.ReplaceAll(md, "<", `\<`) // /proc/<pid>: not an HTML tag
	md = fmt.Sprintf("%% %s %d\n", app.Name, d.Section) + md
	return md2man.Render([]byte(md)), nil
}

// manFlags writes one paragraph per flag: names, placeholder, meaning,
// default and variables.
func manFlags(b *strings.Builder, flags []cli.Flag) {
	for _, f := range flags {
		r := rowOf(f)
		fmt.Fprintf(b, "**%s**: %s", r.names, r.usage)
		if r.def != "" {
			fmt.Fprintf(b, " (default: %s)", r.def)
		}
		if r.env != "" {
			fmt.Fprintf(b, " [$%s]", strings.ReplaceAll(r.env, ", ", ", $"))
		}
		b.WriteString("\n\n")
	}
}

// allFlags are the app's flags, then every command's own, each name once.
func allFlags(app *cli.App) []cli.Flag {
	seen := map[string]bool{}
	var out []cli.Flag
	add := func(fs []cli.Flag) {
		for _, f := range fs {
			if n := f.Names()[0]; !seen[n] {
				seen[n] = true
				out = append(out, f)
			}
		}
	}
	add(visible(app.Flags))
	for _, c := range documented(app) {
		add(ownFlags(app, c))
	}
	return out
}

// flagRow is one flag as the generated documents show it.
type flagRow struct {
	names, env, def, usage string
}

// rowOf is f as the documents show it.
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
		switch f.(type) {
		case *cli.DurationFlag:
			r.names += " DURATION"
		case *cli.IntFlag:
			r.names += " N"
		default:
			r.names += " " + placeholder(d.GetUsage())
		}
	}
	r.env = strings.Join(d.GetEnvVars(), ", ")
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

// mdCell is s in a markdown table cell.
func mdCell(s string) string {
	if s == "" {
		return "—"
	}
	return strings.ReplaceAll(s, "|", `\|`)
}

// flagTable writes flags as a markdown table.
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

// ConfigDoc renders the configuration reference in markdown: d's
// introduction, the global flags, each command's own with its exit
// status, the other variables.
func (d Doc) ConfigDoc(app *cli.App) string {
	var b strings.Builder
	b.WriteString(d.ConfigIntro)
	b.WriteString("## Global options\n\nEvery command takes these, before or after its name.\n\n")
	flagTable(&b, visible(app.Flags))
	// A flag several commands share (the scan's, the probing's) is
	// described under the first of them and named under the others.
	firstIn := map[string]string{}
	for _, c := range documented(app) {
		fmt.Fprintf(&b, "\n## %s\n\n%s.\n\n", c.Name, strings.TrimSuffix(c.Usage, "."))
		var fresh []cli.Flag
		seenIn := map[string][]string{}
		var seenOrder []string
		for _, f := range ownFlags(app, c) {
			r := rowOf(f)
			key := r.names + "\x00" + r.env + "\x00" + r.def + "\x00" + r.usage
			if cmd, ok := firstIn[key]; ok {
				if _, ok := seenIn[cmd]; !ok {
					seenOrder = append(seenOrder, cmd)
				}
				seenIn[cmd] = append(seenIn[cmd], "`--"+f.Names()[0]+"`")
				continue
			}
			firstIn[key] = c.Name
			fresh = append(fresh, f)
		}
		if len(fresh) > 0 {
			flagTable(&b, fresh)
			b.WriteString("\n")
		}
		for _, cmd := range seenOrder {
			fmt.Fprintf(&b, "Also, as under [%s](#%s): %s.\n\n", cmd, cmd, strings.Join(seenIn[cmd], ", "))
		}
		if st, ok := d.ExitStatus[c.Name]; ok {
			fmt.Fprintf(&b, "Exit status: %s\n", st)
		}
	}
	b.WriteString("\n## Other variables\n\n")
	for _, v := range d.OtherEnv {
		fmt.Fprintf(&b, "- `%s`: %s\n", v[0], v[1])
	}
	return b.String()
}
