package sweep

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// Dir is one socket directory (or pattern) a sweep looked in, as a path
// inside the target, and why it was looked in.
type Dir struct {
	Path string
	// Sources say where the directory came from: "--socket-dir" (given
	// by the operator), "default", "kcserver <pid> --socket-dir" (a live
	// kcserver's argv), "kcserver <pid> XDG_RUNTIME_DIR" (its
	// environment), "container init <pid> TMPDIR", … PIDs are host PIDs.
	Sources []string
}

// Where a kcserver puts its sockets (real kcserver 0.1.64): the control
// socket in --socket-dir, else $XDG_RUNTIME_DIR, else the temp dir
// ($TMPDIR, else /tmp), or at --unix-socket; session sockets in
// --socket-dir, else the temp dir. A sweep that only knew /tmp and
// /run/user/* would miss every other one of these.
var (
	socketFlags = []string{"--socket-dir", "--unix-socket"}
	socketEnv   = []string{"XDG_RUNTIME_DIR", "TMPDIR"}
)

// discoverDirs finds the socket directories of the live supervisors in
// view's PID namespace (their argv and environment), or, in a container
// with none, the directories its init's environment names. The paths are
// inside the target (the processes' own mount namespace is taken to be
// the init's). Relative paths and paths with glob characters are skipped:
// a directory learned from a process must name exactly one directory.
func discoverDirs(view *pidView, target Target, comms []string) []Dir {
	var pids []int
	if view.container {
		for _, host := range view.hostOf {
			pids = append(pids, host)
		}
	} else {
		pids = listPIDs(view.procRoot)
	}
	sort.Ints(pids)
	found := map[string][]string{}
	add := func(p, source string) {
		p = filepath.Clean(p)
		if !filepath.IsAbs(p) || hasMeta(p) {
			return
		}
		if !slices.Contains(found[p], source) {
			found[p] = append(found[p], source)
		}
	}
	live := 0
	for _, pid := range pids {
		id, err := fingerprint.Read(view.procRoot, pid)
		if err != nil || id.TGID != pid || id.Zombie() || !slices.Contains(comms, id.Comm) {
			continue
		}
		live++
		who := fmt.Sprintf("%s %d", id.Comm, pid)
		for flag, val := range flagValues(id.Argv, socketFlags) {
			if flag == "--unix-socket" {
				val = filepath.Dir(val)
			}
			add(val, who+" "+flag)
		}
		for k, v := range envValues(view.procRoot, pid, socketEnv) {
			add(v, who+" "+k)
		}
	}
	if live == 0 && target.Container() {
		for k, v := range envValues(view.procRoot, target.InitPID, socketEnv) {
			add(v, fmt.Sprintf("container init %d %s", target.InitPID, k))
		}
	}
	out := make([]Dir, 0, len(found))
	for p, src := range found {
		out = append(out, Dir{Path: p, Sources: src})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

func listPIDs(procRoot string) []int {
	ents, _ := os.ReadDir(procRoot)
	var out []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && pid > 0 {
			out = append(out, pid)
		}
	}
	return out
}

// flagValues returns the values argv gives the named long flags, clap's
// way: "--flag value" or "--flag=value" (the last one wins, as clap
// refuses repeats anyway).
func flagValues(argv []string, names []string) map[string]string {
	out := map[string]string{}
	for i := 1; i < len(argv); i++ {
		a := argv[i]
		if a == "--" {
			break
		}
		for _, n := range names {
			switch {
			case a == n && i+1 < len(argv):
				out[n] = argv[i+1]
			case strings.HasPrefix(a, n+"="):
				out[n] = a[len(n)+1:]
			}
		}
	}
	return out
}

// envValues returns the named variables of pid's initial environment
// (/proc/<pid>/environ; empty values are left out). Unreadable: none.
func envValues(procRoot string, pid int, names []string) map[string]string {
	data, err := os.ReadFile(procRoot + "/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return nil
	}
	out := map[string]string{}
	for _, kv := range bytes.Split(data, []byte{0}) {
		k, v, ok := bytes.Cut(kv, []byte("="))
		if !ok || len(v) == 0 {
			continue
		}
		if slices.Contains(names, string(k)) {
			out[string(k)] = string(v)
		}
	}
	return out
}

// mergeDirs lists the patterns swept with where each came from: given
// ones first, then defaults, then discovered ones not already there.
func mergeDirs(given []string, givenSource string, found []Dir) []Dir {
	var out []Dir
	idx := map[string]int{}
	for _, p := range given {
		if i, ok := idx[p]; ok {
			out[i].Sources = appendNew(out[i].Sources, givenSource)
			continue
		}
		idx[p] = len(out)
		out = append(out, Dir{Path: p, Sources: []string{givenSource}})
	}
	for _, d := range found {
		if i, ok := idx[d.Path]; ok {
			for _, s := range d.Sources {
				out[i].Sources = appendNew(out[i].Sources, s)
			}
			continue
		}
		idx[d.Path] = len(out)
		out = append(out, d)
	}
	return out
}

func appendNew(list []string, s string) []string {
	if slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}
