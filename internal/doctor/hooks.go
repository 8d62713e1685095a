package doctor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	hook "go.podman.io/common/pkg/hooks/1.0.0"

	"github.com/kc-watchman/kc-watchman/internal/trust"
)

// Podman's and CRI-O's default hook directories, in increasing precedence:
// a descriptor in OverrideHooksDir masks one of the same file name in
// DefaultHooksDir (oci-hooks(5)).
const (
	DefaultHooksDir  = "/usr/share/containers/oci/hooks.d"
	OverrideHooksDir = "/etc/containers/oci/hooks.d"
)

// HookName is the hook binary's name: a descriptor whose path or argv[0]
// ends in it, or whose file name contains it, is kc-hook's.
const HookName = "kc-hook"

// oci-hooks(5) 1.0.0 stages.
var validStages = map[string]bool{
	"prestart": true, "createRuntime": true, "createContainer": true,
	"startContainer": true, "poststart": true, "poststop": true,
}

// Stages at which kc-hook records the container's init process.
var recordStages = []string{"createRuntime", "prestart", "poststart"}

// Descriptor is one kc-hook descriptor as found on disk.
type Descriptor struct {
	// File is the descriptor's path.
	File string `json:"file"`
	// Path, Args, Env, Timeout and Stages are as declared.
	Path    string   `json:"path,omitempty"`
	Args    []string `json:"args,omitempty"`
	Env     []string `json:"env,omitempty"`
	Timeout *int     `json:"timeout,omitempty"`
	Stages  []string `json:"stages,omitempty"`
	// When describes the descriptor's condition in words.
	When string `json:"when,omitempty"`
	// Problems make podman drop or misuse the descriptor.
	Problems []string `json:"problems,omitempty"`
	// MaskedBy is set when a descriptor of the same file name in a
	// directory of higher precedence hides this one.
	MaskedBy string `json:"masked_by,omitempty"`
}

// Valid reports whether podman would load the descriptor and run it as
// intended.
func (d Descriptor) Valid() bool { return len(d.Problems) == 0 && d.MaskedBy == "" }

// EnvValue returns the value of key in the descriptor's env, if set.
func (d Descriptor) EnvValue(key string) (string, bool) {
	v, ok := "", false
	for _, kv := range d.Env {
		if k, val, found := strings.Cut(kv, "="); found && k == key {
			v, ok = val, true // the last one wins, as in execve's environ lookups
		}
	}
	return v, ok
}

// Setting returns what the descriptor sets kc-hook's option to: the flag
// in its args (--flag=V or --flag V, before the stage) beats the
// environment variable, as it does in kc-hook.
func (d Descriptor) Setting(flag, env string) (string, bool) {
	if len(d.Args) > 2 {
		opts := d.Args[1 : len(d.Args)-1]
		v, found := "", false
		for i := 0; i < len(opts); i++ {
			// -flag and --flag alike, as package flag takes them.
			a, ok := strings.CutPrefix(opts[i], "-")
			if !ok {
				continue
			}
			a = strings.TrimPrefix(a, "-")
			if val, ok := strings.CutPrefix(a, flag+"="); ok {
				v, found = val, true
			} else if a == flag && i+1 < len(opts) {
				v, found = opts[i+1], true
				i++
			}
		}
		if found {
			return v, true
		}
	}
	return d.EnvValue(env)
}

