package fingerprint_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// fixtures is a hand-made procfs tree (stat, status, cmdline per PID).
const fixtures = "testdata/proc"

const fixtureID = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestReadFixtures(t *testing.T) {
	tests := []struct {
		name    string
		pid     int
		want    fingerprint.Identity
		wantErr error
		alive   bool
	}{
		{
			name: "supervisor",
			pid:  26231,
			want: fingerprint.Identity{
				Stat: fingerprint.Stat{PID: 26231, Comm: "kcserver", State: 'S', PPID: 1, PGID: 26231, SID: 26231, Threads: 4, StartTicks: 1000},
				TGID: 26231, UID: 1000, EUID: 1000, SUID: 1000, Argv: []string{"kcserver", "--container-id=" + fixtureID},
			},
			alive: true,
		},
		{
			name: "comm with parens",
			pid:  26232,
			want: fingerprint.Identity{
				Stat: fingerprint.Stat{PID: 26232, Comm: "a) (b", State: 'S', PPID: 26231, PGID: 26231, SID: 26231, Threads: 1, StartTicks: 1001},
				TGID: 26232, UID: 0, Argv: []string{"a) (b", "x y"},
			},
			alive: true,
		},
		{
			name: "zombie is read without error",
			pid:  26233,
			want: fingerprint.Identity{
				Stat: fingerprint.Stat{PID: 26233, Comm: "sleep", State: 'Z', PPID: 26231, PGID: 26231, SID: 26231, Threads: 1, StartTicks: 1002},
				TGID: 26233, UID: 1000, EUID: 1000, SUID: 1000,
			},
		},
		{name: "thread of another process", pid: 26234, wantErr: fingerprint.ErrNotProcess},
		{
			name: "leader exited, threads live",
			pid:  26235,
			want: fingerprint.Identity{
				Stat: fingerprint.Stat{PID: 26235, Comm: "worker", State: 'Z', PPID: 1, PGID: 26235, SID: 26235, Threads: 3, StartTicks: 1004},
				TGID: 26235, UID: 0,
			},
			alive: true,
		},
		{name: "status without Tgid", pid: 26236, wantErr: fingerprint.ErrMalformed},
		{name: "truncated stat", pid: 26237, wantErr: fingerprint.ErrMalformed},
		{name: "stat of another pid", pid: 26238, wantErr: fingerprint.ErrMalformed},
		{name: "status without Uid", pid: 26239, wantErr: fingerprint.ErrMalformed},
		{
			name: "argv rewritten without NULs",
			pid:  26240,
			want: fingerprint.Identity{
				Stat: fingerprint.Stat{PID: 26240, Comm: "my prog", State: 'R', PPID: 1, PGID: 26240, SID: 26240, Threads: 1, StartTicks: 1007},
				TGID: 26240, UID: 0, Argv: []string{"my prog --flag"},
			},
			alive: true,
		},
		{name: "no such pid", pid: 26299, wantErr: fingerprint.ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := fingerprint.Read(fixtures, tt.pid)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Read(%d) = %+v, %v; want %v", tt.pid, got, err, tt.wantErr)
				}
			} else {
				if err != nil {
					t.Fatalf("Read(%d): %v", tt.pid, err)
				}
				if !reflect.DeepEqual(got, tt.want) {
					t.Errorf("Read(%d):\n got %+v\nwant %+v", tt.pid, got, tt.want)
				}
			}

			// Liveness of the recorded identity, and of a recycled one.
			st, err := fingerprint.ReadStat(fixtures, tt.pid)
			if err != nil && tt.alive {
				t.Fatalf("ReadStat(%d): %v", tt.pid, err)
			}
			if err != nil {
				st = fingerprint.Stat{PID: tt.pid, StartTicks: 1}
			}
			if got := fingerprint.Alive(fixtures, st); got != tt.alive {
				t.Errorf("Alive(%d) = %v, want %v", tt.pid, got, tt.alive)
			}
			recycled := st
			recycled.StartTicks++
			if fingerprint.Alive(fixtures, recycled) {
				t.Errorf("Alive(%d) with another start time = true", tt.pid)
			}
			if _, err := fingerprint.Revalidate(fixtures, recycled); err == nil {
				t.Errorf("Revalidate(%d) with another start time succeeded", tt.pid)
			}
		})
	}
}

func TestRevalidateFixtures(t *testing.T) {
	tests := []struct {
		name    string
		want    fingerprint.Stat
		wantErr error
	}{
		{"same process", fingerprint.Stat{PID: 26231, StartTicks: 1000}, nil},
		{"zombie is still the recorded process", fingerprint.Stat{PID: 26233, StartTicks: 1002}, nil},
		{"recycled", fingerprint.Stat{PID: 26231, StartTicks: 999}, fingerprint.ErrRecycled},
		{"thread", fingerprint.Stat{PID: 26234, StartTicks: 1003}, fingerprint.ErrNotProcess},
		{"gone", fingerprint.Stat{PID: 26299, StartTicks: 1}, fingerprint.ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, err := fingerprint.Revalidate(fixtures, tt.want)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("Revalidate: %v", err)
				}
				if !fingerprint.Same(st, tt.want) {
					t.Errorf("Revalidate returned %+v, not the recorded %+v", st, tt.want)
				}
				return
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Revalidate = %v, want %v", err, tt.wantErr)
			}
		})
	}
}
