package cliapp

import (
	"slices"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

func TestRoffLine(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"--apply reaps", `\-\-apply reaps`},
		{".sock files", `\&.sock files`},
		{"'quoted' word", `\&'quoted' word`},
		{`a \n in text`, `a \en in text`},
		{"kc-*.sock and KC_* under /run/user/*", `kc\-*.sock and KC_* under /run/user/*`},
		{"in the middle . or ' is text", "in the middle . or ' is text"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			if got := roffLine(tc.in); got != tc.want {
				t.Errorf("roffLine(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

// TestManPageText: descriptions and usages that start a line with a dot
// or hold a backslash stay text, paragraphs stay apart, and no line but
// the requests the page writes is one.
func TestManPageText(t *testing.T) {
	app := &cli.App{
		Name:        "tool",
		Usage:       "do a thing",
		Description: "First paragraph,\n.dotted line.\n\nSecond \\ paragraph.",
		Flags:       []cli.Flag{&cli.StringFlag{Name: "dir", Usage: "look in `DIR`", EnvVars: []string{"TOOL_DIR"}}},
		Commands: []*cli.Command{{
			Name: "run", Usage: "run it", Description: "'Runs' it.",
			Flags: []cli.Flag{&cli.BoolFlag{Name: "apply", Usage: "really"}},
		}},
	}
	page, err := Doc{Section: 8, SeeAlso: "other(1)", ExitStatus: map[string]string{"run": "0 ok\n\n1 not"}}.ManPage(app)
	if err != nil {
		t.Fatal(err)
	}
	requests := map[string]bool{".TH": true, ".nh": true, ".ad": true, ".SH": true, ".SS": true, ".PP": true, ".TP": true, ".IP": true}
	for _, l := range strings.Split(string(page), "\n") {
		if (strings.HasPrefix(l, ".") || strings.HasPrefix(l, "'")) && !requests[strings.Fields(l)[0]] {
			t.Errorf("line %q is read as a request", l)
		}
	}
	for _, want := range []string{
		".TH TOOL 8",
		"First paragraph,\n\\&.dotted line.\n.PP\nSecond \\e paragraph.\n",
		".TP\n\\fB\\-\\-dir DIR\\fR\nlook in DIR [$TOOL_DIR]\n",
		".SS run\nrun it\n.PP\n\\&'Runs' it.\n.TP\n\\fB\\-\\-apply\\fR\nreally\n",
		".SH EXIT STATUS\n.TP\n\\fBrun\\fR\n0 ok\n.IP\n1 not\n",
		".TP\n\\fBTOOL_DIR\\fR\n\\-\\-dir\n",
	} {
		if !strings.Contains(string(page), want) {
			t.Errorf("man page lacks %q:\n%s", want, page)
		}
	}
}

// TestNamesAsUrfaveHasThem: namesOf gives what Names() gives, for each
// flag type the programs use and for one it falls back on.
func TestNamesAsUrfaveHasThem(t *testing.T) {
	for _, f := range []cli.Flag{
		&cli.BoolFlag{Name: "apply", Aliases: []string{"a"}},
		&cli.StringFlag{Name: "format", Aliases: []string{"f", "fmt"}},
		&cli.StringSliceFlag{Name: "container"},
		&cli.DurationFlag{Name: "min-age"},
		&cli.IntFlag{Name: "workers", Aliases: []string{"w"}},
		&cli.Int64Flag{Name: "big", Aliases: []string{"b"}},
	} {
		if got, want := namesOf(f), f.Names(); !slices.Equal(got, want) {
			t.Errorf("namesOf(%T) = %q, want %q", f, got, want)
		}
	}
}