// ParseDescriptor validates one descriptor's content (file is its path, for
// messages). It reads it with podman's own oci-hooks(5) 1.0.0 schema
// (go.podman.io/common/pkg/hooks/1.0.0, which, like podman, ignores
// unknown fields) and checks what podman checks when it loads a
// descriptor — version 1.0.0, a hook path that exists, compilable
// patterns, known stages — in words that say what to do, then what makes
// kc-hook misbehave although podman loads it: a path that is not an
// executable file, a when that matches nothing, several stages in one
// file (podman passes them all the same args), and a stage argument that
// differs from the stage.
func ParseDescriptor(file string, data []byte) Descriptor {
	d := Descriptor{File: file}
	h, err := hook.Read(data)
	if err != nil {
		d.Problems = append(d.Problems, "malformed JSON: "+err.Error())
		return d
	}
	if h == nil { // the file says null
		h = &hook.Hook{}
	}
	switch h.Version {
	case hook.Version:
	case "":
		d.Problems = append(d.Problems, fmt.Sprintf(`no "version" (want %q)`, hook.Version))
	default:
		d.Problems = append(d.Problems, fmt.Sprintf("version %q, want %q", h.Version, hook.Version))
	}
	d.Path, d.Args, d.Env, d.Timeout = h.Hook.Path, h.Hook.Args, h.Hook.Env, h.Hook.Timeout
	// runc's Go takes a variable's last value, crun passes the list to
	// execve and kc-hook's Go takes the first: which one the hook runs
	// with depends on the runtime.
	first, said := map[string]string{}, map[string]bool{}
	for _, kv := range d.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(k, "KC_") {
			continue
		}
		if was, seen := first[k]; !seen {
			first[k] = v
		} else if was != v && !said[k] {
			said[k] = true
			d.Problems = append(d.Problems, fmt.Sprintf("hook.env sets %s twice, to %q and %q: runc uses the last value, crun the first", k, was, v))
		}
	}
	d.Problems = append(d.Problems, checkPath(d.Path)...)
	if d.Timeout != nil && *d.Timeout <= 0 {
		d.Problems = append(d.Problems, fmt.Sprintf("hook.timeout %d: must be positive", *d.Timeout))
	}
	if p := d.timeoutBelowDeadline(h.Stages); p != "" {
		d.Problems = append(d.Problems, p)
	}
	var conds []string
	w := h.When
	if w.Always != nil {
		if *w.Always {
			conds = append(conds, "always")
		} else {
			d.Problems = append(d.Problems, `when.always is false: the hook matches no container`)
		}
	}
	for k, v := range w.Annotations {
		for _, p := range []string{k, v} {
			if _, err := regexp.Compile(p); err != nil {
				d.Problems = append(d.Problems, fmt.Sprintf("when.annotations: bad pattern %q: %v", p, err))
			}
		}
		conds = append(conds, fmt.Sprintf("annotation %s=%s", k, v))
	}
	for _, c := range w.Commands {
		if _, err := regexp.Compile(c); err != nil {
			d.Problems = append(d.Problems, fmt.Sprintf("when.commands: bad pattern %q: %v", c, err))
		}
		conds = append(conds, "command "+c)
	}
	if w.HasBindMounts != nil && *w.HasBindMounts {
		conds = append(conds, "has bind mounts")
	}
	sort.Strings(conds)
	if len(conds) == 0 && (w.Always == nil || *w.Always) {
		d.Problems = append(d.Problems, `"when" sets no condition: the hook matches no container`)
	}
	d.When = strings.Join(conds, " and ")
	d.Stages = h.Stages
	switch {
	case len(h.Stages) == 0:
		d.Problems = append(d.Problems, `no "stages"`)
	case len(h.Stages) > 1:
		d.Problems = append(d.Problems, fmt.Sprintf("%d stages (%s) in one descriptor: podman passes every stage the same args, so kc-hook would run as one stage for all; use one file per stage",
			len(h.Stages), strings.Join(h.Stages, ", ")))
	}
	for _, s := range h.Stages {
		if !validStages[s] {
			d.Problems = append(d.Problems, fmt.Sprintf("unknown stage %q", s))
		}
	}
	// podman's own load-time check has the last word: whatever it refuses
	// and the checks above did not name is still a descriptor podman drops.
	if err := h.Validate(nil); err != nil && len(d.Problems) == 0 {
		d.Problems = append(d.Problems, "podman refuses it: "+err.Error())
	}
	if len(h.Stages) == 1 && validStages[h.Stages[0]] {
		if arg := stageArg(d.Args); arg != h.Stages[0] && !(arg == "prestart" && h.Stages[0] == "createRuntime") &&
			!(arg == "createRuntime" && h.Stages[0] == "prestart") {
			if arg == "" {
				d.Problems = append(d.Problems, fmt.Sprintf("args %q name no stage: kc-hook needs its stage (%s) as the last argument", d.Args, h.Stages[0]))
			} else {
				d.Problems = append(d.Problems, fmt.Sprintf("registered for %s but runs kc-hook as %s (last argument)", h.Stages[0], arg))
			}
		}
	}
	return d
}

