package cliapp

import (
	"io"
	"reflect"
	"strings"

	"github.com/urfave/cli/v2"
)

// HelpWidth is the width --help is wrapped at: an operator's terminal, a
// mail from cron, a ticket.
const HelpWidth = 80

// flagColumn is the widest flag name (with its placeholder) the options
// list keeps on the line of its usage; a longer one gets a line of its own.
const flagColumn = 26

// appHelp is the program's help: its global options, each described once.
const appHelp = `NAME:
   {{template "helpNameTemplate" .}}

USAGE:
   {{.HelpName}} [global options] command [command options]{{if .Version}}{{if not .HideVersion}}

VERSION:
   {{.Version}}{{end}}{{end}}{{if .Description}}

DESCRIPTION:
   {{wrap .Description 3}}{{end}}{{if .VisibleCommands}}

COMMANDS:{{template "visibleCommandTemplate" .}}{{end}}{{if .VisibleFlags}}

GLOBAL OPTIONS:
{{flagList .VisibleFlags}}{{end}}

Every command takes the global options, before or after its name;
{{.HelpName}} COMMAND --help lists the command's own options.
`

// commandHelp is a command's help: its own options, and where the global
// ones are described.
const commandHelp = `NAME:
   {{template "helpNameTemplate" .}}

USAGE:
   {{.HelpName}} [options]{{if .ArgsUsage}} {{.ArgsUsage}}{{end}}{{if .Description}}

DESCRIPTION:
   {{wrap .Description 3}}{{end}}{{if .VisibleFlags}}

OPTIONS:
{{flagList .VisibleFlags}}{{end}}

GLOBAL OPTIONS:
   See {{program .HelpName}} --help (--format, --engine, --state-dir, --log-file, ...);
   they may come before or after the command name.
`

// InstallHelp makes urfave/cli print help an operator reads: wrapped at
// HelpWidth, each option's usage beside its name with a hanging indent, the
// global options described once in the program's help and pointed to from
// each command's. A command's help lists only the options its own help
// shows (see HideFlags).
func InstallHelp() {
	cli.HelpPrinter = printHelp
}

func printHelp(w io.Writer, templ string, data any) {
	switch templ {
	case cli.AppHelpTemplate:
		templ = appHelp
	case cli.CommandHelpTemplate, cli.SubcommandHelpTemplate:
		// The second is what --help of a command without a help
		// subcommand (HideHelpCommand) is printed with. No command here
		// has subcommands, whose list commandHelp would not show.
		templ = commandHelp
	}
	cli.HelpPrinterCustom(w, templ, data, map[string]any{
		"wrapAt":   func() int { return HelpWidth },
		"flagList": FlagList,
		"program":  func(helpName string) string { return strings.Fields(helpName + " ?")[0] },
	})
}

// FlagList renders flags as the help lists them: name and placeholder in
// a column, then what the flag does, its default and its variables,
// wrapped at HelpWidth under the start of the text.
func FlagList(flags []cli.Flag) string {
	rows := make([]flagRow, len(flags))
	width := 0
	for i, f := range flags {
		rows[i] = rowOf(f)
		if n := len(rows[i].names); n <= flagColumn && n > width {
			width = n
		}
	}
	col := 3 + width + 2
	var b strings.Builder
	for i, r := range rows {
		if i > 0 {
			b.WriteByte('\n')
		}
		// The default and the variables are never split over two lines.
		words := strings.Fields(r.usage)
		if r.def != "" {
			words = append(words, "(default: "+r.def+")")
		}
		if r.env != "" {
			words = append(words, "[$"+strings.ReplaceAll(r.env, ", ", ", $")+"]")
		}
		b.WriteString("   " + r.names)
		if len(r.names) > width {
			b.WriteString("\n" + strings.Repeat(" ", col))
		} else {
			b.WriteString(strings.Repeat(" ", col-3-len(r.names)))
		}
		b.WriteString(fill(words, col, HelpWidth))
	}
	return b.String()
}

// Wrap fills text's words into lines of at most width columns, the first
// starting at column indent (already written) and the others indented by
// as much. A word longer than a line is left whole.
func Wrap(text string, indent, width int) string {
	return fill(strings.Fields(text), indent, width)
}

// fill is Wrap for words already split; a word may hold spaces.
func fill(words []string, indent, width int) string {
	var b strings.Builder
	pad := strings.Repeat(" ", indent)
	col := indent
	for i, word := range words {
		switch {
		case i == 0:
		case col+1+len(word) > width:
			b.WriteString("\n" + pad)
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

// HideFlags hides from c's help the flags named by hide, which it still
// accepts: a command's copies of the global flags (the program's help
// describes them once) and the flags it takes with a shared set but does
// not read.
func HideFlags(c *cli.Command, hide func(name string) bool) {
	for _, f := range c.Flags {
		if hide(namesOf(f)[0]) {
			setHidden(f)
		}
	}
}

// setHidden hides f. The flag types the programs use are named: looking
// the field up by reflection for each of a hundred flags was a twentieth
// of the janitor's start-up. Any other type of urfave/cli has the field
// too; a flag without one is left visible.
func setHidden(f cli.Flag) {
	switch f := f.(type) {
	case *cli.BoolFlag:
		f.Hidden = true
	case *cli.StringFlag:
		f.Hidden = true
	case *cli.StringSliceFlag:
		f.Hidden = true
	case *cli.DurationFlag:
		f.Hidden = true
	case *cli.IntFlag:
		f.Hidden = true
	default:
		v := reflect.ValueOf(f)
		if v.Kind() == reflect.Pointer && v.Elem().Kind() == reflect.Struct {
			if h := v.Elem().FieldByName("Hidden"); h.IsValid() && h.CanSet() && h.Kind() == reflect.Bool {
				h.SetBool(true)
			}
		}
	}
}
