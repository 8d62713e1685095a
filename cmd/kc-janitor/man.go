package main

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/cpuguy83/go-md2man/v2/md2man"
	"github.com/urfave/cli/v2"
)

// manCommand prints the man page generated from the app's own commands and
// flags, so it never drifts from --help. `make install` installs it.
func manCommand() *cli.Command {
	return &cli.Command{
		Name:   "man",
		Usage:  "print the kc-janitor(8) man page (roff)",
		Hidden: true,
		Action: func(c *cli.Context) error {
			page, err := manPage(c.App)
			if err != nil {
				return cli.Exit(fmt.Sprintf("man: %v", err), exitFailed)
			}
			_, err = c.App.Writer.Write(page)
			return err
		},
	}
}

// loneStar is a '*' that is not part of a "**" bold marker.
var loneStar = regexp.MustCompile(`(^|[^*\\])\*([^*]|$)`)

// manPage renders the man page from the app's commands and flags: each
// flag with its KC_* variable and default, each command's description,
// EXIT STATUS and ENVIRONMENT. Help texts are plain text, so their lone
// '*' (kc-*.sock, KC_*, /run/user/*) and '<' are escaped before markdown
// takes them for emphasis or HTML.
func manPage(app *cli.App) ([]byte, error) {
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
		if st, ok := exitStatus[c.Name]; ok {
			fmt.Fprintf(&b, "**%s**: %s\n\n", c.Name, st)
		}
	}
	b.WriteString("# ENVIRONMENT\n\nEvery option has a variable, shown next to it above; the option, when given, wins.\n\n")
	for _, f := range allFlags(app) {
		r := rowOf(f)
		if r.env != "" {
			fmt.Fprintf(&b, "**%s**: %s\n\n", r.env, strings.Fields(r.names)[0])
		}
	}
	for _, v := range otherEnv {
		fmt.Fprintf(&b, "**%s**: %s\n\n", v[0], v[1])
	}
	b.WriteString("# SEE ALSO\n\nkc-hook(8), podman(1), oci-hooks(5), and docs/ in the source tree.\n")
	md := b.String()
	// Twice: a match consumes the character after the star, so "a*b*c"
	// needs a second pass for the second star.
	md = loneStar.ReplaceAllString(md, `$1\*$2`)
	md = loneStar.ReplaceAllString(md, `$1\*$2`)
	md = strings.ReplaceAll(md, "_", `\_`)
	md = strings.ReplaceAll(md, "<", `\<`) // /proc/<pid>: not an HTML tag
	md = "% " + app.Name + " 8\n" + md
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
