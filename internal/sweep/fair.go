package sweep

import (
	"bufio"
	"io"
	"os"
	"os/user"
	"strconv"
	"strings"
)

// byOwnerTurns orders probes so that the sockets' owners take turns,
// each owner's in their order (path order): the workers start on every
// owner's first sockets, and a user whose sockets never answer spends his
// share of the deadline, not everyone's. In path order, 400 of his names
// before another user's socket used up the 30 s deadline, and that socket
// was reported not probed. owner maps a socket file's UID to whose turn
// it takes (subIDs.owner).
func byOwnerTurns(ps []*probe, owner func(uid int) int) []*probe {
	var owners []int
	by := map[int][]*probe{}
	for _, p := range ps {
		uid := owner(p.names[0].e.uid) // one inode: one owner
		if _, ok := by[uid]; !ok {
			owners = append(owners, uid)
		}
		by[uid] = append(by[uid], p)
	}
	if len(owners) < 2 {
		return ps
	}
	out := make([]*probe, 0, len(ps))
	for turn := 0; len(owners) > 0; turn++ {
		left := owners[:0]
		for _, uid := range owners {
			if turn < len(by[uid]) {
				out = append(out, by[uid][turn])
			}
			if turn+1 < len(by[uid]) {
				left = append(left, uid)
			}
		}
		owners = left
	}
	return out
}

// subIDs are the subordinate UID ranges of /etc/subuid with the user
// each was delegated to. A rootless user's containers write files as any
// of his 65,536 subordinate UIDs; each must not take a turn of its own.
type subIDs []subRange

type subRange struct {
	start, count uint64
	owner        int
}

// maxSubUIDFile caps what is read of the subordinate UID file.
const maxSubUIDFile = 1 << 20

// readSubIDs reads path (user:start:count lines, the user a name or a
// UID). A missing file, or a line it cannot use, delegates nothing.
func readSubIDs(path string) subIDs {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out subIDs
	sc := bufio.NewScanner(io.LimitReader(f, maxSubUIDFile))
	for sc.Scan() {
		who, rest, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok || strings.HasPrefix(who, "#") {
			continue
		}
		first, count, ok := strings.Cut(rest, ":")
		start, err1 := strconv.ParseUint(first, 10, 32)
		n, err2 := strconv.ParseUint(count, 10, 32)
		if !ok || err1 != nil || err2 != nil || n == 0 {
			continue
		}
		uid, err := strconv.Atoi(who)
		if err != nil {
			u, lerr := user.Lookup(who)
			if lerr != nil {
				continue
			}
			if uid, err = strconv.Atoi(u.Uid); err != nil {
				continue
			}
		}
		out = append(out, subRange{start: start, count: n, owner: uid})
	}
	return out
}

// owner returns the user uid was delegated to, or uid itself.
func (s subIDs) owner(uid int) int {
	for _, r := range s {
		if uint64(uid) >= r.start && uint64(uid)-r.start < r.count {
			return r.owner
		}
	}
	return uid
}
