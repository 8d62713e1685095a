package sweep

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestStillInRefusesWhatItCannotRead: an index entry is believed only
// when the process's namespace and NSpid read back as listed. A process
// that is gone, or in another namespace, is simply not there; a status
// that cannot be read, or carries no NSpid, is an error the caller must
// not take for an answer, and a view asked about such a PID refuses to
// map it (the socket's owner then stays unsure and the socket is kept).
func TestStillInRefusesWhatItCannotRead(t *testing.T) {
	const ns, host, inner = "pid:[4026532999]", 4242, 7
	var groups strings.Builder
	for g := range 65536 {
		fmt.Fprintf(&groups, "%d ", 100000+g)
	}
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
		{name: "the listed process, of 65536 groups", link: ns, status: "Name:\tkcserver\nGroups:\t" + groups.String() + "\nNSpid:\t4242\t7\n", want: true},
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

// TestWalkThatCannotReadIsUnsure: a walk of the container's namespace
// that could not read one of its processes maps no PID for sure: a PID it
// did not map may be that process's, so the owner is unsure (the socket
// kept), not stale. A walk that read every process may call a PID absent.
func TestWalkThatCannotReadIsUnsure(t *testing.T) {
	const ns = "pid:[4026532999]"
	for _, tt := range []struct {
		name    string
		broken  string // how the unreadable process is broken; "" for none
		wantErr bool
	}{
		{name: "every process read"},
		{name: "a status that cannot be read", broken: "status", wantErr: true},
		{name: "a namespace link that is not one", broken: "ns", wantErr: true},
		{name: "a zombie, its links gone", broken: "zombie"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			proc := func(pid int, link, status string, state byte) {
				base := filepath.Join(root, strconv.Itoa(pid))
				if err := os.MkdirAll(filepath.Join(base, "ns"), 0o755); err != nil {
					t.Fatal(err)
				}
				stat := fmt.Sprintf("%d (kcserver) %c 1 %d %d 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 1000 0 0 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n", pid, state, pid, pid)
				if err := os.WriteFile(filepath.Join(base, "stat"), []byte(stat), 0o644); err != nil {
					t.Fatal(err)
				}
				switch link {
				case "-":
					if err := os.WriteFile(filepath.Join(base, "ns", "pid"), nil, 0o644); err != nil {
						t.Fatal(err)
					}
				default:
					if err := os.Symlink(link, filepath.Join(base, "ns", "pid")); err != nil {
						t.Fatal(err)
					}
				}
				if status == "-" {
					if err := os.Mkdir(filepath.Join(base, "status"), 0o755); err != nil {
						t.Fatal(err)
					}
				} else if err := os.WriteFile(filepath.Join(base, "status"), []byte(status), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			proc(100, ns, "NSpid:\t100\t1\n", 'S')              // the container's init
			proc(150, "pid:[4026531836]", "NSpid:\t150\n", 'S') // the host's
			switch tt.broken {
			case "status":
				proc(200, ns, "-", 'S')
			case "ns":
				proc(200, "-", "NSpid:\t200\t5\n", 'S')
			case "zombie":
				proc(200, "-", "NSpid:\t200\t5\n", 'Z')
			}
			v := &pidView{procRoot: root, container: true, ns: ns}
			if err := v.walk(); err != nil {
				t.Fatal(err)
			}
			if h, ok, err := v.hostPID(1); h != 100 || !ok || err != nil {
				t.Errorf("init: hostPID(1) = %d, %v, %v; want 100", h, ok, err)
			}
			h, ok, err := v.hostPID(5)
			if ok || (err != nil) != tt.wantErr {
				t.Errorf("hostPID(5) = %d, %v, %v; want unmapped, error %v", h, ok, err, tt.wantErr)
			}
			want := sayStale
			if tt.wantErr {
				want = sayUnsure
			}
			if got, why := ownerGate(v, 5, 0, []string{"kcserver"}, time.Now(), time.Now()); got != want {
				t.Errorf("owner of a socket named for pid 5: %v (%s), want %v", got, why, want)
			}
		})
	}
}
