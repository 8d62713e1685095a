package main

import (
	"flag"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestManPageListsEveryOption: docs/man/kc-hook.8 is written by hand, so
// nothing else keeps it in step with the code. Every flag of kc-hook (in
// OPTIONS) and of supervise (in SUPERVISE) must have an entry there that
// names its environment variable and gives its default.
func TestManPageListsEveryOption(t *testing.T) {
	roff, err := os.ReadFile("../../docs/man/kc-hook.8")
	if err != nil {
		t.Fatal(err)
	}
	entries := manEntries(string(roff))
	defaultRE := regexp.MustCompile(`\bdefault (\S+)`)
	for _, page := range []struct {
		section string
		flags   func() *flag.FlagSet
		env     map[string]string
	}{
		{"OPTIONS", new(commandLine).flagSet, hookEnv},
		{"SUPERVISE", new(superviseSettings).flagSet, superviseEnv},
	} {
		t.Run(page.section, func(t *testing.T) {
			for _, opt := range []string{"-h", "--help"} {
				if _, ok := entries[page.section+" "+opt]; !ok {
					t.Errorf("%s has no entry in %s", opt, page.section)
				}
			}
			page.flags().VisitAll(func(f *flag.Flag) {
				opt := "--" + f.Name
				if len(f.Name) == 1 {
					opt = "-" + f.Name
				}
				body, ok := entries[page.section+" "+opt]
				if !ok {
					t.Errorf("%s has no entry in %s", opt, page.section)
					return
				}
				if env := page.env[f.Name]; env != "" && !regexp.MustCompile(`\b`+env+`\b`).MatchString(body) {
					t.Errorf("%s: the entry does not name %s: %q", opt, env, body)
				}
				// Flags without usage (--version) have no default to speak
				// of; a zero default is "the global --…" in the page.
				if f.Usage == "" || f.DefValue == "" || f.DefValue == "0s" {
					return
				}
				m := defaultRE.FindStringSubmatch(body)
				if m == nil {
					t.Errorf("%s: the entry gives no default: %q", opt, body)
					return
				}
				// Parsed, so that the page may write 1m for 1m0s.
				v := page.flags().Lookup(f.Name).Value
				if err := v.Set(strings.TrimRight(m[1], ".;,")); err != nil || v.String() != f.DefValue {
					t.Errorf("%s: the page's default %q is not %q", opt, m[1], f.DefValue)
				}
			})
		})
	}
}

// manEntries maps "SECTION --option" to the text of the .TP entry whose tag
// names that option, with roff's macros and escapes removed.
func manEntries(roff string) map[string]string {
	plain := strings.NewReplacer(`\-`, "-", `\%`, "", `\&`, "", `\c`, "", `\fB`, "", `\fI`, "", `\fR`, "", `\fP`, "", `"`, "")
	entries := map[string]string{}
	var section string
	var opts []string // of the entry being read
	tag := false
	for _, line := range strings.Split(roff, "\n") {
		macro, text := "", line
		if strings.HasPrefix(line, ".") {
			macro, text, _ = strings.Cut(line, " ")
		}
		text = plain.Replace(text)
		switch {
		case macro == `.\"`:
		case macro == ".SH":
			section, opts = text, nil
		case macro == ".TP":
			tag, opts = true, nil
		case tag:
			tag = false
			for _, w := range strings.Fields(strings.ReplaceAll(text, ",", " ")) {
				if strings.HasPrefix(w, "-") {
					opts = append(opts, w)
					entries[section+" "+w] = ""
				}
			}
		default:
			for _, o := range opts {
				entries[section+" "+o] += " " + text
			}
		}
	}
	return entries
}
