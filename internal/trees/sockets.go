package trees

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// soAcceptCon is __SO_ACCEPTCON in the Flags column of /proc/net/unix: the
// socket is listening.
const soAcceptCon = 0x10000

// ListeningSockets returns the paths of the kc-*.sock sockets that the given
// processes hold open and listen on, as seen from their own mount
// namespace. It reads /proc/<pid>/fd for socket inodes and the network
// namespace's unix table of the first pid to map inodes to paths.
func ListeningSockets(root string, pids []int) []string {
	inodes := map[uint64]bool{}
	for _, pid := range pids {
		dir := root + "/" + strconv.Itoa(pid) + "/fd"
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			link, err := os.Readlink(dir + "/" + e.Name())
			if err != nil || !strings.HasPrefix(link, "socket:[") {
				continue
			}
			ino, err := strconv.ParseUint(strings.TrimSuffix(link[len("socket:["):], "]"), 10, 64)
			if err == nil {
				inodes[ino] = true
			}
		}
	}
	if len(inodes) == 0 {
		return nil
	}
	seen := map[string]bool{}
	var out []string
	for _, pid := range pids {
		for _, e := range readUnixTable(root + "/" + strconv.Itoa(pid) + "/net/unix") {
			if !inodes[e.inode] || e.flags&soAcceptCon == 0 || seen[e.path] {
				continue
			}
			if name := filepath.Base(e.path); strings.HasPrefix(name, "kc-") && strings.HasSuffix(name, ".sock") {
				seen[e.path] = true
				out = append(out, e.path)
			}
		}
		if len(out) > 0 {
			break
		}
	}
	return out
}

type unixEntry struct {
	flags uint64
	inode uint64
	path  string
}

// readUnixTable parses a /proc/net/unix file:
// "Num RefCount Protocol Flags Type St Inode Path".
func readUnixTable(path string) []unixEntry {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []unixEntry
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 8 || !strings.HasPrefix(fields[7], "/") {
			continue
		}
		flags, err1 := strconv.ParseUint(fields[3], 16, 64)
		ino, err2 := strconv.ParseUint(fields[6], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, unixEntry{flags: flags, inode: ino, path: strings.Join(fields[7:], " ")})
	}
	return out
}