// kc-hook's deadline when its descriptor sets none, how long poststop
// may run past it, and the least time before it a supervisor's launch
// starts with (cmd/kc-hook, internal/hook; TestDoctorKnowsTheHooksDeadline
// keeps them equal).
const (
	HookDefaultDeadline = 20 * time.Second
	HookPoststopGrace   = 2 * time.Second
	HookLaunchMargin    = 7 * time.Second
)

// deadline is kc-hook's --deadline as the descriptor sets it (bare
// seconds too), else its default. One kc-hook cannot parse is for
// --check-settings to say.
func (d Descriptor) deadline() time.Duration {
	if v, ok := d.Setting("deadline", "KC_HOOK_DEADLINE"); ok {
		v = strings.TrimSpace(v)
		if _, err := strconv.ParseFloat(v, 64); err == nil {
			v += "s"
		}
		if dl, err := time.ParseDuration(v); err == nil && dl > 0 {
			return dl
		}
	}
	return HookDefaultDeadline
}

// deadlineBelowLaunch says what is wrong when a stage that launches
// supervisors (createRuntime, poststart) runs under a deadline that
// leaves none the time to start: every launch would be skipped, said
// only in kc-hook's log (a warning of HookInstalled's).
func (d Descriptor) deadlineBelowLaunch(stages []string) string {
	dl := d.deadline()
	for _, st := range stages {
		if launches([]string{st}) && dl <= HookLaunchMargin {
			return fmt.Sprintf("kc-hook's --deadline %s leaves no time to launch a supervisor at %s: it starts one only with more than %s left", dl, st, HookLaunchMargin)
		}
	}
	return ""
}

// timeoutBelowDeadline says what is wrong when the runtime's timeout for
// the hook is not above what kc-hook may take: the runtime kills a
// pre-start stage still within its deadline, and that fails the
// container's start; a poststop killed so leaves its trees to the
// janitor. A deadline kc-hook cannot parse is for --check-settings to
// say.
func (d Descriptor) timeoutBelowDeadline(stages []string) string {
	if d.Timeout == nil || *d.Timeout <= 0 {
		return ""
	}
	deadline := d.deadline()
	limit := time.Duration(*d.Timeout) * time.Second
	for _, st := range stages {
		if st == "poststop" {
			if deadline+HookPoststopGrace >= limit {
				return fmt.Sprintf("hook.timeout %ds is not above kc-hook's --deadline %s and the %s poststop may take past it: the runtime would kill it first, leaving its trees to kc-janitor",
					*d.Timeout, deadline, HookPoststopGrace)
			}
		} else if deadline >= limit {
			return fmt.Sprintf("hook.timeout %ds is not above kc-hook's --deadline %s: the runtime would kill a slow %s stage first, failing the container's start",
				*d.Timeout, deadline, st)
		}
	}
	return ""
}

// stageArg is the stage kc-hook would run as: its last argument (argv[0]
// excluded).
func stageArg(args []string) string {
	if len(args) < 2 {
		return ""
	}
	return args[len(args)-1]
}

