package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"
)

// installHookCommand is the DaemonSet init container's step: the image is
// FROM scratch, so copying kc-hook onto the node and writing containerd's
// base spec naming it cannot be left to a shell.
func installHookCommand() *cli.Command {
	return &cli.Command{
		Name:   "install-hook",
		Usage:  "copy kc-hook onto a node and write containerd's base runtime spec, or CRI-O's hook descriptors, naming it (the DaemonSet's init container)",
		Hidden: true,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "from", Value: "/usr/libexec/kc-watchman/kc-hook", Usage: "the kc-hook `FILE` to copy"},
			&cli.StringFlag{Name: "to", Required: true, Usage: "`DIR` to install kc-hook in (a host path mounted into the container)"},
			&cli.StringFlag{Name: "hook-path", Usage: "the `PATH` of the installed kc-hook as the node sees it, for the base spec and the descriptors", DefaultText: "DIR/kc-hook"},
			&cli.StringFlag{Name: "base-spec", Usage: "the containerd base runtime spec `FILE` whose kc-hook entries are to name --hook-path"},
			&cli.StringFlag{Name: "base-spec-out", Usage: "the `FILE` to write that spec to (a host path mounted into the container)"},
			&cli.StringFlag{Name: "hooks-dir", Usage: "write kc-hook's oci-hooks(5) descriptors, naming --hook-path, to `DIR` (CRI-O's /etc/containers/oci/hooks.d, as a host path mounted into the container)"},
			&cli.StringFlag{Name: "descriptors", Value: "/usr/share/kc-watchman/hooks.d", Usage: "the `DIR` of kc-hook's descriptors to write to --hooks-dir"},
			&cli.BoolFlag{Name: "add-hooks", Usage: "--base-spec is the node's own: add kc-hook's createRuntime and poststop hooks where it names none, keep the rest (its rlimits too)"},
		},
		Action: runInstallHook,
	}
}

func runInstallHook(c *cli.Context) error {
	if (c.String("base-spec") == "") != (c.String("base-spec-out") == "") {
		return usageErr("--base-spec and --base-spec-out go together")
	}
	to := c.String("to")
	dst := filepath.Join(to, "kc-hook")
	hookPath := c.String("hook-path")
	if hookPath == "" {
		hookPath = dst
	}
	if (c.String("base-spec") != "" || c.String("hooks-dir") != "") && !filepath.IsAbs(hookPath) {
		return usageErr("--hook-path must be absolute, not %q", hookPath)
	}
	if in, out := c.String("base-spec"), c.String("base-spec-out"); in != "" && sameFile(in, out) {
		// The spec a handler names would keep naming kc-hook once
		// /opt/kc-watchman is removed, and runc fail all its containers.
		return usageErr("--base-spec-out must not be --base-spec itself (%s): write the spec with kc-hook's hooks beside it, and name that one", in)
	}
	// The binary before the spec and the descriptors: containerd fails
	// every container whose hook path does not exist.
	if err := copyExecutable(c.String("from"), dst); err != nil {
		return cli.Exit(fmt.Sprintf("install-hook: %v", err), exitFailed)
	}
	fmt.Fprintf(c.App.Writer, "installed %s\n", dst)
	if dir := c.String("hooks-dir"); dir != "" {
		if err := writeDescriptors(c.App.Writer, c.String("descriptors"), dir, hookPath); err != nil {
			return cli.Exit(fmt.Sprintf("install-hook: %v", err), exitFailed)
		}
	}
	if c.String("base-spec") == "" {
		return nil
	}
	data, err := os.ReadFile(c.String("base-spec"))
	if err != nil {
		return cli.Exit(fmt.Sprintf("install-hook: %v", err), exitFailed)
	}
	out, n, stripped, err := pointHooks(data, hookPath, c.Bool("add-hooks"))
	if err != nil {
		return cli.Exit(fmt.Sprintf("install-hook: %s: %v", c.String("base-spec"), err), exitFailed)
	}
	if n == 0 {
		return cli.Exit(fmt.Sprintf("install-hook: %s names no kc-hook in its hooks (--add-hooks adds them to a spec of the node's own)", c.String("base-spec")), exitFailed)
	}
	if err := writeAtomic(c.String("base-spec-out"), out, 0o644); err != nil {
		return cli.Exit(fmt.Sprintf("install-hook: %v", err), exitFailed)
	}
	fmt.Fprintf(c.App.Writer, "wrote %s (%d hooks -> %s)\n", c.String("base-spec-out"), n, hookPath)
	if stripped {
		fmt.Fprintf(c.App.Writer, "left out the spec's process.rlimits: containerd's own limits apply\n")
	}
	return nil
}

// kcHookStages are the stages kc-hook runs at under containerd, as
// contrib/containerd/base-runtime-spec.json lists them.
var kcHookStages = []string{"createRuntime", "poststop"}

