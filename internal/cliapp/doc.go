package cliapp

import (
	"fmt"
	"slices"
	"strings"

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

// ManPage renders d's man page from the app's commands and flags: each
// flag with its variables and default, each command's description, EXIT
// STATUS and ENVIRONMENT. It writes roff itself: help texts are plain
// text (a markdown converter took their '*' and '_', kc-*.sock and KC_*,
// for emphasis), and the converter's package initialisation cost every
// run of the janitor, man page or not, a tenth of a millisecond or more.
func (d Doc) ManPage(app *cli.App) ([]byte, error) {
	var m man
	m.line(fmt.Sprintf(`.TH %s %d "" "kc-watchman" "System Administration"`, roffEscape(strings.ToUpper(app.Name)), d.Section))
	// Option names must not be hyphenated, nor long paths spread lines.
	m.line(".nh")
	m.line(".ad l")
	m.line(".SH NAME")
	m.text(app.Name + " - " + app.Usage)
	m.line(".SH SYNOPSIS")
	m.text(app.Name + " [GLOBAL OPTIONS] COMMAND [OPTIONS]")
	m.line(".SH DESCRIPTION")
	m.text(app.Description)
	m.line(".SH GLOBAL OPTIONS")
	m.flags(visible(app.Flags))
	m.line(".SH COMMANDS")
	for _, c := range documented(app) {
		m.line(".SS " + roffEscape(c.Name))
		m.text(c.Usage)
		if c.Description != "" {
			m.line(".PP")
			m.text(c.Description)
		}
		m.flags(ownFlags(app, c))
	}
	m.line(".SH EXIT STATUS")
	for _, c := range documented(app) {
		if st, ok := d.ExitStatus[c.Name]; ok {
			m.item(c.Name, st)
		}
	}
	m.line(".SH ENVIRONMENT")
	m.text("Every option has a variable, shown next to it above; the option, when given, wins.")
	for _, f := range allFlags(app) {
		r := rowOf(f)
		if r.env != "" {
			m.item(r.env, strings.TrimSuffix(strings.Fields(r.names)[0], ","))
		}
	}
	for _, v := range d.OtherEnv {
		m.item(v[0], v[1])
	}
	m.line(".SH SEE ALSO")
	m.text(d.SeeAlso)
	return []byte(m.String()), nil
}

// man builds a roff document.
type man struct{ strings.Builder }

// line writes a request as it is.
func (m *man) line(s string) {
	m.WriteString(s)
	m.WriteByte('\n')
}

// text writes plain text; a blank line in it starts a new paragraph.
func (m *man) text(s string) { m.paras(s, ".PP") }

// paras writes plain text, sep between its paragraphs.
func (m *man) paras(s, sep string) {
	s = strings.TrimSpace(s)
	if s == "" {
		return
	}
	for i, para := range strings.Split(s, "\n\n") {
		if i > 0 {
			m.line(sep)
		}
		for _, l := range strings.Split(para, "\n") {
			m.line(roffLine(l))
		}
	}
}

// item writes a tagged paragraph: the tag in bold, then the body.
func (m *man) item(tag, body string) {
	m.line(".TP")
	m.line(`\fB` + roffEscape(tag) + `\fR`)
	// .PP would end the tag's indent.
	m.paras(body, ".IP")
}

// flags writes a tagged paragraph per flag: its names and placeholder;
// its meaning, default and variables.
func (m *man) flags(flags []cli.Flag) {
	for _, f := range flags {
		r := rowOf(f)
		body := r.usage
		if r.def != "" {
			body += " (default: " + r.def + ")"
		}
		if r.env != "" {
			body += " [$" + strings.ReplaceAll(r.env, ", ", ", $") + "]"
		}
		m.item(r.names, body)
	}
}

// roffEscape makes s print as it is written: a backslash starts an
// escape, and a plain '-' may print as a hyphen, which breaks an option
// name pasted from the page.
func roffEscape(s string) string {
	return strings.NewReplacer(`\`, `\e`, "-", `\-`).Replace(s)
}

// roffLine is s as a line of text: one that starts with a dot or an
// apostrophe would be read as a request.
func roffLine(s string) string {
	s = roffEscape(s)
	if strings.HasPrefix(s, ".") || strings.HasPrefix(s, "'") {
		s = `\&` + s
	}
	return s
}

// allFlags are the app's flags, then every command's own, each name once.
func allFlags(app *cli.App) []cli.Flag {
	seen := map[string]bool{}
	var out []cli.Flag
	add := func(fs []cli.Flag) {
		for _, f := range fs {
			if n := namesOf(f)[0]; !seen[n] {
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
	var spelled []string
	for _, n := range namesOf(f) {
		if len(n) == 1 {
			spelled = append(spelled, "-"+n)
		} else {
			spelled = append(spelled, "--"+n)
		}
	}
	r.names = strings.Join(spelled, ", ")
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
		if slices.Contains(namesOf(f), "help") {
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
		global[namesOf(f)[0]] = true
	}
	var out []cli.Flag
	for _, f := range visible(c.Flags) {
		if !global[namesOf(f)[0]] {
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
				seenIn[cmd] = append(seenIn[cmd], "`--"+namesOf(f)[0]+"`")
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
