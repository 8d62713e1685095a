//go:build reliability

package reliability

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil/docker"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

const escapeComm = "kcrel-escape"

// escapeTree is a stray tree whose kernel started three children in
// sessions of their own (DESIGN "Descendants that leave the group"): one of the tree's (must die with
// it), one running as another UID and one carrying another container's
// ID (both must live: reported, never signalled).
type escapeTree struct {
	group               []fingerprint.Stat // the supervisor and the kernel
	setsid              fingerprint.Stat
	otherUID, otherCtnr fingerprint.Stat
}

func startEscapeTree(t *testing.T, cid string) escapeTree {
	t.Helper()
	sup := startSupervisor(t, escapeComm, cid, &syscall.SysProcAttr{Setpgid: true})
	other := newCID(t)
	// bash for exec -a: the other container's anchor carries the ID in
	// its argv as a real supervisor does.
	script := `setsid sleep 1000000 & ` +
		`setsid setpriv --reuid=65534 --regid=65534 --clear-groups sleep 1000001 & ` +
		`setsid bash -c 'exec -a --container-id=` + other + ` sleep 1000002' & wait`
	kernel, err := startChild("/usr/bin/bash", []string{"bash", "-c", script}, inGroup(sup.PID))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kernel.Kill)
	var tr escapeTree
	tr.group = []fingerprint.Stat{sup.Stat, kernel.Stat}
	proc.WaitFor(t, 10*time.Second, "the kernel's three setsid children", func() bool {
		tr.setsid, tr.otherUID, tr.otherCtnr = fingerprint.Stat{}, fingerprint.Stat{}, fingerprint.Stat{}
		for _, c := range childrenStats(kernel.PID) {
			id, err := fingerprint.Read(procRoot, c.PID)
			if err != nil || id.PGID != id.PID || len(id.Argv) < 2 {
				continue
			}
			switch id.Argv[len(id.Argv)-1] {
			case "1000000":
				if strings.HasPrefix(id.Argv[0], "--container-id=") {
					continue
				}
				tr.setsid = id.Stat
			case "1000001":
				if id.UID == 65534 {
					tr.otherUID = id.Stat
				}
			case "1000002":
				if strings.HasPrefix(id.Argv[0], "--container-id=") {
					tr.otherCtnr = id.Stat
				}
			}
		}
		return tr.setsid.PID != 0 && tr.otherUID.PID != 0 && tr.otherCtnr.PID != 0
	})
	t.Cleanup(func() { killByIdentity([]fingerprint.Stat{tr.setsid, tr.otherUID, tr.otherCtnr}) })
	return tr
}

// childrenStats lists pid's live children.
func childrenStats(pid int) []fingerprint.Stat {
	ents, _ := os.ReadDir(procRoot)
	var out []fingerprint.Stat
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := fingerprint.ReadStat(procRoot, n)
		if err == nil && st.PPID == pid && !st.Zombie() {
			out = append(out, st)
		}
	}
	return out
}

// check asserts the tree's own processes died and nothing else did.
func (tr escapeTree) check(t *testing.T, how string, bystander fingerprint.Stat) {
	t.Helper()
	mine := append([]fingerprint.Stat{tr.setsid}, tr.group...)
	if !waitAllDead(mine, 10*time.Second) {
		t.Errorf("%s: the tree's processes live on: %v", how, aliveOf(mine))
	}
	for _, p := range []fingerprint.Stat{tr.otherUID, tr.otherCtnr, bystander} {
		if !fingerprint.Alive(procRoot, p) {
			t.Errorf("%s: %d(%s) was killed; only the tree's own may be", how, p.PID, p.Comm)
		}
	}
}

// TestEscapedDescendantsDie: a setsid child of a stray tree dies with
// `reconcile --apply` and with kc-hook's poststop; another UID's
// descendant, another container's anchor under the tree and an unrelated
// process of the same UID live. On the code before descendants were
// members, the setsid child lived on, reparented to PID 1.
func TestEscapedDescendantsDie(t *testing.T) {
	state := t.TempDir()
	env := baseEnv(noContainersPodman(t)+":/usr/bin:/bin", "KC_STATE_DIR="+state, "KC_SUPERVISOR_COMM="+escapeComm, "KC_KILL_GRACE=300ms")
	bystander := startKernel(t, &syscall.SysProcAttr{Setsid: true})

	// --bpf off: the /proc listing has no parent links; descendants come
	// from the tree's own children files (DESIGN "One view of the host").
	for _, bpf := range []string{"auto", "off"} {
		t.Run("reconcile --apply --bpf "+bpf, func(t *testing.T) { reconcileEscape(t, env, bpf, bystander.Stat) })
	}

	t.Run("poststop", func(t *testing.T) {
		cid := newCID(t)
		tr := startEscapeTree(t, cid)
		r := runTool(t, hookBin(t), env, hookState(cid), "poststop")
		if r.Code != 0 {
			t.Fatalf("poststop: exit %d: %s", r.Code, r.Stderr)
		}
		tr.check(t, "poststop", bystander.Stat)
	})
}

