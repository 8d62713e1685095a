package doctor

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"
	"golang.org/x/sys/unix"
)

// ContainerdConfigs are where containerd's configuration lives: upstream's,
// then k3s's and RKE2's generated one.
var ContainerdConfigs = []string{
	"/etc/containerd/config.toml",
	"/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
	"/var/lib/rancher/rke2/agent/etc/containerd/config.toml",
}

// maxConfigBytes caps what is read of a containerd config or base spec: a
// file anyone made huge must not make doctor large.
const maxConfigBytes = 4 << 20

// Handler is one CRI runtime handler of a containerd configuration, and
// whether the pods it runs get kc-hook.
type Handler struct {
	Name     string
	BaseSpec string
	// Stages are the kc-hook stages its base spec carries.
	Stages []string
	// Problem says why it carries no hook, when it does not.
	Problem string
	// Broken: its base spec names a kc-hook the node does not have, so
	// runc fails every container of the handler.
	Broken bool
}

// Carries reports whether the handler's pods run kc-hook at poststop.
func (h Handler) Carries() bool {
	for _, s := range h.Stages {
		if s == "poststop" {
			return true
		}
	}
	return false
}

// ContainerdHandlers reads a containerd configuration (config version 2's
// `io.containerd.grpc.v1.cri` plugin or version 3's
// `io.containerd.cri.v1.runtime`) and says, per runtime handler, whether
// its base runtime spec carries kc-hook (DESIGN "Kubernetes nodes and
// packages": containerd runs only the hooks in a container's spec, and
// takes them from the handler's base_runtime_spec). root prefixes every
// path read (the DaemonSet reads the node through a host mount).
func ContainerdHandlers(root, configPath string) ([]Handler, error) {
	data, err := readConfig(filepath.Join(root, configPath), maxConfigBytes)
	if err != nil {
		return nil, err
	}
	var conf struct {
		Plugins map[string]struct {
			Containerd struct {
				Runtimes map[string]struct {
					BaseRuntimeSpec string `toml:"base_runtime_spec"`
				} `toml:"runtimes"`
			} `toml:"containerd"`
		} `toml:"plugins"`
	}
	if _, err := toml.Decode(string(data), &conf); err != nil {
		return nil, fmt.Errorf("%s: %w", configPath, err)
	}
	var out []Handler
	for _, plugin := range []string{"io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"} {
		for name, rt := range conf.Plugins[plugin].Containerd.Runtimes {
			h := Handler{Name: name, BaseSpec: rt.BaseRuntimeSpec}
			switch {
			case h.BaseSpec == "":
				h.Problem = "no base_runtime_spec: containerd runs no hook for its pods"
			default:
				h.Stages, h.Problem, h.Broken = specHooks(root, h.BaseSpec)
			}
			out = append(out, h)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// specHooks lists the stages of the OCI spec at path (under root) whose
// hook is kc-hook, or says what is wrong with it: a kc-hook the node does
// not have fails every container of the handler (runc cannot run it), and
// so may a timeout not above kc-hook's deadline (runc kills it first).
func specHooks(root, path string) (stages []string, problem string, broken bool) {
	data, err := readConfig(filepath.Join(root, path), maxConfigBytes)
	if err != nil {
		return nil, "base spec unreadable: " + err.Error(), false
	}
	var spec struct {
		Hooks map[string][]struct {
			Path    string   `json:"path"`
			Args    []string `json:"args"`
			Env     []string `json:"env"`
			Timeout *int     `json:"timeout"`
		} `json:"hooks"`
	}
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, "base spec is not an OCI spec: " + err.Error(), false
	}
	for stage, hs := range spec.Hooks {
		for _, h := range hs {
			if filepath.Base(h.Path) != "kc-hook" {
				continue
			}
			if err := runnable(root, h.Path); err != nil {
				return nil, fmt.Sprintf("its base spec names kc-hook at %s, which cannot be run here (%v): runc fails every container of this handler", h.Path, err), true
			}
			d := Descriptor{Args: h.Args, Env: h.Env, Timeout: h.Timeout}
			if p := d.timeoutBelowDeadline([]string{stage}); p != "" {
				return nil, "its base spec's " + p, true
			}
			stages = append(stages, stage)
			break
		}
	}
	sort.Strings(stages)
	if len(stages) == 0 {
		return nil, "its base spec names no kc-hook", false
	}
	return stages, "", false
}

// runnable says why the hook path p, as the node's runtime resolves it,
// is not a program runc could run. It is looked up in the node's
// filesystem: under root when given, else under PID 1's root when this
// process has another mount namespace (doctor in the DaemonSet's pod,
// with hostPID; the image has a kc-hook of its own), symlinks resolved
// inside it.
func runnable(root, p string) error {
	if !filepath.IsAbs(p) {
		return errors.New("not an absolute path")
	}
	if root == "" {
		root = nodeRoot()
	}
	if root == "" {
		root = "/"
	}
	dir, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dir)
	fd, err := unix.Openat2(dir, strings.TrimPrefix(p, "/"), &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT})
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o111 == 0 {
		return fmt.Errorf("not an executable file (mode %o)", st.Mode)
	}
	return nil
}

// nodeRoot is PID 1's root when this process runs in another mount
// namespace than PID 1 (both readable only by root), else "".
func nodeRoot() string {
	self, err1 := os.Readlink("/proc/self/ns/mnt")
	init, err2 := os.Readlink("/proc/1/ns/mnt")
	if err1 != nil || err2 != nil || self == init {
		return ""
	}
	return "/proc/1/root"
}

// WithContainerdHandlers adds to the hook-installed check what the first
// containerd configuration found says of each runtime handler. A node
// whose handlers carry the hook has it installed where no descriptor was
// found (noDescriptors): an error about descriptors that are there (one
// another user may write, settings kc-hook refuses) stays an error.
func WithContainerdHandlers(c Check, root string, noDescriptors bool) Check {
	for _, conf := range ContainerdConfigs {
		hs, err := ContainerdHandlers(root, conf)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			c.Items = append(c.Items, "containerd: "+err.Error())
			return c
		}
		var carrying []string
		broken := ""
		for _, h := range hs {
			if h.Broken && broken == "" {
				broken = h.Name + ": " + h.Problem
			}
			if h.Carries() {
				carrying = append(carrying, h.Name)
				c.Items = append(c.Items, fmt.Sprintf("containerd handler %s: kc-hook at %s (%s)", h.Name, strings.Join(h.Stages, ", "), h.BaseSpec))
				continue
			}
			problem := h.Problem
			if problem == "" {
				problem = "no poststop kc-hook in its base spec"
			}
			c.Items = append(c.Items, fmt.Sprintf("containerd handler %s: %s", h.Name, problem))
		}
		if len(carrying) > 0 && c.Verdict == Error && noDescriptors {
			c.Verdict, c.Remedy = OK, ""
			c.Detail = fmt.Sprintf("containerd (%s) runs kc-hook for handlers %s", conf, strings.Join(carrying, ", "))
		}
		if len(carrying) > 0 && len(carrying) < len(hs) && c.Verdict == OK {
			// Pods of the other runtime classes lose their trees to
			// the janitor's rounds alone.
			c.Verdict = Warn
		}
		if broken != "" {
			c.Verdict = Error
			c.Detail = fmt.Sprintf("containerd (%s) has a handler whose base spec's kc-hook fails its containers' start (%s)", conf, broken)
			c.Remedy = "put kc-hook where the base spec names it (kc-janitor install-hook) and keep its timeout above kc-hook's --deadline, or drop that base_runtime_spec and restart containerd"
		}
		return c
	}
	return c
}