// checkPath returns why the hook binary at p would not run.
func checkPath(p string) []string {
	if p == "" {
		return []string{`no hook.path`}
	}
	if !filepath.IsAbs(p) {
		return []string{fmt.Sprintf("hook.path %s is not absolute", p)}
	}
	st, err := os.Stat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return []string{fmt.Sprintf("hook.path %s does not exist: podman silently drops this descriptor (install the binary there, or fix the path)", p)}
	case err != nil:
		return []string{fmt.Sprintf("hook.path %s: %v", p, err)}
	case !st.Mode().IsRegular():
		return []string{fmt.Sprintf("hook.path %s is not a regular file (%s)", p, st.Mode().Type())}
	case st.Mode().Perm()&0o111 == 0:
		return []string{fmt.Sprintf("hook.path %s is not executable (mode %04o)", p, st.Mode().Perm())}
	}
	return nil
}

// isKCHook reports whether a descriptor file is kc-hook's: by its name, or
// (for a file too broken to parse) by mentioning kc-hook at all.
func isKCHook(name string, data []byte, d Descriptor) bool {
	if strings.Contains(name, HookName) {
		return true
	}
	if filepath.Base(d.Path) == HookName || (len(d.Args) > 0 && filepath.Base(d.Args[0]) == HookName) {
		return true
	}
	return d.Path == "" && bytes.Contains(data, []byte(HookName))
}

// FindDescriptors reads the *.json descriptors of kc-hook in dirs, given
// in increasing precedence (later dirs mask earlier ones by file name, as
// podman does). Missing directories are skipped; other read errors are
// returned.
func FindDescriptors(dirs []string) ([]Descriptor, []error) {
	var out []Descriptor
	var errs []error
	byName := map[string]int{} // file name -> index in out of the winner
	for _, dir := range dirs {
		ents, err := os.ReadDir(dir)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
			continue
		}
		for _, e := range ents {
			name := e.Name()
			if !strings.HasSuffix(name, ".json") || e.IsDir() {
				continue
			}
			file := filepath.Join(dir, name)
			data, err := readConfig(file, maxConfFile)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			d := ParseDescriptor(file, data)
			if i, seen := byName[name]; seen {
				out[i].MaskedBy = file // ours or not, it hides ours
			}
			if !isKCHook(name, data, d) {
				continue
			}
			byName[name] = len(out)
			out = append(out, d)
		}
	}
	return out, errs
}

