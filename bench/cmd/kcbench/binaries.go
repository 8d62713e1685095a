package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// binRun is one run of a real binary as a child: wall time, CPU time and
// peak RSS as wait4(2) reports them, taken by the small bench/cmd/rusage
// helper (see there why not by the harness itself).
type binRun struct {
	Wall     time.Duration
	CPU      time.Duration // user + system
	MaxRSSKB int64
	Exit     int
	Stdout   []byte
	Stderr   []byte
}

// rusageBin is the built bench/cmd/rusage helper.
var rusageBin string

func runBinary(argv, env []string, dir string, stdin *os.File) (binRun, error) {
	var r binRun
	out, err := os.CreateTemp("", "kcbench-rusage-")
	if err != nil {
		return r, err
	}
	out.Close()
	defer os.Remove(out.Name())
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(rusageBin, append([]string{out.Name()}, argv...)...)
	cmd.Env, cmd.Dir = env, dir
	if stdin != nil {
		cmd.Stdin = stdin
	}
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = cmd.Run()
	r.Stdout, r.Stderr = stdout.Bytes(), stderr.Bytes()
	if err != nil {
		return r, fmt.Errorf("%s: %v: %s", argv[0], err, bytes.TrimSpace(stderr.Bytes()))
	}
	data, err := os.ReadFile(out.Name())
	if err != nil {
		return r, err
	}
	var u struct {
		WallNS   int64 `json:"wall_ns"`
		UserNS   int64 `json:"user_ns"`
		SysNS    int64 `json:"sys_ns"`
		MaxRSSKB int64 `json:"maxrss_kb"`
		Exit     int   `json:"exit"`
	}
	if err := json.Unmarshal(data, &u); err != nil {
		return r, fmt.Errorf("rusage output %q: %v", data, err)
	}
	r.Wall, r.CPU, r.MaxRSSKB, r.Exit = time.Duration(u.WallNS), time.Duration(u.UserNS+u.SysNS), u.MaxRSSKB, u.Exit
	return r, nil
}

func (r binRun) timing() timing { return timing{r.Wall, r.CPU} }

func randomID() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}

// hookEnv is the environment a runtime gives kc-hook through the
// descriptor (hooks.d sets PATH), plus the benchmark's state dir.
func hookEnv(stateDir string) []string {
	return []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "KC_STATE_DIR=" + stateDir}
}

// hookSample is one kc-hook poststop run.
type hookSample struct {
	binRun
	Outcome string
}

// runHook runs `kc-hook poststop` for container id with a synthetic
// runtime-spec State on stdin, the bundle as its working directory, as a
// runtime does. extraEnv is added to hookEnv: settings go through the
// environment, as a hooks.d descriptor would pass them, so that the
// command line stays the one every variant runs.
func runHook(bin, tmp, stateDir, id string, extraEnv ...string) (hookSample, error) {
	var s hookSample
	bundle, stf, err := hookBundle(tmp, id)
	if err != nil {
		return s, err
	}
	in, err := os.Open(stf)
	if err != nil {
		return s, err
	}
	defer in.Close()
	r, err := runBinary([]string{bin, "poststop"}, append(hookEnv(stateDir), extraEnv...), bundle, in)
	s.binRun = r
	if err != nil {
		return s, err
	}
	if r.Exit != 0 {
		return s, fmt.Errorf("kc-hook poststop exited %d: %s", r.Exit, bytes.TrimSpace(r.Stderr))
	}
	data, err := os.ReadFile(filepath.Join(stateDir, "containers", id+".json"))
	if err != nil {
		return s, fmt.Errorf("kc-hook left no ledger record: %w", err)
	}
	var rec struct {
		Outcome string `json:"outcome"`
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		return s, fmt.Errorf("ledger record: %w", err)
	}
	s.Outcome = rec.Outcome
	return s, nil
}

// hookBundle makes the bundle directory of container id and the State
// the runtime gives kc-hook on stdin.
func hookBundle(tmp, id string) (bundle, stateFile string, err error) {
	bundle = filepath.Join(tmp, "bundles", id[:12])
	if err := os.MkdirAll(bundle, 0o755); err != nil {
		return "", "", err
	}
	state := fmt.Sprintf(`{"ociVersion":"1.0.2","id":%q,"status":"stopped","bundle":%q,"annotations":{}}`, id, bundle)
	stateFile = filepath.Join(bundle, "state.json")
	return bundle, stateFile, os.WriteFile(stateFile, []byte(state), 0o644)
}

// traceHook is runHook's no-tree run under strace.
func traceHook(bin, tmp, stateDir, id string) (traced, error) {
	bundle, stf, err := hookBundle(tmp, id)
	if err != nil {
		return traced{}, err
	}
	return traceRun([]string{bin, "poststop"}, hookEnv(stateDir), bundle, stf, "")
}

// janitorSample is one kc-janitor run with its parsed JSON report.
type janitorSample struct {
	binRun
	Source  string
	Actions map[string]int    // over all trees
	ByID    map[string]string // container ID → action
	Trees   int
}

func runReconcile(bin string, args, env []string) (janitorSample, error) {
	var s janitorSample
	argv := append([]string{bin, "reconcile", "--format", "json"}, args...)
	r, err := runBinary(argv, env, "", nil)
	s.binRun = r
	if err != nil {
		return s, err
	}
	if r.Exit != 0 {
		return s, fmt.Errorf("kc-janitor reconcile exited %d: %s %s", r.Exit, bytes.TrimSpace(r.Stdout), bytes.TrimSpace(r.Stderr))
	}
	var rep struct {
		Source string `json:"source"`
		Trees  []struct {
			ContainerID string `json:"container_id"`
			Action      string `json:"action"`
		} `json:"trees"`
	}
	if err := json.Unmarshal(r.Stdout, &rep); err != nil {
		return s, fmt.Errorf("reconcile JSON: %v: %.200s", err, r.Stdout)
	}
	s.Source, s.Trees, s.Actions, s.ByID = rep.Source, len(rep.Trees), map[string]int{}, map[string]string{}
	for _, t := range rep.Trees {
		s.Actions[t.Action]++
		s.ByID[t.ContainerID] = t.Action
	}
	return s, nil
}

// sweepSample is one kc-janitor sweep run.
type sweepSample struct {
	binRun
	Verdicts map[string]int
	Actions  map[string]int
	Sockets  int
}

func runSweep(bin, dir string, env []string) (sweepSample, error) {
	var s sweepSample
	r, err := runBinary([]string{bin, "sweep", "--socket-dir", dir, "--format", "json"}, env, "", nil)
	s.binRun = r
	if err != nil {
		return s, err
	}
	if r.Exit != 0 {
		return s, fmt.Errorf("kc-janitor sweep exited %d: %.300s", r.Exit, bytes.TrimSpace(r.Stderr))
	}
	var rep struct {
		Sockets []struct {
			Verdict string `json:"verdict"`
			Action  string `json:"action"`
		} `json:"sockets"`
	}
	if err := json.Unmarshal(r.Stdout, &rep); err != nil {
		return s, fmt.Errorf("sweep JSON: %v: %.200s", err, r.Stdout)
	}
	s.Sockets, s.Verdicts, s.Actions = len(rep.Sockets), map[string]int{}, map[string]int{}
	for _, k := range rep.Sockets {
		s.Verdicts[k.Verdict]++
		s.Actions[k.Action]++
	}
	return s, nil
}
