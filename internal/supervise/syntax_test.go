package supervise

import (
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The regexps the hand-written checks replace (to keep them out of
// kc-hook's start-up). They must accept exactly the same strings.
var (
	nameRE        = regexp.MustCompile(namePattern)
	envKeyRE      = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	placeholderRE = regexp.MustCompile(`\{\{\s*([A-Za-z0-9_]*)\s*\}\}`)
)

// syntaxCases are the edges of the three patterns.
var syntaxCases = []string{
	"", "a", "A", "0", "_", ".", "-", "a.b", "a_b", "a-b", ".a", "-a", "_a", "a.", "A-1_2.3",
	"kallichore", "../x", "a/b", "a b", " a", "a ", "a\n", "\na", "a\x00", "é", "aé", "a\xff", "\xff",
	strings.Repeat("a", 63), strings.Repeat("a", 64), strings.Repeat("a", 65), "1" + strings.Repeat("-", 63),
	"_" + strings.Repeat("a", 64), "A_B", "9A", "A9", "RUST_LOG", "A-B", "a=b",
	"{{container_id}}", "{{ container_id }}", "{{\tinit_pid\n}}", "{{}}", "{{ }}", "{{\v}}", "{{ a b }}",
	"{{{container_id}}}", "{{{{x}}}}", "{{x}}}", "{{x}", "{x}}", "{{x}}{{y}}", "{{x}}{{", "a{{b}}c{{ d }}e",
	"{{-x}}", "{{x-y}}", "{{é}}", "{{\xff}}", "{ {x}}", "{{x} }", "{{{{", "}}}}", "{{ init_pid}}{{bundle }}",
	"--container-id={{container_id}}", "{{\f\r container_id \r\f}}",
}

// randomSyntax draws strings from an alphabet weighted towards the
// characters the patterns care about.
func randomSyntax(r *rand.Rand) string {
	const alphabet = "{{{}}} \t\n\f\r\vaZ09_.-=/\x00"
	extras := []string{"é", "\xff", "container_id", "init_pid", "{{", "}}"}
	n := r.IntN(12)
	if r.IntN(20) == 0 {
		n = 60 + r.IntN(8) // around the 64-byte name limit
	}
	var b strings.Builder
	for range n {
		if r.IntN(10) == 0 {
			b.WriteString(extras[r.IntN(len(extras))])
		} else {
			b.WriteByte(alphabet[r.IntN(len(alphabet))])
		}
	}
	return b.String()
}

func TestSyntaxMatchesRegexps(t *testing.T) {
	check := func(t *testing.T, s string) {
		t.Helper()
		if got, want := validName(s), nameRE.MatchString(s); got != want {
			t.Errorf("validName(%q) = %v, regexp says %v", s, got, want)
		}
		if got, want := validEnvKey(s), envKeyRE.MatchString(s); got != want {
			t.Errorf("validEnvKey(%q) = %v, regexp says %v", s, got, want)
		}
		var got [][]string
		eachPlaceholder(s, func(m, name string) string {
			got = append(got, []string{m, name})
			return m
		})
		want := placeholderRE.FindAllStringSubmatch(s, -1)
		if !slices.EqualFunc(got, want, slices.Equal) {
			t.Errorf("placeholders of %q = %q, regexp finds %q", s, got, want)
		}
		repl := func(m string) string { return "<" + m + ">" }
		gotR := eachPlaceholder(s, func(m, _ string) string { return repl(m) })
		if wantR := placeholderRE.ReplaceAllStringFunc(s, repl); gotR != wantR {
			t.Errorf("replacing in %q gives %q, regexp gives %q", s, gotR, wantR)
		}
	}
	t.Run("table", func(t *testing.T) {
		for _, s := range syntaxCases {
			check(t, s)
		}
	})
	t.Run("random", func(t *testing.T) {
		r := rand.New(rand.NewPCG(1, 2))
		n := 200000
		if testing.Short() {
			n = 20000
		}
		for i := range n {
			s := randomSyntax(r)
			check(t, s)
			if t.Failed() {
				t.Fatalf("stopped after %d strings", i+1)
			}
		}
	})
}

func TestExpand(t *testing.T) {
	v := Vars{ContainerID: cid, InitPID: 42}
	tests := []struct{ in, want string }{
		{"plain", "plain"},
		{"{{container_id}}", cid},
		{"--id={{ container_id }}/{{init_pid}}", "--id=" + cid + "/42"},
		{"{{{init_pid}}}", "{42}"},
		{"{{init_pid}}{{init_pid}}", "4242"},
		{"{{unknown}}", "{{unknown}}"}, // validated away at load; left alone here
		{"{{init_pid", "{{init_pid"},
	}
	for _, tt := range tests {
		if got := expand(tt.in, v); got != tt.want {
			t.Errorf("expand(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
