// Package supervise is the prevention layer that ties a supervisor's life
// to its container's (DESIGN "Launching supervisors: the allowlist and its trust model"): the allowlist that turns a container
// annotation into a command, the argv of the `kc-hook supervise` wrapper,
// and the wrapper itself, which runs the command as its child, watches the
// container's init process and takes its whole process group down when
// init dies or it is told to stop.
//
// Trust model. A container's annotations come from whoever runs podman
// (for rootless podman: any local user), while the hook and the wrapper
// run with the runtime's privileges (root for rootful podman). So the
// annotation only *names* a supervisor; the command comes from the
// allowlist file, which must be a regular file owned by root, not writable
// by group or others, in a directory with the same properties. A file
// failing any check is refused as a whole. The only values a container can
// influence are the placeholders, and those come from the runtime's State
// (a validated 64-hex container ID, a number), never from annotations.
package supervise

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/trust"
)

// Annotation is the container annotation that opts a container in; its
// value is the name of an allowlist entry.
const Annotation = "io.kc-watchman.supervisor"

// DefaultAllowlistFile is where the allowlist lives unless
// --supervisors-file / KC_SUPERVISORS_FILE says otherwise.
const DefaultAllowlistFile = "/etc/kc-watchman/supervisors.json"

// maxAllowlistSize bounds the file; an allowlist is a few entries.
const maxAllowlistSize = 1 << 20

// Errors, wrapped with details.
var (
	// ErrUntrusted: the allowlist file (or its directory) could be written
	// by someone other than root, or is not a regular file.
	ErrUntrusted = errors.New("allowlist is not trusted")
	// ErrInvalid: the allowlist does not parse or an entry is malformed.
	ErrInvalid = errors.New("invalid allowlist")
	// ErrNotAllowed: the annotation names no allowlist entry (or is not a
	// well-formed name).
	ErrNotAllowed = errors.New("supervisor not in the allowlist")
)

// Entry is one allowlisted supervisor, as written in the file.
type Entry struct {
	// Argv is the command; Argv[0] must be an absolute path. Elements may
	// contain placeholders ({{container_id}}, {{init_pid}}).
	Argv []string `json:"argv"`
	// Env holds KEY=VALUE pairs added to a minimal environment (PATH).
	// Values may contain placeholders.
	Env []string `json:"env,omitempty"`
	// MaxRestarts bounds how often a command that exits is started again
	// (default 5; 0 means never).
	MaxRestarts *int `json:"max_restarts,omitempty"`
	// RestartDelay is the first backoff; it doubles after every restart
	// up to a minute (default "1s").
	RestartDelay string `json:"restart_delay,omitempty"`
	// PdeathSig is the signal the command receives if the wrapper dies
	// (TERM, KILL, INT or HUP; default TERM).
	PdeathSig string `json:"pdeathsig,omitempty"`
}

// Allowlist is the parsed file: {"supervisors": {"<name>": Entry, ...}}.
type Allowlist struct {
	Supervisors map[string]Entry `json:"supervisors"`
}

// Command is an entry resolved for one container.
type Command struct {
	Name         string
	Argv         []string
	Env          []string
	MaxRestarts  int
	RestartDelay time.Duration
	PdeathSig    syscall.Signal
}

// Vars are the values placeholders expand to.
type Vars struct {
	ContainerID string
	InitPID     int
}

// Defaults for entries that leave a field out.
const (
	DefaultMaxRestarts  = 5
	DefaultRestartDelay = time.Second
)

// DefaultPdeathSig is sent to the command when the wrapper dies.
const DefaultPdeathSig = syscall.SIGTERM

// The syntax of names, environment keys and placeholders is checked by
// hand, not with package-level regexps: this package is linked into
// kc-hook, which runs in every container's start and stop path, and
// compiling three regexps at init cost every run of it about 2 ms, most of
// them for a hook that never reads an allowlist. The patterns in the
// comments are the definition; syntax_test.go checks the code against
// them.

// namePattern is what a supervisor name must match.
const namePattern = `^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`

