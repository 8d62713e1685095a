package pgkill_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// The one place for the pidfd rules: only these packages may send a
// signal to another process. Everything else asks them.
const module = "github.com/kc-watchman/kc-watchman"

var signallers = []string{module + "/internal/pgkill", module + "/internal/fingerprint"}

// shipped are the binaries whose code the rule covers.
var shipped = []string{module + "/cmd/..."}

// killFuncs send a signal to a process or group named by the caller.
var killFuncs = map[string]bool{
	"syscall.Kill":                                         true,
	"syscall.Tgkill":                                       true,
	"golang.org/x/sys/unix.Kill":                           true,
	"golang.org/x/sys/unix.Tgkill":                         true,
	"golang.org/x/sys/unix.PidfdSendSignal":                true,
	"(*os.Process).Signal":                                 true,
	"(*os.Process).Kill":                                   true,
	"(*" + module + "/internal/fingerprint.Pinned).Signal": true,
}

// killSyscalls are the raw system call numbers that do the same.
var killSyscalls = map[string]bool{
	"SYS_KILL": true, "SYS_TKILL": true, "SYS_TGKILL": true, "SYS_PIDFD_SEND_SIGNAL": true,
	"SYS_RT_SIGQUEUEINFO": true, "SYS_RT_TGSIGQUEUEINFO": true,
}

// TestOnlyPgkillAndFingerprintSignal type-checks every package of the
// shipped binaries and fails on any use, outside pgkill and fingerprint,
// of a call that signals another process. The one exception is a child
// the code started itself through os/exec (see ownChild).
func TestOnlyPgkillAndFingerprintSignal(t *testing.T) {
	w := loadWorld(t)
	checked := 0
	for _, p := range w.pkgs {
		if !strings.HasPrefix(p.ImportPath, module+"/") || slices.Contains(signallers, p.ImportPath) {
			continue
		}
		var files []string
		for _, f := range p.GoFiles {
			files = append(files, filepath.Join(p.Dir, f))
		}
		found, err := w.check(p.ImportPath, files, nil)
		if err != nil {
			t.Fatalf("%s: %v", p.ImportPath, err)
		}
		checked++
		for _, f := range found {
			t.Errorf("%s signals another process outside pgkill and fingerprint; ask pgkill instead", f)
		}
	}
	if checked < 5 {
		t.Fatalf("only %d of the module's packages were checked; the listing of the shipped code is broken", checked)
	}
}

// TestSignalScanFindsKills: the scan is only worth something if it sees
// each way of signalling, and lets through what is not one.
func TestSignalScanFindsKills(t *testing.T) {
	w := loadWorld(t)
	tests := []struct {
		name, body string
		found      bool
	}{
		{"unix.Kill", `_ = unix.Kill(pid, unix.SIGTERM)`, true},
		{"syscall.Kill of a group", `_ = syscall.Kill(-pid, syscall.SIGKILL)`, true},
		{"unix.Tgkill", `_ = unix.Tgkill(pid, pid, unix.SIGTERM)`, true},
		{"pidfd_send_signal", `_ = unix.PidfdSendSignal(3, unix.SIGTERM, nil, 0)`, true},
		{"a kill as a value", `f := unix.Kill; _ = f`, true},
		{"raw kill(2)", `unix.RawSyscall(unix.SYS_KILL, uintptr(pid), 9, 0)`, true},
		{"os.Process found by PID", `p, _ := os.FindProcess(pid); _ = p.Signal(syscall.SIGTERM)`, true},
		{"os.Process.Kill", `p, _ := os.FindProcess(pid); _ = p.Kill()`, true},
		{"a pinned process", `pin, _ := fingerprint.Pin("/proc", fingerprint.Stat{PID: pid}); _ = pin.Signal(syscall.SIGTERM)`, true},
		{"own child", `c := exec.Command("true"); _ = c.Start(); _ = c.Process.Signal(syscall.SIGTERM)`, false},
		{"own child's group", `c := exec.Command("true"); _ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)`, false},
		{"a group named by a child's PID number", `c := exec.Command("true"); n := c.Process.Pid; _ = syscall.Kill(-n, syscall.SIGKILL)`, true},
		{"reading a process (control)", `_, _ = fingerprint.ReadStat("/proc", pid)`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := `package probe
import (
	"os"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"

	"` + module + `/internal/fingerprint"
)
var _, _, _, _ = os.Getpid, exec.Command, syscall.Getpid, unix.Getpid
var _ = fingerprint.DefaultRoot
func probe(pid int) {
	` + tt.body + `
}
`
			found, err := w.check("probe", nil, map[string]string{"probe.go": src})
			if err != nil {
				t.Fatal(err)
			}
			if got := len(found) > 0; got != tt.found {
				t.Errorf("found %v, want a finding: %v", found, tt.found)
			}
		})
	}
}

// world is the shipped code as the go command lists it, with the export
// data of every package it imports.
type world struct {
	fset    *token.FileSet
	pkgs    []listed
	exports map[string]string
}

type listed struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Export     string
	Standard   bool
	Error      *struct{ Err string }
}

