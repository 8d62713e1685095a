package reap

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/kc-watchman/kc-watchman"

// acting are the calls that act on a tree: only this package makes them,
// so kc-hook's poststop and reconcile (and doctor --fix and watch through
// it) cannot drift apart in how they kill and unlink.
var acting = map[string]string{
	module + "/internal/pgkill":  "Kill",
	module + "/internal/sockets": "RemoveTreeSockets",
}

// elsewhere are the uses of acting calls outside this package that are
// not a tree's reaping, by package and function.
var elsewhere = map[string]string{
	// The previous init's `kc-hook supervise` wrapper, stopped before a
	// new one is launched (its group killed when SIGTERM did not stop
	// it): the wrapper records its own outcome in the ledger, under the
	// lock reap would take.
	module + "/internal/hook.killWrapperGroup": module + "/internal/pgkill.Kill",
}

// callers must reach the one path.
var callers = []string{module + "/internal/hook", module + "/internal/reconcile"}

// use is one reference to a function of another package.
type use struct {
	pkg, fn string // where: import path, enclosing function
	target  string // what: import path + "." + name
	pos     string
}

// TestOnePath lists every package of the shipped binaries and fails on a
// kill or a socket unlink of a tree outside reap, and when hook or
// reconcile stop going through reap.Run.
func TestOnePath(t *testing.T) {
	pkgs := listShipped(t)
	runs := map[string]bool{}
	for _, p := range pkgs {
		us, err := scan(p.ImportPath, p.files())
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range us {
			if u.target == module+"/internal/reap.Run" {
				runs[u.pkg] = true
			}
			if violates(u) {
				t.Errorf("%s: %s calls %s; trees are reaped through reap.Run only", u.pos, u.fn, u.target)
			}
		}
	}
	for _, c := range callers {
		if !runs[c] {
			t.Errorf("%s does not call reap.Run", c)
		}
	}
	if len(pkgs) < 10 {
		t.Fatalf("only %d packages listed; the listing of the shipped code is broken", len(pkgs))
	}
}

// TestOnePathFindsCalls: the scan is worth something only if it sees the
// calls, under any import name, and as values too.
func TestOnePathFindsCalls(t *testing.T) {
	tests := []struct {
		name, imp, body string
		found           bool
	}{
		{"a group kill", `"` + module + `/internal/pgkill"`, `pgkill.Kill(nil, pgkill.Group{}, pgkill.Options{})`, true},
		{"renamed import", `pk "` + module + `/internal/pgkill"`, `pk.Kill(nil, pk.Group{}, pk.Options{})`, true},
		{"as a value", `"` + module + `/internal/pgkill"`, `f := pgkill.Kill; _ = f`, true},
		{"a socket unlink", `"` + module + `/internal/sockets"`, `_ = sockets.RemoveTreeSockets(nil, nil)`, true},
		{"listing a group (control)", `"` + module + `/internal/pgkill"`, `_ = pgkill.Members("/proc", 1)`, false},
		{"listing sockets (control)", `"` + module + `/internal/sockets"`, `_ = sockets.TreeSockets("/proc", 0, nil, nil)`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			src := "package probe\n\nimport " + tt.imp + "\n\nfunc probe() {\n\t" + tt.body + "\n}\n"
			f := filepath.Join(dir, "probe.go")
			if err := os.WriteFile(f, []byte(src), 0o600); err != nil {
				t.Fatal(err)
			}
			us, err := scan("probe", []string{f})
			if err != nil {
				t.Fatal(err)
			}
			got := slices.ContainsFunc(us, violates)
			if got != tt.found {
				t.Errorf("found %v in %+v, want %v", got, us, tt.found)
			}
		})
	}
}

func violates(u use) bool {
	for pkg, name := range acting {
		if u.target != pkg+"."+name {
			continue
		}
		return u.pkg != module+"/internal/reap" && u.pkg != pkg && elsewhere[u.pkg+"."+u.fn] != u.target
	}
	return false
}

// scan returns every reference, in the files of package path, to a
// function of another package of the module.
func scan(path string, files []string) ([]use, error) {
	fset := token.NewFileSet()
	var out []use
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		imports := map[string]string{} // local name → import path
		for _, is := range f.Imports {
			p, err := strconv.Unquote(is.Path.Value)
			if err != nil || !strings.HasPrefix(p, module+"/") {
				continue
			}
			local := p[strings.LastIndex(p, "/")+1:]
			if is.Name != nil {
				local = is.Name.Name
			}
			if local == "." {
				return nil, fmt.Errorf("%s: dot import of %s: the scan cannot see its calls", name, p)
			}
			imports[local] = p
		}
		for _, d := range f.Decls {
			fn := "(package level)"
			if fd, ok := d.(*ast.FuncDecl); ok {
				fn = fd.Name.Name
			}
			ast.Inspect(d, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if x, ok := sel.X.(*ast.Ident); ok && imports[x.Name] != "" {
					out = append(out, use{pkg: path, fn: fn, target: imports[x.Name] + "." + sel.Sel.Name, pos: fset.Position(sel.Pos()).String()})
				}
				return true
			})
		}
	}
	return out, nil
}

type listed struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Error      *struct{ Err string }
}

func (p listed) files() []string {
	var out []string
	for _, f := range p.GoFiles {
		out = append(out, filepath.Join(p.Dir, f))
	}
	return out
}

// listShipped lists the module's packages the shipped binaries are built
// from, with the Makefile's tags.
func listShipped(t *testing.T) []listed {
	t.Helper()
	cmd := exec.Command("go", "list", "-e", "-json", "-deps", module+"/cmd/...")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v: %s", err, stderr.Bytes())
	}
	var pkgs []listed
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("reading go list's output: %v", err)
		}
		if p.Error != nil {
			t.Fatalf("go list: %s: %s", p.ImportPath, p.Error.Err)
		}
		if strings.HasPrefix(p.ImportPath, module+"/") {
			pkgs = append(pkgs, p)
		}
	}
	return pkgs
}