// validName reports whether s matches namePattern.
func validName(s string) bool {
	if len(s) == 0 || len(s) > 64 || !isAlnum(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '.' && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// validEnvKey reports whether s matches ^[A-Za-z_][A-Za-z0-9_]*$.
func validEnvKey(s string) bool {
	if len(s) == 0 || isDigit(s[0]) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isWord(s[i]) {
			return false
		}
	}
	return true
}

// placeholderAt matches \{\{\s*([A-Za-z0-9_]*)\s*\}\} at s[i:] and returns
// the end of the match and the name inside. The classes (space, word
// character, '}') are disjoint, so the greedy scan is the only way the
// pattern can match: no backtracking is needed.
func placeholderAt(s string, i int) (end int, name string, ok bool) {
	if !strings.HasPrefix(s[i:], "{{") {
		return 0, "", false
	}
	j := skipSpace(s, i+2)
	k := j
	for k < len(s) && isWord(s[k]) {
		k++
	}
	name = s[j:k]
	k = skipSpace(s, k)
	if !strings.HasPrefix(s[k:], "}}") {
		return 0, "", false
	}
	return k + 2, name, true
}

// skipSpace skips the characters of RE2's \s: [\t\n\f\r ].
func skipSpace(s string, i int) int {
	for i < len(s) {
		switch s[i] {
		case '\t', '\n', '\f', '\r', ' ':
			i++
		default:
			return i
		}
	}
	return i
}

// eachPlaceholder calls f for every placeholder of s, leftmost first and
// not overlapping (as regexp's FindAll and ReplaceAll do); f's result
// replaces the placeholder in the returned string.
func eachPlaceholder(s string, f func(match, name string) string) string {
	var b strings.Builder
	last := 0
	for i := 0; i+4 <= len(s); {
		end, name, ok := placeholderAt(s, i)
		if !ok {
			i++
			continue
		}
		b.WriteString(s[last:i])
		b.WriteString(f(s[i:end], name))
		last, i = end, end
	}
	if last == 0 {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }
func isAlnum(c byte) bool { return isDigit(c) || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }
func isWord(c byte) bool  { return isAlnum(c) || c == '_' }

// knownPlaceholder reports whether name is a placeholder Resolve expands.
func knownPlaceholder(name string) bool {
	return name == "container_id" || name == "init_pid"
}

// LoadAllowlist opens path without following a symlink in its last
// component, checks that the file and its directory are root-owned and not
// writable by group or others, and parses and validates every entry.
func LoadAllowlist(path string) (*Allowlist, error) {
	return loadAllowlist(path, 0)
}

func loadAllowlist(path string, owner int) (*Allowlist, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("%w: %s: not an absolute path", ErrUntrusted, path)
	}
	if err := checkOwner(filepath.Dir(path), owner, true); err != nil {
		return nil, err
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil, fmt.Errorf("%w: %s is a symlink", ErrUntrusted, path)
		}
		return nil, fmt.Errorf("opening allowlist: %w", &os.PathError{Op: "open", Path: path, Err: err})
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("allowlist %s: %w", path, err)
	}
	if err := trusted(path, &st, owner, false); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, maxAllowlistSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading allowlist %s: %w", path, err)
	}
	if len(data) > maxAllowlistSize {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrInvalid, path, maxAllowlistSize)
	}
	return ParseAllowlist(data)
}

func checkOwner(path string, owner int, dir bool) error {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fmt.Errorf("allowlist directory: %w", &os.PathError{Op: "stat", Path: path, Err: err})
	}
	return trusted(path, &st, owner, dir)
}

func trusted(path string, st *unix.Stat_t, owner int, dir bool) error {
	kind := uint32(unix.S_IFREG)
	if dir {
		kind = unix.S_IFDIR
	}
	if err := trust.Stat(path, st, kind, false, uint32(owner)); err != nil {
		return fmt.Errorf("%w: %w", ErrUntrusted, err)
	}
	return nil
}

// ParseAllowlist parses and validates allowlist contents. Unknown fields
// are errors: a misspelt "max_restarts" must not silently mean "5".
func ParseAllowlist(data []byte) (*Allowlist, error) {
	var a Allowlist
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: trailing data after the object", ErrInvalid)
	}
	for name, e := range a.Supervisors {
		if err := validate(name, e); err != nil {
			return nil, fmt.Errorf("%w: supervisor %q: %v", ErrInvalid, name, err)
		}
	}
	return &a, nil
}

