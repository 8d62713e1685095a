package podman

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// errOtherStore: the API service answers for another store than the CLI
// arguments name.
var errOtherStore = errors.New("the service runs on another store")

// storeArgs are the store paths named in podman's global CLI arguments.
type storeArgs struct {
	root, runroot string
}

func (s storeArgs) empty() bool { return s.root == "" && s.runroot == "" }

// parseStoreArgs finds --root and --runroot (as "--root=X" or "--root X")
// in podman global arguments.
func parseStoreArgs(args []string) storeArgs {
	var s storeArgs
	for i := 0; i < len(args); i++ {
		for _, name := range []string{"--root", "--runroot"} {
			var v string
			switch {
			case strings.HasPrefix(args[i], name+"="):
				v = strings.TrimPrefix(args[i], name+"=")
			case args[i] == name && i+1 < len(args):
				i++
				v = args[i]
			default:
				continue
			}
			if name == "--root" {
				s.root = v
			} else {
				s.runroot = v
			}
		}
	}
	return s
}

// check compares the service's store with the named one.
func (s storeArgs) check(graphRoot, runRoot string) error {
	if s.root != "" && !samePath(s.root, graphRoot) {
		return fmt.Errorf("its graph root is %s, --podman-arg names --root %s", graphRoot, s.root)
	}
	if s.runroot != "" && !samePath(s.runroot, runRoot) {
		return fmt.Errorf("its run root is %s, --podman-arg names --runroot %s", runRoot, s.runroot)
	}
	return nil
}

func samePath(a, b string) bool {
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	ra, err1 := filepath.EvalSymlinks(a)
	rb, err2 := filepath.EvalSymlinks(b)
	return err1 == nil && err2 == nil && ra == rb
}
