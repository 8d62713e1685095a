// Package kubernetes checks the shipped manifests: every document decodes
// strictly into the Kubernetes API type its kind names (a misspelt field
// fails), and the DaemonSet keeps the settings the janitor needs on a
// containerd node.
package kubernetes

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// strict decodes a YAML document as the API server does in strict field
// validation: duplicate keys, unknown fields and fields in the wrong case
// (encoding/json would take hostPid for hostPID) are errors.
func strict(doc []byte, obj any) error {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strictErrs, err := kjson.UnmarshalStrict(j, obj)
	if err != nil {
		return err
	}
	if len(strictErrs) > 0 {
		return errors.Join(strictErrs...)
	}
	return nil
}

// documents splits a multi-document YAML file.
func documents(t *testing.T, path string) [][]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, d := range bytes.Split(data, []byte("\n---\n")) {
		// A document of comments only is no object.
		empty := true
		for _, line := range strings.Split(string(d), "\n") {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
				empty = false
			}
		}
		if !empty {
			out = append(out, d)
		}
	}
	return out
}

// decode decodes every manifest of the directory strictly by kind.
func decode(t *testing.T) (dss []*appsv1.DaemonSet) {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	for _, f := range files {
		for i, doc := range documents(t, f) {
			var meta struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
			}
			if err := yaml.Unmarshal(doc, &meta); err != nil {
				t.Fatalf("%s document %d: %v", f, i, err)
			}
			var obj any
			switch meta.APIVersion + " " + meta.Kind {
			case "v1 Namespace":
				obj = &corev1.Namespace{}
			case "apps/v1 DaemonSet":
				obj = &appsv1.DaemonSet{}
			case "v1 ConfigMap":
				obj = &corev1.ConfigMap{}
			default:
				t.Fatalf("%s document %d: no decoder for %s %s; add it here", f, i, meta.APIVersion, meta.Kind)
			}
			if err := strict(doc, obj); err != nil {
				t.Fatalf("%s document %d (%s): %v", f, i, meta.Kind, err)
			}
			if ds, ok := obj.(*appsv1.DaemonSet); ok {
				dss = append(dss, ds)
			}
		}
	}
	return dss
}

func TestManifestsDecodeStrictly(t *testing.T) {
	if len(decode(t)) == 0 {
		t.Fatal("no DaemonSet in the manifests")
	}
}

// TestStrictCatchesTypos proves the decoding above would fail on a typo.
func TestStrictCatchesTypos(t *testing.T) {
	for _, tc := range []struct{ name, doc string }{
		{"unknown field", "apiVersion: apps/v1\nkind: DaemonSet\nspec:\n  template:\n    spec:\n      hostPid: true\n"},
		{"wrong type", "apiVersion: apps/v1\nkind: DaemonSet\nspec:\n  template:\n    spec:\n      hostPID: yes-please\n"},
		{"duplicate key", "apiVersion: apps/v1\nkind: DaemonSet\nkind: DaemonSet\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := strict([]byte(tc.doc), &appsv1.DaemonSet{}); err == nil {
				t.Fatal("decoded without an error")
			}
		})
	}
}

// janitor returns the DaemonSet's janitor container.
func janitor(t *testing.T) (*appsv1.DaemonSet, corev1.Container) {
	t.Helper()
	for _, ds := range decode(t) {
		for _, c := range ds.Spec.Template.Spec.Containers {
			if c.Name == "janitor" {
				return ds, c
			}
		}
	}
	t.Fatal("no container named janitor")
	return nil, corev1.Container{}
}

