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

// manPage renders the app's markdown documentation as a section 8 man
// page. Help texts are plain text, so their lone '*' (kc-*.sock, KC_*,
// /run/user/*) and '<' are escaped before markdown takes them for
// emphasis or HTML.
func manPage(app *cli.App) ([]byte, error) {
	md, err := app.ToMarkdown()
	if err != nil {
		return nil, err
	}
	// Twice: a match consumes the character after the star, so "a*b*c"
	// needs a second pass for the second star.
	md = loneStar.ReplaceAllString(md, `$1\*$2`)
	md = loneStar.ReplaceAllString(md, `$1\*$2`)
	md = strings.ReplaceAll(md, "<", `\<`) // /proc/<pid>: not an HTML tag
	md = "% " + app.Name + " 8\n" + md
	return md2man.Render([]byte(md)), nil
}