var (
	worldOnce sync.Once
	theWorld  *world
	worldErr  error
)

func loadWorld(t *testing.T) *world {
	t.Helper()
	worldOnce.Do(func() { theWorld, worldErr = list() })
	if worldErr != nil {
		t.Fatal(worldErr)
	}
	return theWorld
}

func list() (*world, error) {
	args := append([]string{"list", "-e", "-json", "-export", "-deps"}, shipped...)
	cmd := exec.Command("go", args...)
	// As the Makefile builds.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, stderr.Bytes())
	}
	w := &world{fset: token.NewFileSet(), exports: map[string]string{}}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("reading go list's output: %w", err)
		}
		if p.Error != nil {
			return nil, fmt.Errorf("go list: %s: %s", p.ImportPath, p.Error.Err)
		}
		w.exports[p.ImportPath] = p.Export
		w.pkgs = append(w.pkgs, p)
	}
	return w, nil
}

// check type-checks one package, from files on disk or from sources
// given by name, and returns where it signals another process.
func (w *world) check(path string, files []string, sources map[string]string) ([]string, error) {
	var parsed []*ast.File
	for _, f := range files {
		af, err := parser.ParseFile(w.fset, f, nil, 0)
		if err != nil {
			return nil, err
		}
		parsed = append(parsed, af)
	}
	for name, src := range sources {
		af, err := parser.ParseFile(w.fset, name, src, 0)
		if err != nil {
			return nil, err
		}
		parsed = append(parsed, af)
	}
	imp := importer.ForCompiler(w.fset, "gc", func(p string) (io.ReadCloser, error) {
		f, ok := w.exports[p]
		if !ok || f == "" {
			return nil, fmt.Errorf("no export data for %s", p)
		}
		return os.Open(f)
	})
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}, Types: map[ast.Expr]types.TypeAndValue{}}
	if _, err := (&types.Config{Importer: imp}).Check(path, w.fset, parsed, info); err != nil {
		return nil, fmt.Errorf("type-checking %s: %w", path, err)
	}
	var found []string
	for _, af := range parsed {
		// The call each function expression is the callee of, to look at
		// its receiver and arguments.
		callOf := map[ast.Expr]*ast.CallExpr{}
		ast.Inspect(af, func(n ast.Node) bool {
			if c, ok := n.(*ast.CallExpr); ok {
				callOf[ast.Unparen(c.Fun)] = c
			}
			return true
		})
		selected := map[*ast.Ident]bool{} // judged with their selector
		ast.Inspect(af, func(n ast.Node) bool {
			var id *ast.Ident
			var expr ast.Expr
			switch n := n.(type) {
			case *ast.SelectorExpr:
				id, expr = n.Sel, n
				selected[n.Sel] = true
			case *ast.Ident:
				if selected[n] {
					return true
				}
				id, expr = n, n
			default:
				return true
			}
			obj := info.Uses[id]
			if obj == nil || !signals(obj) || ownChild(info, expr, callOf[expr]) {
				return true
			}
			found = append(found, fmt.Sprintf("%s: %s", w.fset.Position(id.Pos()), name(obj)))
			return true
		})
	}
	return slices.Compact(found), nil
}

func name(obj types.Object) string {
	if f, ok := obj.(*types.Func); ok {
		return f.FullName()
	}
	return obj.Pkg().Path() + "." + obj.Name()
}

func signals(obj types.Object) bool {
	switch o := obj.(type) {
	case *types.Func:
		return killFuncs[o.FullName()]
	case *types.Const:
		p := o.Pkg()
		return p != nil && (p.Path() == "syscall" || p.Path() == "golang.org/x/sys/unix") && killSyscalls[o.Name()]
	}
	return false
}

// ownChild reports whether the signal goes to a child the code started
// through os/exec, or to the group that child leads: x.Process.Signal,
// x.Process.Kill, or kill(±x.Process.Pid) with x an *exec.Cmd. os.Process
// holds a pidfd for its child, and the child's PID (its group's number)
// stays the caller's until the caller reaps it.
func ownChild(info *types.Info, fn ast.Expr, call *ast.CallExpr) bool {
	if sel, ok := fn.(*ast.SelectorExpr); ok && isCmdProcess(info, sel.X) {
		return true // x.Process.Signal / x.Process.Kill
	}
	if call == nil || len(call.Args) == 0 {
		return false
	}
	arg := ast.Unparen(call.Args[0])
	if u, ok := arg.(*ast.UnaryExpr); ok && u.Op == token.SUB {
		arg = ast.Unparen(u.X)
	}
	sel, ok := arg.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "Pid" && isCmdProcess(info, sel.X)
}

// isCmdProcess reports whether e is x.Process with x an exec.Cmd.
func isCmdProcess(info *types.Info, e ast.Expr) bool {
	sel, ok := ast.Unparen(e).(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "Process" {
		return false
	}
	t := info.Types[sel.X].Type
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	n, ok := t.(*types.Named)
	return ok && n.Obj().Pkg() != nil && n.Obj().Pkg().Path() == "os/exec" && n.Obj().Name() == "Cmd"
}