func validate(name string, e Entry) error {
	if !validName(name) {
		return fmt.Errorf("name must match %s", namePattern)
	}
	if len(e.Argv) == 0 {
		return errors.New("argv is empty")
	}
	if !filepath.IsAbs(e.Argv[0]) || strings.Contains(e.Argv[0], "{{") {
		return fmt.Errorf("argv[0] %q must be an absolute path without placeholders", e.Argv[0])
	}
	for _, a := range e.Argv {
		if err := checkPlaceholders(a); err != nil {
			return err
		}
	}
	for _, kv := range e.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !validEnvKey(k) {
			return fmt.Errorf("env entry %q is not KEY=VALUE", kv)
		}
		if err := checkPlaceholders(v); err != nil {
			return err
		}
	}
	if e.MaxRestarts != nil && (*e.MaxRestarts < 0 || *e.MaxRestarts > 1000) {
		return fmt.Errorf("max_restarts %d out of range 0..1000", *e.MaxRestarts)
	}
	if e.RestartDelay != "" {
		d, err := time.ParseDuration(e.RestartDelay)
		if err != nil || d <= 0 {
			return fmt.Errorf("restart_delay %q is not a positive duration", e.RestartDelay)
		}
	}
	if e.PdeathSig != "" {
		if _, err := ParseSignal(e.PdeathSig); err != nil {
			return err
		}
	}
	for _, s := range append(append([]string{}, e.Argv...), e.Env...) {
		if strings.ContainsRune(s, 0) {
			return errors.New("NUL byte in argv or env")
		}
	}
	return nil
}

func checkPlaceholders(s string) error {
	var err error
	eachPlaceholder(s, func(m, name string) string {
		if err == nil && !knownPlaceholder(name) {
			err = fmt.Errorf("unknown placeholder %q (known: {{container_id}}, {{init_pid}})", m)
		}
		return m
	})
	return err
}

// ParseSignal maps TERM/SIGTERM (any case) and friends to the signals a
// supervisor may be sent on its parent's death.
func ParseSignal(s string) (syscall.Signal, error) {
	switch strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(s)), "SIG") {
	case "TERM":
		return syscall.SIGTERM, nil
	case "KILL":
		return syscall.SIGKILL, nil
	case "INT":
		return syscall.SIGINT, nil
	case "HUP":
		return syscall.SIGHUP, nil
	}
	return 0, fmt.Errorf("signal %q: want TERM, KILL, INT or HUP", s)
}

// SignalName is the inverse of ParseSignal.
func SignalName(sig syscall.Signal) string {
	switch sig {
	case syscall.SIGKILL:
		return "KILL"
	case syscall.SIGINT:
		return "INT"
	case syscall.SIGHUP:
		return "HUP"
	}
	return "TERM"
}

// Resolve returns the command the annotation value name selects, with
// placeholders expanded. A name that is not in the allowlist (or not a
// well-formed name at all) is ErrNotAllowed.
func (a *Allowlist) Resolve(name string, v Vars) (Command, error) {
	if !validName(name) {
		return Command{}, fmt.Errorf("%w: %.80q is not a supervisor name", ErrNotAllowed, name)
	}
	e, ok := a.Supervisors[name]
	if !ok {
		return Command{}, fmt.Errorf("%w: %q", ErrNotAllowed, name)
	}
	c := Command{Name: name, MaxRestarts: DefaultMaxRestarts, RestartDelay: DefaultRestartDelay, PdeathSig: DefaultPdeathSig}
	for _, s := range e.Argv {
		c.Argv = append(c.Argv, expand(s, v))
	}
	for _, s := range e.Env {
		c.Env = append(c.Env, expand(s, v))
	}
	if e.MaxRestarts != nil {
		c.MaxRestarts = *e.MaxRestarts
	}
	if e.RestartDelay != "" {
		c.RestartDelay, _ = time.ParseDuration(e.RestartDelay) // validated at load
	}
	if e.PdeathSig != "" {
		c.PdeathSig, _ = ParseSignal(e.PdeathSig) // validated at load
	}
	return c, nil
}

func expand(s string, v Vars) string {
	return eachPlaceholder(s, func(m, name string) string {
		switch name {
		case "container_id":
			return v.ContainerID
		case "init_pid":
			return strconv.Itoa(v.InitPID)
		}
		return m
	})
}
