package sweep

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// TestStillInRefusesWhatItCannotRead: an index entry is believed only
// when the process's namespace and NSpid read back as listed. A process
// that is gone, or in another namespace, is simply not there; a status
// that cannot be read, or carries no NSpid, is an error the caller must
// not take for an answer, and a view asked about such a PID refuses to
// map it (the socket's owner then stays unsure and the socket is kept).
func TestStillInRefusesWhatItCannotRead(t *testing.T) {
	const ns, host, inner = "pid:[4026532999]", 4242, 7
	tests := []struct {
		name    string
		link    string // ns/pid target; "" for none
		status  string // status content; "-" for a status that cannot be read
		gone    bool   // no /proc/<pid> at all
		want    bool
		wantErr bool
	}{
		{name: "the listed process", link: ns, status: "Name:\tkcserver\nNSpid:\t4242\t7\n", want: true},
		{name: "another PID in the namespace", link: ns, status: "NSpid:\t4242\t8\n"},
		{name: "another namespace", link: "pid:[4026531836]", status: "NSpid:\t4242\n"},
		{name: "gone", gone: true},
		{name: "status unreadable", link: ns, status: "-", wantErr: true},
		{name: "no NSpid line", link: ns, status: "Name:\tkcserver\n", wantErr: true},
		{name: "empty NSpid", link: ns, status: "NSpid:\n", wantErr: true},
		{name: "namespace unreadable", status: "NSpid:\t4242\t7\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			base := filepath.Join(root, strconv.Itoa(host))
			if !tt.gone {
				if err := os.MkdirAll(filepath.Join(base, "ns"), 0o755); err != nil {
					t.Fatal(err)
				}
				if tt.link != "" {
					if err := os.Symlink(tt.link, filepath.Join(base, "ns", "pid")); err != nil {
						t.Fatal(err)
					}
				}
				switch tt.status {
				case "-":
					// A directory where the file should be: open works,
					// reading fails, as an I/O error would.
					if err := os.Mkdir(filepath.Join(base, "status"), 0o755); err != nil {
						t.Fatal(err)
					}
				default:
					if err := os.WriteFile(filepath.Join(base, "status"), []byte(tt.status), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			got, err := stillIn(root, host, inner, ns)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("stillIn = %v, %v; want %v, error %v", got, err, tt.want, tt.wantErr)
			}
			v := &pidView{procRoot: root, container: true, ns: ns, indexed: true, hostOf: map[int]int{inner: host}}
			if tt.wantErr {
				if h, ok, err := v.hostPID(inner); err == nil || ok {
					t.Errorf("hostPID = %d, %v, %v; want a refusal", h, ok, err)
				}
			}
		})
	}
}