// pointHooks sets the path of every hook in an OCI spec whose binary is
// kc-hook to hookPath. The shipped spec is containerd's default with the
// hooks added, so process.rlimits are dropped: a base spec replaces
// containerd's default spec for every pod of its runtime handler, and
// containerd applies its own limits only to a spec that sets none (a 1.6
// default spec's RLIMIT_NOFILE 1024:1024 would cap every pod on the node).
// With add, the spec is the node's own and only its hooks change: each
// stage of kcHookStages without a kc-hook gets one, after the hooks of
// other tools. Numbers are kept as written (uids, modes).
func pointHooks(spec []byte, hookPath string, add bool) (out []byte, n int, strippedRlimits bool, err error) {
	dec := json.NewDecoder(bytes.NewReader(spec))
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		return nil, 0, false, fmt.Errorf("not a JSON object: %w", err)
	}
	if proc, ok := doc["process"].(map[string]any); ok && !add {
		if _, ok := proc["rlimits"]; ok {
			delete(proc, "rlimits")
			strippedRlimits = true
		}
	}
	hooks, ok := doc["hooks"].(map[string]any)
	if h, present := doc["hooks"]; present && h != nil && !ok {
		return nil, 0, false, errors.New("hooks is not an object")
	}
	if hooks == nil {
		hooks = map[string]any{}
	}
	has := map[string]bool{}
	for name, stage := range hooks {
		list, ok := stage.([]any)
		if !ok && stage != nil {
			return nil, 0, false, fmt.Errorf("hooks.%s is not a list", name)
		}
		for _, h := range list {
			m, _ := h.(map[string]any)
			if p, ok := m["path"].(string); ok && filepath.Base(p) == "kc-hook" {
				m["path"] = hookPath
				has[name] = true
				n++
			}
		}
	}
	if add {
		for _, name := range kcHookStages {
			if has[name] {
				continue
			}
			list, _ := hooks[name].([]any)
			hooks[name] = append(list, map[string]any{
				"path":    hookPath,
				"args":    []any{"kc-hook", name},
				"env":     []any{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
				"timeout": json.Number("30"),
			})
			n++
		}
		doc["hooks"] = hooks
	}
	out, err = json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, 0, false, fmt.Errorf("encoding: %w", err)
	}
	return append(out, '\n'), n, strippedRlimits, nil
}

// writeDescriptors writes each kc-hook descriptor in from (one file per
// stage, as hooks.d/ has them) to dir with its hook path set to hookPath.
// A descriptor there of another name, an operator's own, is left alone.
// All are read before any is written, and together they must cover
// kcHookStages: one stage's hook without the other's would record trees
// no poststop reaps. The poststop descriptor is written first for the
// same reason (CRI-O picks each up as it appears).
func writeDescriptors(w io.Writer, from, dir, hookPath string) error {
	names, err := filepath.Glob(filepath.Join(from, "*.json"))
	if err != nil || len(names) == 0 {
		return fmt.Errorf("no hook descriptors (*.json) in %s", from)
	}
	outs := make([][]byte, len(names))
	covered := map[string]bool{}
	first := 0
	for i, name := range names {
		data, err := os.ReadFile(name)
		if err != nil {
			return err
		}
		var stages []string
		if outs[i], stages, err = pointDescriptor(data, hookPath); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		for _, s := range stages {
			covered[strings.ToLower(s)] = true
			if strings.EqualFold(s, "poststop") {
				first = i
			}
		}
	}
	for _, s := range kcHookStages {
		if !covered[strings.ToLower(s)] {
			return fmt.Errorf("the descriptors in %s run kc-hook at no %s stage", from, s)
		}
	}
	names[0], names[first] = names[first], names[0]
	outs[0], outs[first] = outs[first], outs[0]
	for i, name := range names {
		dst := filepath.Join(dir, filepath.Base(name))
		if err := writeAtomic(dst, outs[i], 0o644); err != nil {
			return err
		}
		fmt.Fprintf(w, "wrote %s (-> %s)\n", dst, hookPath)
	}
	return nil
}

// sameFile reports whether a and b name one file (b need not exist).
func sameFile(a, b string) bool {
	sa, err := os.Stat(a)
	if err != nil {
		return filepath.Clean(a) == filepath.Clean(b)
	}
	sb, err := os.Stat(b)
	return err == nil && os.SameFile(sa, sb)
}

// pointDescriptor sets an oci-hooks(5) descriptor's hook path, which must
// be kc-hook's, to hookPath, and returns its stages. Numbers are kept as
// written.
func pointDescriptor(data []byte, hookPath string) ([]byte, []string, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		return nil, nil, fmt.Errorf("not a JSON object: %w", err)
	}
	hook, _ := doc["hook"].(map[string]any)
	if p, _ := hook["path"].(string); filepath.Base(p) != "kc-hook" {
		return nil, nil, errors.New("not a kc-hook descriptor (hook.path)")
	}
	hook["path"] = hookPath
	var stages []string
	list, _ := doc["stages"].([]any)
	for _, s := range list {
		if s, ok := s.(string); ok {
			stages = append(stages, s)
		}
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, nil, fmt.Errorf("encoding: %w", err)
	}
	return append(out, '\n'), stages, nil
}

func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	var b bytes.Buffer
	if _, err := io.Copy(&b, in); err != nil {
		return fmt.Errorf("reading %s: %w", src, err)
	}
	return writeAtomic(dst, b.Bytes(), 0o755)
}

// writeAtomic replaces path at once: a node's containerd may create a
// container at any moment and must never find half a binary or spec.
func writeAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("chmod %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("syncing %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("installing %s: %w", path, err)
	}
	return nil
}
