package sweep

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// NSIndex is the host's processes by PID namespace, listed once for the
// sweeps of many containers (Config.Namespaces: one watch round, one
// cull): each container's view used to walk /proc by itself, a readlink
// per process per container (65 ms a container at 10,000 processes, and
// a round of 40 containers starved the deaths decided meanwhile). A view
// taken from it is never believed as it stands: each process it names is
// checked to be in the namespace still, with that PID, before it is used,
// and a PID it lacks or that moved makes that container's view walk
// /proc after all.
type NSIndex struct {
	mu       sync.Mutex
	procRoot string
	at       time.Time // when listed; zero: not yet
	maxAge   time.Duration
	err      error
	byNS     map[string][]nsProc
}

// nsIndexMaxAge: an index older than this is listed again for the next
// container. Its entries are checked at use, but a supervisor started
// after it would go undiscovered (its socket directory not swept) for
// the rest of a round whose probes can take seconds per container.
const nsIndexMaxAge = time.Second

type nsProc struct{ host, inner int }

// NewNSIndex returns an index, listed at its first use.
func NewNSIndex() *NSIndex { return &NSIndex{maxAge: nsIndexMaxAge} }

// of returns the processes of PID namespace ns (readlink of ns/pid) as
// the index listed them under procRoot.
func (x *NSIndex) of(procRoot, ns string) ([]nsProc, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.at.IsZero() {
		x.procRoot = procRoot
	}
	if procRoot != x.procRoot {
		return nil, fmt.Errorf("namespace index of %s asked about %s", x.procRoot, procRoot)
	}
	if x.at.IsZero() || time.Since(x.at) > x.maxAge {
		x.at = time.Now()
		x.byNS, x.err = listNamespaces(procRoot)
	}
	return x.byNS[ns], x.err
}

// listNamespaces lists every process outside procRoot's own PID
// namespace with its innermost PID, by namespace.
func listNamespaces(procRoot string) (map[string][]nsProc, error) {
	self, _ := os.Readlink(procRoot + "/self/ns/pid")
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, err
	}
	out := map[string][]nsProc{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		base := procRoot + "/" + e.Name()
		ns, err := os.Readlink(base + "/ns/pid")
		if err != nil || ns == self {
			continue
		}
		if inner, ok := nsPID(base + "/status"); ok {
			out[ns] = append(out[ns], nsProc{host: pid, inner: inner})
		}
	}
	return out, nil
}

// stillIn reports whether host PID h is, now, the process with PID
// inner in namespace ns. err says why that could not be read, when the
// process is not simply gone (out of descriptors, an I/O error): the
// caller must not take that for an answer.
func stillIn(procRoot string, h, inner int, ns string) (bool, error) {
	base := procRoot + "/" + strconv.Itoa(h)
	got, err := os.Readlink(base + "/ns/pid")
	if err != nil {
		return false, unlessGone(base, err)
	}
	if got != ns {
		return false, nil
	}
	n, ok := nsPID(base + "/status")
	if !ok {
		return false, unlessGone(base, fmt.Errorf("no NSpid in %s/status", base))
	}
	return n == inner, nil
}

// unlessGone is err, or nil when the process at base is gone.
func unlessGone(base string, err error) error {
	if _, serr := os.Stat(base); errors.Is(serr, fs.ErrNotExist) || errors.Is(serr, syscall.ESRCH) {
		return nil
	}
	return err
}
