// Package cliapp is what kc-janitor does with its urfave/cli app beyond
// the app itself: the man page and the configuration reference generated
// from the flags, shell completion answered from the flag definitions,
// usage errors worded with the flag names as typed, bare numbers taken as
// seconds, and global flags read before or after the command name.
package cliapp

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"
)

// CompleteArg is the hidden first argument the completion scripts pass:
// `PROGRAM __complete WORD... CURRENT` prints the candidates for
// CURRENT, one a line. It is answered from the flag and command
// definitions alone, before any parsing, so that no TAB can ever run a
// command's action, whatever was typed before it (a "--", --apply, watch).
const CompleteArg = "__complete"

// LegacyCompleteFlag is what urfave/cli's own completion and the scripts of
// earlier releases append. It is answered like completeArg wherever it
// appears, never handed to a command.
const LegacyCompleteFlag = "--generate-bash-completion"

// Words turns a command line into the words of a completion
// request, or reports that it is none.
func Words(args []string) ([]string, bool) {
	if len(args) > 1 && args[1] == CompleteArg {
		return args[2:], true
	}
	i := slices.Index(args, LegacyCompleteFlag)
	if i < 0 {
		return nil, false
	}
	// urfave/cli's protocol: the word being completed is included only
	// when it starts with a dash.
	words := slices.Clone(args[1:i])
	if n := len(words); n == 0 || !strings.HasPrefix(words[n-1], "-") {
		words = append(words, "")
	}
	return words, true
}

// Complete writes the candidates for the last of words (the word under the
// cursor, possibly empty) given the words before it; values are the
// choices of the flags that take one of a fixed set, by name, and lists
// the choices that may follow a comma for the flags that take a list
// (--engine podman,<TAB> offers podman,docker …). It prints nothing when
// a file name or free text is expected: the scripts then fall back to the
// shell's file completion.
func Complete(w io.Writer, app *cli.App, words []string, values, lists map[string][]string) {
	if len(words) == 0 {
		words = []string{""}
	}
	cur := words[len(words)-1]
	var cmd *cli.Command
	var pending cli.Flag // a flag whose value comes next
	flagsDone := false
	for _, word := range words[:len(words)-1] {
		switch {
		case word == "=": // bash splits --format=json at the '='
			continue
		case pending != nil:
			pending = nil
		case word == "--":
			flagsDone = true
		case !flagsDone && strings.HasPrefix(word, "-") && word != "-":
			name, _, hasValue := strings.Cut(strings.TrimLeft(word, "-"), "=")
			if f := lookupFlag(app, cmd, name); f != nil && takesValue(f) && !hasValue {
				pending = f
			}
		case cmd == nil:
			cmd = app.Command(word)
		}
	}
	var candidates []string
	switch {
	case pending != nil && lists[namesOf(pending)[0]] != nil && strings.Contains(cur, ","):
		// The choices not given yet, after those that were.
		done := cur[:strings.LastIndex(cur, ",")+1]
		given := strings.Split(done, ",")
		choices := lists[namesOf(pending)[0]]
		if slices.ContainsFunc(given[:len(given)-1], func(g string) bool { return !slices.Contains(choices, g) }) {
			break // a choice that stands alone (auto), or none at all
		}
		for _, v := range choices {
			if !slices.Contains(given, v) {
				candidates = append(candidates, done+v)
			}
		}
	case pending != nil:
		candidates = values[namesOf(pending)[0]]
	case strings.HasPrefix(cur, "-") && !flagsDone:
		candidates = flagNames(app, cmd)
	case cmd == nil && !flagsDone:
		for _, c := range app.VisibleCommands() {
			if c.Name != "help" {
				candidates = append(candidates, c.Name)
			}
		}
	}
	for _, c := range candidates {
		if strings.HasPrefix(c, cur) {
			fmt.Fprintln(w, c)
		}
	}
}

// lookupFlag finds a flag by any of its names among the command's flags,
// or the app's when no command was typed yet.
func lookupFlag(app *cli.App, cmd *cli.Command, name string) cli.Flag {
	flags := app.Flags
	if cmd != nil {
		flags = cmd.Flags
	}
	for _, f := range flags {
		if slices.Contains(namesOf(f), name) {
			return f
		}
	}
	return nil
}

// takesValue says whether f is given a value.
func takesValue(f cli.Flag) bool {
	d, ok := f.(cli.DocGenerationFlag)
	return ok && d.TakesValue()
}

// flagNames lists the long names of the visible flags, then --help. A
// command's are its own, then the global ones, which it takes too though
// its help leaves them to the program's.
func flagNames(app *cli.App, cmd *cli.Command) []string {
	flags := app.VisibleFlags()
	if cmd != nil {
		flags = append(cmd.VisibleFlags(), flags...)
	}
	var out []string
	for _, f := range flags {
		if n := namesOf(f)[0]; n != "help" && !slices.Contains(out, "--"+n) {
			if cmd != nil && !accepts(cmd, n) {
				continue
			}
			out = append(out, "--"+n)
		}
	}
	return append(out, "--help")
}

// accepts says whether cmd takes the flag name.
func accepts(cmd *cli.Command, name string) bool {
	for _, f := range cmd.Flags {
		if slices.Contains(namesOf(f), name) {
			return true
		}
	}
	return false
}

// Script is the completion script for shell (bash or zsh) of program
// name, which answers CompleteArg: each script asks the binary for the
// candidates, with stdin closed.
func Script(shell, name string) (string, bool) {
	s, ok := map[string]string{"bash": bashScript, "zsh": zshScript}[shell]
	fn := "_" + strings.NewReplacer("-", "_", ".", "_").Replace(name)
	return strings.NewReplacer("_FUNC", fn, "PROG", name).Replace(s), ok
}

const bashScript = `# bash completion for PROG; generated by "PROG completion bash"
_FUNC() {
	local IFS=$'\n'
	COMPREPLY=($(compgen -W "$("${COMP_WORDS[0]}" __complete "${COMP_WORDS[@]:1:COMP_CWORD}" 2>/dev/null </dev/null)" -- "${COMP_WORDS[COMP_CWORD]}"))
}
complete -o bashdefault -o default -F _FUNC PROG
`

const zshScript = `#compdef PROG
# zsh completion for PROG; generated by "PROG completion zsh"
_FUNC() {
	local -a candidates
	candidates=(${(f)"$(${words[1]} __complete "${(@)words[2,CURRENT]}" 2>/dev/null </dev/null)"})
	if (( ${#candidates} )); then
		compadd -- "${candidates[@]}"
	else
		_files
	fi
}
if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
	_FUNC "$@"
else
	compdef _FUNC PROG
fi
`
