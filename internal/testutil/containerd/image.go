package containerdtest

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// ImageName is the name the busybox image is imported under.
const ImageName = "localhost/kc-busybox:latest"

// BusyboxPath is Debian's busybox-static binary; a dynamically linked
// busybox would need its libraries in the image.
const BusyboxPath = "/bin/busybox"

var archive struct {
	once sync.Once
	data []byte
	err  error
}

// Archive returns an OCI image archive (the layout `ctr images import`
// reads) of a one-layer busybox image: busybox-static, a symlink for each
// of its applets in /bin, an empty /tmp. It is built once per test binary.
func Archive() ([]byte, error) {
	archive.once.Do(func() { archive.data, archive.err = buildArchive() })
	return archive.data, archive.err
}

type blob struct {
	mediaType string
	data      []byte
}

func (b blob) digest() string {
	sum := sha256.Sum256(b.data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func (b blob) descriptor() map[string]any {
	return map[string]any{"mediaType": b.mediaType, "digest": b.digest(), "size": len(b.data)}
}

func buildArchive() ([]byte, error) {
	layer, err := busyboxLayer()
	if err != nil {
		return nil, err
	}
	l := blob{"application/vnd.oci.image.layer.v1.tar", layer}
	cfg, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"config": map[string]any{
			"Env": []string{"PATH=/bin"},
			"Cmd": []string{"/bin/sleep", "2147483647"},
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{l.digest()}},
	})
	if err != nil {
		return nil, err
	}
	c := blob{"application/vnd.oci.image.config.v1+json", cfg}
	man, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        c.descriptor(),
		"layers":        []any{l.descriptor()},
	})
	if err != nil {
		return nil, err
	}
	m := blob{"application/vnd.oci.image.manifest.v1+json", man}
	md := m.descriptor()
	md["annotations"] = map[string]string{
		"io.containerd.image.name":          ImageName,
		"org.opencontainers.image.ref.name": "latest",
	}
	md["platform"] = map[string]string{"architecture": "amd64", "os": "linux"}
	index, err := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []any{md}})
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	files := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
	}
	for _, b := range []blob{l, c, m} {
		files = append(files, struct {
			name string
			data []byte
		}{"blobs/sha256/" + strings.TrimPrefix(b.digest(), "sha256:"), b.data})
	}
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: time.Unix(0, 0)}); err != nil {
			return nil, err
		}
	}
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: 0o644, Size: int64(len(f.data)), ModTime: time.Unix(0, 0)}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// busyboxLayer is the uncompressed layer tar.
func busyboxLayer() ([]byte, error) {
	bin, err := os.ReadFile(BusyboxPath)
	if err != nil {
		return nil, fmt.Errorf("%w (apt-get install busybox-static)", err)
	}
	out, err := exec.Command(BusyboxPath, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", BusyboxPath, err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	for _, d := range []string{"bin/", "tmp/", "proc/", "sys/", "dev/", "etc/", "run/"} {
		mode := int64(0o755)
		if d == "tmp/" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: mode, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755, Size: int64(len(bin)), ModTime: epoch}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" || strings.Contains(applet, "/") {
			continue
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + applet, Linkname: "busybox", Mode: 0o777, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
