package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// rootlessUser is the throwaway user .ci/lib/rootless.sh created, with
// subordinate IDs, /run/user/<uid> and a per-user podman setup.
type rootlessUser struct {
	name     string
	uid, gid int
	home     string
	dir      string // this test's files, owned by the user
}

func needRootlessUser(t *testing.T) rootlessUser {
	t.Helper()
	name := os.Getenv("KC_TEST_ROOTLESS_USER")
	if name == "" {
		if os.Getenv("KC_E2E") == "1" {
			t.Fatal("KC_E2E=1 but KC_TEST_ROOTLESS_USER is unset (see .ci/lib/rootless.sh)")
		}
		t.Skip("KC_TEST_ROOTLESS_USER unset (see .ci/lib/rootless.sh)")
	}
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	ru := rootlessUser{name: name, home: u.HomeDir}
	ru.uid, _ = strconv.Atoi(u.Uid)
	ru.gid, _ = strconv.Atoi(u.Gid)
	ru.dir, err = os.MkdirTemp(u.HomeDir, "kc-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(ru.dir) })
	os.Chmod(ru.dir, 0o755)
	os.Chown(ru.dir, ru.uid, ru.gid)
	return ru
}

// env is the user's whole environment: nothing of root's (CONTAINERS_CONF,
// KC_PODMAN_URL) leaks into their podman or janitor.
func (ru rootlessUser) env(extra ...string) []string {
	return append([]string{"HOME=" + ru.home, "USER=" + ru.name, "LOGNAME=" + ru.name,
		"XDG_RUNTIME_DIR=/run/user/" + strconv.Itoa(ru.uid), "PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"}, extra...)
}

func (ru rootlessUser) command(env []string, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Env = env
	cmd.Dir = ru.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(ru.uid), Gid: uint32(ru.gid)}}
	return cmd
}