func TestDaemonSetForContainerd(t *testing.T) {
	ds, c := janitor(t)
	spec := ds.Spec.Template.Spec
	if !spec.HostPID || !spec.HostNetwork {
		t.Errorf("hostPID %v hostNetwork %v; the janitor needs both", spec.HostPID, spec.HostNetwork)
	}
	args := strings.Join(c.Args, " ")
	for _, want := range []string{"watch", "--engine containerd", "--containerd-address /run/containerd/containerd.sock", "--metrics-file /var/lib/node-exporter/"} {
		if !strings.Contains(args, want) {
			t.Errorf("janitor args %q lack %q", args, want)
		}
	}
	// Audit mode by default: nothing that reaps or unlinks is switched on.
	for _, a := range c.Args {
		if strings.Contains(a, "apply") || a == "--hooks-dir" {
			t.Errorf("janitor arg %q: the shipped DaemonSet runs in audit mode and watch takes no --hooks-dir", a)
		}
	}
	for _, e := range c.Env {
		if slices.Contains([]string{"KC_SWEEP", "KC_APPLY", "KC_RECONCILE_APPLY"}, e.Name) {
			t.Errorf("env %s=%s switches audit mode off", e.Name, e.Value)
		}
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m.Name
	}
	volumes := map[string]bool{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = true
	}
	// doctor reads the node's containerd config, its base spec and the
	// kc-hook it names at the node's paths.
	for _, path := range []string{"/run/containerd", "/run/kc-watchman", "/tmp", "/var/lib/node-exporter", "/sys/fs/cgroup", "/etc/containerd", "/opt/kc-watchman"} {
		if mounts[path] == "" {
			t.Errorf("janitor does not mount %s", path)
		}
	}
	// The evidence that a container runs is read from the host's
	// cgroups, and an apply run sweeps a gone container's supervisor
	// cgroup there; host mounts made after the start (logind's
	// /run/user/UID) must show.
	for _, m := range c.VolumeMounts {
		if m.MountPath == "/sys/fs/cgroup" && m.ReadOnly {
			t.Error("the host's /sys/fs/cgroup is mounted read-only: an apply run could not freeze or kill a cgroup")
		}
		if slices.Contains([]string{"/run/user", "/run/containerd", "/sys/fs/cgroup"}, m.MountPath) &&
			(m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationHostToContainer) {
			t.Errorf("%s does not see the host's later mounts (mountPropagation HostToContainer)", m.MountPath)
		}
	}
	// The units' MemoryMax: what a round may peak at (RELIABILITY.md).
	if lim := c.Resources.Limits.Memory(); lim.Cmp(resource.MustParse("256Mi")) < 0 {
		t.Errorf("memory limit %s, below the 256Mi a round may need", lim)
	}
	for _, ct := range append(spec.InitContainers, spec.Containers...) {
		for _, m := range ct.VolumeMounts {
			if !volumes[m.Name] {
				t.Errorf("container %s mounts volume %q, which is not defined", ct.Name, m.Name)
			}
		}
	}
}

// TestDaemonSetProbesAndMetrics: metrics bound to the pod's IP (the
// node's, with hostNetwork) rather than every address, the probes on a
// loopback listener of their own, scrape annotations that match, an
// init container with no shell, and the namespace allowed to run it.
func TestDaemonSetProbesAndMetrics(t *testing.T) {
	ds, c := janitor(t)
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if ip := env["POD_IP"]; ip.ValueFrom == nil || ip.ValueFrom.FieldRef == nil || ip.ValueFrom.FieldRef.FieldPath != "status.podIP" {
		t.Errorf("POD_IP is not the pod's IP: %+v", ip)
	}
	if v := env["KC_METRICS_LISTEN"].Value; v != "[$(POD_IP)]:9475" {
		t.Errorf("KC_METRICS_LISTEN %q, want [$(POD_IP)]:9475 (an IPv6 pod IP has colons)", v)
	}
	var port int32
	for _, p := range c.Ports {
		if p.Name == "metrics" {
			port = p.ContainerPort
		}
	}
	if port != 9475 {
		t.Errorf("metrics port %d, want 9475", port)
	}
	// The probes have a listener of their own, on loopback: metrics
	// clients, anyone who reaches 9475, cannot fill it.
	if v := env["KC_HEALTH_LISTEN"].Value; v != "127.0.0.1:9476" {
		t.Errorf("KC_HEALTH_LISTEN %q, want 127.0.0.1:9476", v)
	}
	for what, tc := range map[string]struct {
		p    *corev1.Probe
		path string
	}{"liveness": {c.LivenessProbe, "/healthz"}, "readiness": {c.ReadinessProbe, "/readyz"}} {
		if tc.p == nil || tc.p.HTTPGet == nil || tc.p.HTTPGet.Path != tc.path || tc.p.HTTPGet.Host != "127.0.0.1" || tc.p.HTTPGet.Port.String() != "9476" {
			t.Errorf("%s probe %+v, want GET 127.0.0.1:9476%s", what, tc.p, tc.path)
		}
	}
	a := ds.Spec.Template.Annotations
	if a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != "9475" || a["prometheus.io/path"] != "/metrics" {
		t.Errorf("scrape annotations %v", a)
	}
	for _, ic := range ds.Spec.Template.Spec.InitContainers {
		if len(ic.Command) == 0 || ic.Command[0] != "/usr/bin/kc-janitor" {
			t.Errorf("init container %s runs %v: the image has no shell", ic.Name, ic.Command)
		}
	}
	var ns corev1.Namespace
	if err := strict(documents(t, "daemonset.yaml")[0], &ns); err != nil || ns.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
		t.Errorf("namespace labels %v (%v): not labelled for Pod Security enforce: privileged", ns.Labels, err)
	}
}
