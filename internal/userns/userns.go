// Package userns translates user IDs between the user namespace a process
// runs in and the host's. Rootless podman runs OCI hooks as UID 0 of its
// own user namespace: the hook's "root" is an ordinary user on the host,
// and /proc shows it every process's UID in namespace terms (the user's own
// processes as 0, anyone unmapped as the overflow UID, usually 65534). What
// the hook may touch, where it keeps its ledger and what it writes there
// must be decided in host terms.
package userns

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ErrUnmapped is returned (wrapped) for a UID the map does not cover.
var ErrUnmapped = errors.New("not mapped to a host UID")

// Extent is one line of a uid_map: Count IDs from Inside map to Count IDs
// from Outside.
type Extent struct {
	Inside, Outside, Count uint64
}

// Map is a process's uid_map. The initial user namespace's map is the
// identity over all 2^32-1 IDs.
type Map []Extent

// SelfMapFile is the calling process's UID map.
const SelfMapFile = "/proc/self/uid_map"

// ReadMap parses a uid_map file.
func ReadMap(path string) (Map, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading the user namespace's UID map: %w", err)
	}
	defer f.Close()
	var m Map
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 3 {
			return nil, fmt.Errorf("%s: malformed line %q", path, sc.Text())
		}
		var e Extent
		for i, p := range []*uint64{&e.Inside, &e.Outside, &e.Count} {
			v, err := strconv.ParseUint(fields[i], 10, 32)
			if err != nil {
				return nil, fmt.Errorf("%s: malformed line %q: %w", path, sc.Text(), err)
			}
			*p = v
		}
		m = append(m, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	return m, nil
}

// Self is the calling process's UID map.
func Self() (Map, error) { return ReadMap(SelfMapFile) }

// ToHost returns the host UID of uid, a UID as seen inside the map's
// namespace. A map read from the initial namespace is the identity.
func (m Map) ToHost(uid int) (int, error) {
	if uid < 0 {
		return -1, fmt.Errorf("uid %d: %w", uid, ErrUnmapped)
	}
	u := uint64(uid)
	for _, e := range m {
		if u >= e.Inside && u-e.Inside < e.Count {
			return int(e.Outside + (u - e.Inside)), nil
		}
	}
	return -1, fmt.Errorf("uid %d: %w", uid, ErrUnmapped)
}

// Initial reports whether the map is the initial user namespace's: the
// identity over the whole ID space.
func (m Map) Initial() bool {
	return len(m) == 1 && m[0].Inside == 0 && m[0].Outside == 0 && m[0].Count == 1<<32-1
}

// HostEUID is the calling process's effective UID in host terms. When the
// map cannot be read (no /proc), the effective UID is taken as it is.
func HostEUID() int {
	m, err := Self()
	if err != nil {
		return os.Geteuid()
	}
	if h, err := m.ToHost(os.Geteuid()); err == nil {
		return h
	}
	return os.Geteuid()
}

// OverflowUIDFile holds the UID the kernel shows for a UID the reader's
// namespace does not map.
const OverflowUIDFile = "/proc/sys/kernel/overflowuid"

// Translator turns the UIDs the caller reads from /proc into host UIDs.
type Translator struct {
	Map Map
	// Overflow is the kernel's overflow UID: inside a user namespace, a
	// process whose UID is not mapped shows as this one, so it names no
	// host UID for sure even where the map covers it.
	Overflow int
}

// SelfTranslator reads the caller's UID map and the overflow UID.
func SelfTranslator() (Translator, error) {
	m, err := Self()
	if err != nil {
		return Translator{}, err
	}
	tr := Translator{Map: m, Overflow: 65534}
	if data, err := os.ReadFile(OverflowUIDFile); err == nil {
		if v, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil {
			tr.Overflow = v
		}
	}
	return tr, nil
}

// Host returns the host UID of uid as read from /proc by the caller, or -1
// with an error when it cannot be known.
func (tr Translator) Host(uid int) (int, error) {
	if !tr.Map.Initial() && uid == tr.Overflow {
		return -1, fmt.Errorf("uid %d is the overflow UID: %w", uid, ErrUnmapped)
	}
	return tr.Map.ToHost(uid)
}