// reconcileEscape runs reconcile --apply, scoped to one new tree, with
// the given lister.
func reconcileEscape(t *testing.T, env []string, bpf string, bystander fingerprint.Stat) {
	cid := newCID(t)
	tr := startEscapeTree(t, cid)
	// status shows the tree as it will be reaped: the setsid child among
	// its members, marked escaped.
	st := runTool(t, janitorBin(t), env, "", append([]string{"status", "--format", "json", "--bpf", bpf,
		"--container", cid, "--supervisor-comm", escapeComm}, janitorGround()...)...)
	var status struct {
		Trees []struct {
			Members []struct {
				PID     int  `json:"pid"`
				Escaped bool `json:"escaped"`
			} `json:"members"`
		} `json:"trees"`
	}
	shown := false
	if err := json.Unmarshal([]byte(st.Stdout), &status); err == nil {
		for _, tree := range status.Trees {
			for _, m := range tree.Members {
				shown = shown || (m.PID == tr.setsid.PID && m.Escaped)
			}
		}
	}
	if !shown {
		t.Errorf("status does not show the escaped member %d: exit %d\n%s\n%s", tr.setsid.PID, st.Code, st.Stdout, st.Stderr)
	}
	args := append([]string{"reconcile", "--apply", "--format", "json", "--min-age", "0s", "--kill-grace", "300ms", "--bpf", bpf,
		"--container", cid, "--supervisor-comm", escapeComm}, janitorGround()...)
	r := runTool(t, janitorBin(t), env, "", args...)
	var rep struct {
		Trees []struct {
			PGID    int    `json:"pgid"`
			Action  string `json:"action"`
			Members []struct {
				PID     int  `json:"pid"`
				Escaped bool `json:"escaped"`
			} `json:"members"`
			Withheld []struct {
				PID int `json:"pid"`
			} `json:"withheld"`
		} `json:"trees"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &rep); err != nil || r.Code != 0 {
		t.Fatalf("reconcile: exit %d, %v: %s %s", r.Code, err, r.Stdout, r.Stderr)
	}
	if len(rep.Trees) != 1 || rep.Trees[0].Action != "reaped" {
		t.Fatalf("want one reaped tree: %s", r.Stdout)
	}
	escaped, withheld := map[int]bool{}, map[int]bool{}
	for _, m := range rep.Trees[0].Members {
		escaped[m.PID] = m.Escaped
	}
	for _, m := range rep.Trees[0].Withheld {
		withheld[m.PID] = true
	}
	if !escaped[tr.setsid.PID] || escaped[tr.group[0].PID] {
		t.Errorf("members not marked escaped as they are: %s", r.Stdout)
	}
	if !withheld[tr.otherUID.PID] || !withheld[tr.otherCtnr.PID] {
		t.Errorf("other UID's and other container's descendants not reported: %s", r.Stdout)
	}
	tr.check(t, "reconcile --apply --bpf "+bpf, bystander)
}

// TestEscapedDescendantDiesWithWatch: `watch` handles a container's
// death (a Docker Engine API double on a unix socket lists it running,
// then reports its `die` and lists it no more) by reaping its stray tree,
// the kernel's setsid child included; another UID's descendant, another
// container's anchor and an unrelated process live.
func TestEscapedDescendantDiesWithWatch(t *testing.T) {
	cid := newCID(t)
	tr := startEscapeTree(t, cid)
	bystander := startKernel(t, &syscall.SysProcAttr{Setsid: true})

	var mu sync.Mutex
	running := true
	events := make(chan string, 1)
	dockerSock := dockertest.API(t, shortDir(t, "kcesc"), func() string {
		mu.Lock()
		defer mu.Unlock()
		if running {
			return fmt.Sprintf(`[{"Id":%q,"Names":["/escape"],"State":"running"}]`, cid)
		}
		return "[]"
	}, events)

	state := t.TempDir()
	logFile := filepath.Join(t.TempDir(), "watch.log")
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, janitorBin(t), "--engine", "docker", "--docker-url", "unix://"+dockerSock, "--state-dir", state,
		"--log-file", logFile,
		"watch", "--reconcile-apply", "--interval", "1h", "--no-cull", "--min-age", "0s", "--kill-grace", "300ms",
		"--container", cid, "--supervisor-comm", escapeComm, "--socket-dir", t.TempDir())
	cmd.Env = baseEnv("/usr/bin:/bin")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); cmd.Wait() })
	logged := func(s string) bool {
		b, _ := os.ReadFile(logFile)
		return strings.Contains(string(b), s)
	}
	if !proc.Poll(30*time.Second, func() bool { return logged("following container deaths") }) {
		b, _ := os.ReadFile(logFile)
		t.Fatalf("watch never followed deaths:\n%s\nstderr: %s", b, stderr.String())
	}
	if len(aliveOf(append([]fingerprint.Stat{tr.setsid}, tr.group...))) != 3 {
		t.Fatal("the tree of a running container was touched")
	}

	mu.Lock()
	running = false
	mu.Unlock()
	events <- fmt.Sprintf(`{"Type":"container","Action":"die","timeNano":%d,"Actor":{"ID":%q}}`+"\n", time.Now().UnixNano(), cid)
	proc.WaitFor(t, 30*time.Second, "the death handled", func() bool { return logged("container death handled") })
	tr.check(t, "watch", bystander.Stat)
	if t.Failed() {
		b, _ := os.ReadFile(logFile)
		t.Logf("watch log:\n%s\nstderr: %s", b, stderr.String())
	}
}
