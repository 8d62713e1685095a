package trees

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// proc is one fake process in a fixture /proc tree.
type proc struct {
	pid, pgid, uid int
	comm           string
	state          byte
	start          uint64
	argv           []string
	tgid           int // 0 means pid
	// garbled replaces the stat file with bytes no parser accepts (a
	// read that fails for another reason than the process being gone).
	garbled bool
	// unreadableArgv makes cmdline unreadable (a directory): a member
	// whose stat and status read, and whose argv does not, as when its
	// memory stalls.
	unreadableArgv bool
}

// writeFixture lays out a procfs-like tree under a temp dir, with an uptime
// of 1000s, in the style of prometheus/procfs's fixtures.
func writeFixture(t *testing.T, procs []proc) string {
	t.Helper()
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "uptime"), []byte("1000.00 1900.00\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		dir := filepath.Join(root, strconv.Itoa(p.pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		state := p.state
		if state == 0 {
			state = 'S'
		}
		tgid := p.tgid
		if tgid == 0 {
			tgid = p.pid
		}
		stat := fmt.Sprintf("%d (%s) %c 1 %d %d 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 %d 1000 100 18446744073709551615\n",
			p.pid, p.comm, state, p.pgid, p.pgid, p.start)
		if p.garbled {
			stat = "garbled\n"
		}
		status := fmt.Sprintf("Name:\t%s\nTgid:\t%d\nPid:\t%d\nUid:\t%d\t%d\t%d\t%d\n", p.comm, tgid, p.pid, p.uid, p.uid, p.uid, p.uid)
		cmdline := strings.Join(p.argv, "\x00")
		if len(p.argv) > 0 {
			cmdline += "\x00"
		}
		for name, data := range map[string]string{"stat": stat, "status": status, "cmdline": cmdline} {
			if name == "cmdline" && p.unreadableArgv {
				if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return root
}