// run runs a command as the user and returns stdout and the exit code.
func (ru rootlessUser) run(t *testing.T, env []string, name string, args ...string) (string, int) {
	t.Helper()
	cmd := ru.command(env, name, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		t.Logf("%s %s: exit %d: %s", name, strings.Join(args, " "), ee.ExitCode(), errb.String())
		return out.String(), ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	return out.String(), 0
}

// install copies src into the user's test dir as an executable.
func (ru rootlessUser) install(t *testing.T, src, name string) string {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(ru.dir, name)
	if err := os.WriteFile(p, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRootlessPoststop is the rootless poststop end to end: the shipped
// descriptors, only their path rewritten, in the user's hooks_dir; a
// `podman stop` as the user reaps the user's tree (whose supervisor ignores
// SIGTERM, so its socket stays for the hook), removes its socket and
// records the outcome under /run/user/<uid>/kc-watchman; root's tree
// carrying the same ID is neither signalled nor recorded; the janitor run
// as the user with no flags finds the ledger.
func TestRootlessPoststop(t *testing.T) {
	ru := needRootlessUser(t)
	hook := ru.install(t, bin(t, "kc-hook"), "kc-hook")
	kcj := ru.install(t, bin(t, "kc-janitor"), "kc-janitor")
	fake := ru.install(t, testutil.BuildKCServer(t), "kcserver")

	// A busybox root file system the user owns.
	rootfs := filepath.Join(ru.dir, "rootfs")
	os.MkdirAll(filepath.Join(rootfs, "bin"), 0o755)
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Fatal(err)
	}
	ru.install(t, bb, "rootfs/bin/busybox")
	for _, a := range []string{"sh", "sleep"} {
		os.Symlink("busybox", filepath.Join(rootfs, "bin", a))
	}
	filepath.Walk(ru.dir, func(p string, _ os.FileInfo, _ error) error { return os.Lchown(p, ru.uid, ru.gid) })

	// The shipped descriptors in the user's hooks_dir, path rewritten.
	hooksDir := filepath.Join(ru.home, ".config/containers/oci/hooks.d")
	descs, _ := filepath.Glob("../../hooks.d/*.json")
	if len(descs) == 0 {
		t.Fatal("no descriptors in hooks.d")
	}
	for _, d := range descs {
		data, err := os.ReadFile(d)
		if err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(hooksDir, filepath.Base(d))
		if err := os.WriteFile(out, bytes.ReplaceAll(data, []byte("/usr/local/libexec/oci/hooks.d/kc-hook"), []byte(hook)), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(out) })
	}
	stateDir := ledger.DefaultDir(ru.uid)
	env := ru.env()

	out, code := ru.run(t, env, "podman", "run", "-d", "--network", "none", "--rootfs", rootfs, "/bin/sleep", "1000")
	id := strings.TrimSpace(out)
	if code != 0 || len(id) != 64 {
		t.Fatalf("podman run as %s: exit %d, %q", ru.name, code, out)
	}
	t.Cleanup(func() { ru.run(t, env, "podman", "rm", "-f", "-t", "0", id) })

	// The user's tree: kc-hook supervise leads it and carries the ID; the
	// fake ignores SIGTERM. Its "init" is a sleep of the user's.
	initCmd := ru.command(env, "sleep", "1000000")
	if err := initCmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { initCmd.Process.Kill(); initCmd.Wait() })
	initSt, err := fingerprint.ReadStat("/proc", initCmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	socks := filepath.Join(ru.dir, "socks")
	os.Mkdir(socks, 0o700)
	os.Chown(socks, ru.uid, ru.gid)
	ready := filepath.Join(ru.dir, "ready")
	treeCmd := ru.command(ru.env("KCFAKE_READY_FILE="+ready, "KCFAKE_IGNORE_TERM=1", "KCFAKE_CHILDREN=1"), hook,
		"supervise", "--state-dir=", "--max-restarts=0", id, strconv.Itoa(initSt.PID), strconv.FormatUint(initSt.StartTicks, 10),
		"--", fake, "--transport=socket", "--socket-dir="+socks)
	if err := treeCmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-treeCmd.Process.Pid, syscall.SIGKILL); treeCmd.Wait() })
	var sock string
	var fakePID int
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if b, err := os.ReadFile(ready); err == nil {
			if p, where, ok := strings.Cut(strings.TrimSpace(string(b)), "\n"); ok {
				fakePID, _ = strconv.Atoi(p)
				sock = where
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the user's fake supervisor did not become ready")
		}
	}
	fakeSt, err := fingerprint.ReadStat("/proc", fakePID)
	if err != nil {
		t.Fatal(err)
	}

	// Root's tree with the same container ID.
	rootTree := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{ContainerID: id, Children: 1})
	rootMembers := group(t, rootTree.PGID)

	if _, code := ru.run(t, env, "podman", "stop", "-t", "1", id); code != 0 {
		t.Fatalf("podman stop as %s: exit %d", ru.name, code)
	}

	// The record, with the user's tree reaped.
	recPath := filepath.Join(stateDir, "containers", id+".json")
	var rec ledger.Record
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if data, err := os.ReadFile(recPath); err == nil && json.Unmarshal(data, &rec) == nil && rec.Outcome != "" {
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(stateDir, "kc-hook.log"))
			t.Fatalf("no outcome in %s; hook log:\n%s", recPath, log)
		}
	}
	if rec.Outcome != "reaped" || len(rec.Trees) != 1 {
		t.Fatalf("record: outcome %q, trees %+v; want reaped, one tree", rec.Outcome, rec.Trees)
	}
	tr := rec.Trees[0]
	if tr.UID != ru.uid || tr.PGID != treeCmd.Process.Pid {
		t.Errorf("recorded tree pgid %d uid %d, want pgid %d and host uid %d", tr.PGID, tr.UID, treeCmd.Process.Pid, ru.uid)
	}
	if len(tr.SocketsUnlinked) != 1 || tr.SocketsUnlinked[0] != sock {
		t.Errorf("sockets unlinked %q, want [%q]", tr.SocketsUnlinked, sock)
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("the user's socket %s is still there: %v", sock, err)
	}
	waitAllDead(t, []fingerprint.Stat{fakeSt}, 10*time.Second)
	if alive := aliveOf(rootMembers); len(alive) != len(rootMembers) {
		t.Errorf("root's tree was signalled: %d of %d members left", len(alive), len(rootMembers))
	}

	// The janitor as the user, with no flags, finds that ledger.
	out, code = ru.run(t, env, kcj, "status", "--format", "json")
	var st struct {
		StateDir string `json:"state_dir"`
		Records  []struct {
			ContainerID string `json:"container_id"`
		} `json:"records"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil || code != 0 {
		t.Fatalf("status: exit %d, %v: %s", code, err, out)
	}
	found := false
	for _, r := range st.Records {
		found = found || r.ContainerID == id
	}
	if st.StateDir != stateDir || !found {
		t.Errorf("status as the user reads %s (want %s), record found %v", st.StateDir, stateDir, found)
	}
	if _, code := ru.run(t, env, kcj, "reconcile", "--format", "json"); code != 0 {
		t.Errorf("reconcile as the user: exit %d", code)
	}
	out, _ = ru.run(t, env, kcj, "doctor", "--format", "json")
	var rep struct {
		Checks []struct {
			Name    string `json:"check"`
			Verdict string `json:"verdict"`
			Detail  string `json:"message"`
		} `json:"checks"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("doctor: %v: %s", err, out)
	}
	seen := 0
	for _, c := range rep.Checks {
		switch c.Name {
		case "state-dir":
			seen++
			if c.Verdict != "ok" || !strings.Contains(c.Detail, stateDir) {
				t.Errorf("doctor state-dir: %s %s", c.Verdict, c.Detail)
			}
		case "hook-installed", "hook-alive":
			seen++
			if c.Verdict != "ok" {
				t.Errorf("doctor %s: %s %s", c.Name, c.Verdict, c.Detail)
			}
		}
	}
	if seen != 3 {
		t.Errorf("doctor as the user: %d of its state-dir and hook checks in %s", seen, out)
	}
}