// HooksDirs returns the directories doctor looks in, in increasing
// precedence: explicit (--hooks-dir) replaces everything, as it does for
// podman; otherwise the containers.conf hooks_dir entries and the two
// defaults.
func HooksDirs(explicit, conf []string) []string {
	if len(explicit) > 0 {
		return explicit
	}
	var out []string
	seen := map[string]bool{}
	for _, d := range append([]string{DefaultHooksDir, OverrideHooksDir}, conf...) {
		d = filepath.Clean(d)
		if !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	return out
}

// MisplacedHooksDirs are where kc-hook descriptors end up without podman
// reading them: `make install` with PREFIX=/usr/local put them in the
// first one before it installed them where podman looks. Tests replace it.
var MisplacedHooksDirs = []string{"/usr/local/share/containers/oci/hooks.d", "/usr/local/etc/containers/oci/hooks.d"}

// unreadDirs are the MisplacedHooksDirs that are not among dirs.
func unreadDirs(dirs []string) []string {
	var out []string
	for _, m := range MisplacedHooksDirs {
		read := false
		for _, d := range dirs {
			read = read || filepath.Clean(d) == filepath.Clean(m)
		}
		if !read {
			out = append(out, m)
		}
	}
	return out
}

// HookInstalled checks that podman will run kc-hook at poststop (an error
// otherwise) and at a stage that records the init process (a warning
// otherwise). stateDir is the janitor's and hookDefault the state dir
// kc-hook uses when its descriptor names none (it depends on the host UID
// podman runs hooks as: root's or a rootless user's); a hook writing
// elsewhere than the janitor reads is a warning too, whichever side was
// configured, since the janitor would not read its ledger.
func HookInstalled(ctx context.Context, dirs []string, stateDir, hookDefault string) (Check, []Descriptor) {
	descs, errs := FindDescriptors(dirs)
	where := strings.Join(dirs, ", ")
	var items []string
	for _, err := range errs {
		items = append(items, "unreadable: "+err.Error())
	}
	byStage := map[string][]Descriptor{}
	for _, d := range descs {
		switch {
		case d.MaskedBy != "":
			items = append(items, fmt.Sprintf("%s: masked by %s", d.File, d.MaskedBy))
		case !d.Valid():
			for _, p := range d.Problems {
				items = append(items, fmt.Sprintf("%s: %s", d.File, p))
			}
		default:
			for _, s := range d.Stages {
				byStage[s] = append(byStage[s], d)
			}
		}
	}
	if len(descs) == 0 {
		c := newCheck(NameHookInstalled, Error, "no kc-hook descriptor in %s (the dirs podman reads)", where)
		// Earlier releases installed them under PREFIX, where podman
		// never looks: say where they are and what to do.
		for _, d := range unreadDirs(dirs) {
			found, _ := FindDescriptors([]string{d})
			for _, f := range found {
				c.Items = append(c.Items, fmt.Sprintf("%s is in %s, which podman does not read: move it to %s, or add hooks_dir = [\"%s\"] to containers.conf", f.File, d, DefaultHooksDir, d))
			}
		}
		c.Items = append(c.Items, items...)
		return c, descs
	}
	post := byStage["poststop"]
	if len(post) == 0 {
		c := newCheck(NameHookInstalled, Error, "poststop not covered: podman will not run kc-hook when containers stop")
		c.Items = items
		return c, descs
	}
	verdict := OK
	var notes []string
	var recorders []Descriptor
	for _, s := range recordStages {
		recorders = append(recorders, byStage[s]...)
	}
	if len(recorders) == 0 {
		verdict = Warn
		notes = append(notes, "no createRuntime/poststart descriptor: the ledger gets no init process")
	}
	for s, ds := range byStage {
		if len(ds) > 1 {
			verdict = Warn
			var files []string
			for _, d := range ds {
				files = append(files, d.File)
			}
			sort.Strings(files)
			items = append(items, fmt.Sprintf("stage %s registered %d times (%s): the hook runs that often", s, len(ds), strings.Join(files, ", ")))
		}
	}
	if len(items) > 0 && verdict == OK {
		verdict = Warn // broken or masked descriptors next to working ones
	}
	refused := false
	for _, d := range append(post, recorders...) {
		why, err := hookSettings(ctx, d)
		atStop := slices.Contains(d.Stages, "poststop")
		also := ""
		if errors.Is(err, errCannotRun) {
			also = "; the runtime will fail to run it too"
		}
		switch {
		case errors.Is(err, trust.ErrUntrusted):
			verdict = Error
			items = append(items, fmt.Sprintf("%s: %v; the runtime runs its program as root at every container start, so whoever can change them runs code as root", d.File, err))
		case errors.Is(err, errNotKCHook):
			items = append(items, fmt.Sprintf("%s: %v (doctor runs only kc-hook itself)", d.File, err))
		case errors.Is(err, errNotChecked):
			items = append(items, fmt.Sprintf("%s: %v", d.File, err))
		case why != "" && atStop:
			verdict, refused = Error, true
			items = append(items, fmt.Sprintf("%s: kc-hook refuses its settings: %s; every container's poststop fails and reaps nothing", d.File, why))
		case why != "":
			verdict, refused = max(verdict, Warn), true
			items = append(items, fmt.Sprintf("%s: kc-hook refuses its settings: %s; it records no container (they start all the same)", d.File, why))
		case err != nil && atStop:
			verdict = Error
			items = append(items, fmt.Sprintf("%s: %v%s", d.File, err, also))
		case err != nil:
			verdict = max(verdict, Warn)
			items = append(items, fmt.Sprintf("%s: %v%s", d.File, err, also))
		}
	}
	for _, d := range recorders {
		// A host may launch no supervisor: a warning, not a broken
		// descriptor (it still records).
		if p := d.deadlineBelowLaunch(d.Stages); p != "" {
			verdict = max(verdict, Warn)
			items = append(items, fmt.Sprintf("%s: %s; no supervisor is launched (the container starts all the same)", d.File, p))
		}
	}
	for _, d := range append(post, recorders...) {
		hookDir, set := d.Setting("state-dir", "KC_STATE_DIR")
		if !set || hookDir == "" {
			hookDir = hookDefault
		}
		if filepath.Clean(hookDir) == filepath.Clean(stateDir) {
			continue
		}
		verdict = max(verdict, Warn)
		if set {
			items = append(items, fmt.Sprintf("%s: the hook keeps its ledger in %s, the janitor reads %s (--state-dir / KC_STATE_DIR)", d.File, hookDir, stateDir))
		} else {
			items = append(items, fmt.Sprintf("%s: the hook keeps its ledger in its default %s (the descriptor names none), the janitor reads %s (--state-dir / KC_STATE_DIR)", d.File, hookDir, stateDir))
		}
	}
	var files []string
	for _, d := range post {
		files = append(files, d.File)
	}
	for _, d := range recorders {
		files = append(files, d.File)
	}
	detail := fmt.Sprintf("%s -> %s", strings.Join(files, ", "), post[0].Path)
	if w := post[0].When; w != "" && w != "always" {
		detail += "; only for containers matching " + w
	}
	if len(notes) > 0 {
		detail += "; " + strings.Join(notes, "; ")
	}
	c := newCheck(NameHookInstalled, verdict, "%s", detail)
	c.Items = items
	if refused {
		c.Remedy = "fix the descriptor's args or env (kc-hook --help lists its options and variables)"
	}
	return c, descs
}

// HookStateDir is the state dir the installed poststop hook writes (its
// descriptor's --state-dir or KC_STATE_DIR), else def, the hook's own
// default for the host UID it runs as; and its log file (--log-file or
// KC_HOOK_LOG, else <state dir>/kc-hook.log).
func HookStateDir(descs []Descriptor, def string) (stateDir, logFile string) {
	stateDir = def
	for _, d := range descs {
		if !d.Valid() || !contains(d.Stages, "poststop") {
			continue
		}
		if v, ok := d.Setting("state-dir", "KC_STATE_DIR"); ok && v != "" {
			stateDir = v
		}
		if v, ok := d.Setting("log-file", "KC_HOOK_LOG"); ok && v != "" {
			logFile = v
		}
		break
	}
	if logFile == "" {
		logFile = filepath.Join(stateDir, "kc-hook.log")
	}
	return stateDir, logFile
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// HookWithoutPodman re-judges the hook check on a host where podman is not
// one of the engines asked. kc-hook is run by podman (and CRI-O) from
// hooks.d; a Docker or containerd host has no hooks directory for it, and
// there watch's death events do its job, so a missing descriptor is
// expected, not an error. A broken one that is there still deserves a look.
func HookWithoutPodman(c Check, descs []Descriptor) Check {
	if c.Verdict != Error {
		return c
	}
	if len(descs) == 0 {
		c.Verdict = OK
		c.Detail = "none in hooks.d, and none needed: no engine asked here runs hooks from hooks.d (run kc-janitor watch: it follows Docker's and containerd's container deaths; containerd's CRI takes the hook from contrib/containerd's base spec)"
		c.Remedy = ""
		return c
	}
	c.Verdict = Warn
	c.Detail += " (no engine asked here runs hooks from hooks.d)"
	return c
}
