package supervise

import (
	"os"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// GroupMembers lists the live processes (not zombies, not threads) whose
// process group is one of pgids. On the host's /proc it groups processes
// with getpgid(2) and reads stat files only for members; under any other
// root it reads every stat file.
func GroupMembers(root string, pgids ...int) []fingerprint.Stat {
	if root == "" {
		root = fingerprint.DefaultRoot
	}
	d, err := os.Open(root)
	if err != nil {
		return nil
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return nil
	}
	host := root == fingerprint.DefaultRoot
	var out []fingerprint.Stat
	for _, n := range names {
		if n == "" || n[0] < '0' || n[0] > '9' {
			continue
		}
		pid, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		if host {
			g, err := unix.Getpgid(pid)
			if err != nil || !slices.Contains(pgids, g) {
				continue
			}
		}
		st, err := fingerprint.ReadStat(root, pid)
		if err != nil || !slices.Contains(pgids, st.PGID) || st.Zombie() {
			continue
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b fingerprint.Stat) int { return a.PID - b.PID })
	return out
}