// startUserTree starts a tree of the user's for container id: kc-hook
// supervise leading it, the fake supervisor in it. It returns the fake's
// identity and the wrapper's PID (the group).
func (ru rootlessUser) startUserTree(t *testing.T, hook, fake, id string) (fingerprint.Stat, int) {
	t.Helper()
	initCmd := ru.command(ru.env(), "sleep", "1000000")
	if err := initCmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { initCmd.Process.Kill(); initCmd.Wait() })
	initSt, err := fingerprint.ReadStat("/proc", initCmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(ru.dir, "tree-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chown(dir, ru.uid, ru.gid)
	ready := filepath.Join(dir, "ready")
	cmd := ru.command(ru.env("KCFAKE_READY_FILE="+ready, "KCFAKE_CHILDREN=1"), hook,
		"supervise", "--state-dir=", "--max-restarts=0", id, strconv.Itoa(initSt.PID), strconv.FormatUint(initSt.StartTicks, 10),
		"--", fake, "--transport=socket", "--socket-dir="+dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() })
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if b, err := os.ReadFile(ready); err == nil {
			if p, _, ok := strings.Cut(strings.TrimSpace(string(b)), "\n"); ok {
				pid, _ := strconv.Atoi(p)
				st, err := fingerprint.ReadStat("/proc", pid)
				if err != nil {
					t.Fatal(err)
				}
				return st, cmd.Process.Pid
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the user's fake supervisor did not become ready")
		}
	}
}

// TestRootJanitorOnUserSocket: root's janitor pointed at the user's podman
// API socket takes that socket's owner as the UID the answer vouches for:
// it reaps the user's tree of a container the user's podman does not have,
// and leaves root's tree carrying the same ID alone.
func TestRootJanitorOnUserSocket(t *testing.T) {
	ru := needRootlessUser(t)
	hook := ru.install(t, bin(t, "kc-hook"), "kc-hook")
	fake := ru.install(t, testutil.BuildKCServer(t), "kcserver")

	sock := filepath.Join(ru.dir, "podman.sock")
	svc := ru.command(ru.env(), "podman", "system", "service", "--time=0", "unix://"+sock)
	if err := svc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		svc.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { svc.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			svc.Process.Kill()
			<-done
		}
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the user's podman API service did not start")
		}
	}

	id := strings.Repeat("5e", 32) // no container of the user's has it
	fakeSt, _ := ru.startUserTree(t, hook, fake, id)
	rootTree := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{ContainerID: id, Children: 1})
	rootMembers := group(t, rootTree.PGID)

	var out string
	var code int
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		out, _, code = janitor(t, []string{"PATH=/usr/bin:/bin"}, "reconcile", "--apply", "--min-age", "0s", "--engine", "podman",
			"--podman-url", "unix://"+sock, "--container", id, "--state-dir", t.TempDir(), "--format", "json")
		if code != 3 || time.Now().After(deadline) {
			break // 3: the service was not answering yet
		}
	}
	if code != 0 {
		t.Fatalf("reconcile: exit %d: %s", code, out)
	}
	var rep struct {
		Trees []struct {
			PGID   int    `json:"pgid"`
			UID    int    `json:"uid"`
			Action string `json:"action"`
		} `json:"trees"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	actions := map[int]string{}
	for _, tr := range rep.Trees {
		actions[tr.UID] = tr.Action
	}
	if actions[ru.uid] != "reaped" || actions[0] != "skipped-other-uid" {
		t.Errorf("actions by uid %v, want the user's reaped and root's skipped-other-uid: %s", actions, out)
	}
	waitAllDead(t, []fingerprint.Stat{fakeSt}, 15*time.Second)
	if alive := aliveOf(rootMembers); len(alive) != len(rootMembers) {
		t.Errorf("root's tree was signalled: %d of %d members left", len(alive), len(rootMembers))
	}

	// The path does not say who answers. A socket file
	// that stat()s as root's (what swapping the path for root's socket
	// after the query showed the old code) vouches only for the UID of
	// the service that answered on the connection; a symlinked endpoint is
	// not dialled (the CLI's answer through it vouches for no UID).
	if err := os.Chown(sock, 0, 0); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(ru.dir, "link.sock")
	if err := os.Symlink(sock, link); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, url string
		source    string
	}{{"socket file owned by root", "unix://" + sock, `"source": "api"`}, {"symlinked endpoint", "unix://" + link, `"source": "cli"`}} {
		out, _, code := janitor(t, []string{"PATH=/usr/bin:/bin"}, "reconcile", "--apply", "--min-age", "0s", "--engine", "podman",
			"--podman-url", c.url, "--container", id, "--state-dir", t.TempDir(), "--format", "json")
		if code != 0 || !strings.Contains(out, c.source) || !strings.Contains(out, `"skipped-other-uid"`) {
			t.Errorf("%s: exit %d, want 0 with %s and root's tree skipped-other-uid: %s", c.name, code, c.source, out)
		}
		if alive := aliveOf(rootMembers); len(alive) != len(rootMembers) {
			t.Fatalf("%s: root's tree was signalled: %d of %d members left", c.name, len(alive), len(rootMembers))
		}
	}
}
