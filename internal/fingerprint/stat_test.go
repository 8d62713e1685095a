package fingerprint_test

import (
	"errors"
	"os"
	"os/exec"
	"reflect"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

func TestMain(m *testing.M) {
	proc.Main()
	os.Exit(m.Run())
}

// statLine builds a /proc/<pid>/stat line shaped like the kernel's: 52
// fields, with num_threads (20) and starttime (22) set.
func statLine(pidComm, state, ppidPgrpSid, threads, start string) string {
	return pidComm + " " + state + " " + ppidPgrpSid +
		" 0 -1 4194560 1523 0 0 0 12 3 0 0 20 0 " + threads + " 0 " + start +
		" 1234567 890 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
}

func TestParseStat(t *testing.T) {
	// A line as /proc printed it for `cat` (Linux 6.18), byte for byte.
	const real = "9018 (cat) R 9014 9014 8012 0 -1 4194304 98 0 0 0 0 0 0 0 20 0 1 0 122004 3133440 389 18446744073709551615 94617022398464 94617022418345 140730009947328 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 94617022434352 94617022435968 94617343635456 140730009954816 140730009954836 140730009954836 140730009956331 0\n"
	tests := []struct {
		name   string
		in     string
		want   fingerprint.Stat
		zombie bool
	}{
		{
			name: "real line",
			in:   real,
			want: fingerprint.Stat{PID: 9018, Comm: "cat", State: 'R', PPID: 9014, PGID: 9014, SID: 8012, Threads: 1, StartTicks: 122004},
		},
		{
			name: "comm with spaces",
			in:   statLine("77 (my prog)", "S", "1 77 77", "3", "500"),
			want: fingerprint.Stat{PID: 77, Comm: "my prog", State: 'S', PPID: 1, PGID: 77, SID: 77, Threads: 3, StartTicks: 500},
		},
		{
			name: "comm with close and open paren",
			in:   statLine("42 (a) (b)", "S", "1 42 40", "1", "600"),
			want: fingerprint.Stat{PID: 42, Comm: "a) (b", State: 'S', PPID: 1, PGID: 42, SID: 40, Threads: 1, StartTicks: 600},
		},
		{
			name: "comm is a lone close paren",
			in:   statLine("43 ())", "S", "1 43 43", "1", "601"),
			want: fingerprint.Stat{PID: 43, Comm: ")", State: 'S', PPID: 1, PGID: 43, SID: 43, Threads: 1, StartTicks: 601},
		},
		{
			name: "comm is a lone open paren",
			in:   statLine("44 (()", "S", "1 44 44", "1", "602"),
			want: fingerprint.Stat{PID: 44, Comm: "(", State: 'S', PPID: 1, PGID: 44, SID: 44, Threads: 1, StartTicks: 602},
		},
		{
			// A process can name itself (prctl PR_SET_NAME, 15 bytes) so
			// that its comm looks like the fields that follow it.
			name: "comm spoofing the following fields",
			in:   statLine("45 (x) Z 1 1 1 0 0)", "S", "1 45 45", "1", "603"),
			want: fingerprint.Stat{PID: 45, Comm: "x) Z 1 1 1 0 0", State: 'S', PPID: 1, PGID: 45, SID: 45, Threads: 1, StartTicks: 603},
		},
		{
			name: "empty comm",
			in:   statLine("46 ()", "S", "1 46 46", "1", "604"),
			want: fingerprint.Stat{PID: 46, State: 'S', PPID: 1, PGID: 46, SID: 46, Threads: 1, StartTicks: 604},
		},
		{
			name: "comm with newline",
			in:   statLine("47 (a\nb)", "S", "1 47 47", "1", "605"),
			want: fingerprint.Stat{PID: 47, Comm: "a\nb", State: 'S', PPID: 1, PGID: 47, SID: 47, Threads: 1, StartTicks: 605},
		},
		{
			name:   "zombie",
			in:     statLine("48 (sleep)", "Z", "9014 9014 8012", "1", "606"),
			want:   fingerprint.Stat{PID: 48, Comm: "sleep", State: 'Z', PPID: 9014, PGID: 9014, SID: 8012, Threads: 1, StartTicks: 606},
			zombie: true,
		},
		{
			name:   "dead (X)",
			in:     statLine("49 (sleep)", "X", "9014 9014 8012", "1", "607"),
			want:   fingerprint.Stat{PID: 49, Comm: "sleep", State: 'X', PPID: 9014, PGID: 9014, SID: 8012, Threads: 1, StartTicks: 607},
			zombie: true,
		},
		{
			// The main thread exited; the process runs on in 3 threads.
			name: "zombie leader of a live process",
			in:   statLine("50 (worker)", "Z", "1 50 50", "3", "608"),
			want: fingerprint.Stat{PID: 50, Comm: "worker", State: 'Z', PPID: 1, PGID: 50, SID: 50, Threads: 3, StartTicks: 608},
		},
		{
			name: "stopped, kernel thread with pgid 0, no trailing newline",
			in:   "2 (kthreadd) T 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 0",
			want: fingerprint.Stat{PID: 2, Comm: "kthreadd", State: 'T', Threads: 1},
		},
		{
			name: "large start time",
			in:   statLine("51 (a)", "S", "1 51 51", "1", "18446744073709551615"),
			want: fingerprint.Stat{PID: 51, Comm: "a", State: 'S', PPID: 1, PGID: 51, SID: 51, Threads: 1, StartTicks: 1<<64 - 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := fingerprint.ParseStat([]byte(tt.in))
			if err != nil {
				t.Fatalf("ParseStat: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseStat:\n got %+v\nwant %+v", got, tt.want)
			}
			if got.Zombie() != tt.zombie {
				t.Errorf("Zombie() = %v, want %v", got.Zombie(), tt.zombie)
			}
		})
	}
}

func TestParseStatMalformed(t *testing.T) {
	tests := []struct {
		name string
		in   string
	}{
		{"empty", ""},
		{"whitespace", " \n"},
		{"no parens", "123 cat R 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5"},
		{"no close paren", "123 (cat R 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5"},
		{"close paren before open", "123 )cat( R 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5"},
		{"no pid", statLine("(cat)", "R", "1 1 1", "1", "5")},
		{"blank pid", statLine(" (cat)", "R", "1 1 1", "1", "5")},
		{"pid not a number", statLine("abc (cat)", "R", "1 1 1", "1", "5")},
		{"negative pid", statLine("-5 (cat)", "R", "1 1 1", "1", "5")},
		{"signed pid", statLine("+5 (cat)", "R", "1 1 1", "1", "5")},
		{"zero pid", statLine("0 (cat)", "R", "1 1 1", "1", "5")},
		{"pid overflows", statLine("99999999999999999999 (cat)", "R", "1 1 1", "1", "5")},
		{"nothing after comm", "123 (cat)"},
		{"truncated", "123 (cat) S 1 123 123 0 -1"},
		{"19 fields after comm", "123 (cat) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0"},
		{"two-letter state", statLine("123 (cat)", "RR", "1 1 1", "1", "5")},
		{"ppid not a number", statLine("123 (cat)", "R", "x 1 1", "1", "5")},
		{"pgrp not a number", statLine("123 (cat)", "R", "1 x 1", "1", "5")},
		{"session not a number", statLine("123 (cat)", "R", "1 1 x", "1", "5")},
		{"threads not a number", statLine("123 (cat)", "R", "1 1 1", "x", "5")},
		{"negative start time", statLine("123 (cat)", "R", "1 1 1", "1", "-5")},
		{"start time not a number", statLine("123 (cat)", "R", "1 1 1", "1", "5s")},
		{"start time overflows", statLine("123 (cat)", "R", "1 1 1", "1", "18446744073709551616")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := fingerprint.ParseStat([]byte(tt.in))
			if !errors.Is(err, fingerprint.ErrMalformed) {
				t.Fatalf("ParseStat(%q) = %+v, %v; want ErrMalformed", tt.in, got, err)
			}
		})
	}
}

func TestZombie(t *testing.T) {
	tests := []struct {
		st   fingerprint.Stat
		want bool
	}{
		{fingerprint.Stat{State: 'R', Threads: 1}, false},
		{fingerprint.Stat{State: 'S', Threads: 1}, false},
		{fingerprint.Stat{State: 'D', Threads: 1}, false},
		{fingerprint.Stat{State: 'T', Threads: 1}, false},
		{fingerprint.Stat{State: 'Z', Threads: 1}, true},
		{fingerprint.Stat{State: 'X', Threads: 1}, true},
		{fingerprint.Stat{State: 'x', Threads: 1}, true},
		{fingerprint.Stat{State: 'Z'}, true}, // built by hand: no thread count
		{fingerprint.Stat{State: 'Z', Threads: 2}, false},
	}
	for _, tt := range tests {
		if got := tt.st.Zombie(); got != tt.want {
			t.Errorf("%+v.Zombie() = %v, want %v", tt.st, got, tt.want)
		}
	}
}

func TestSame(t *testing.T) {
	a := fingerprint.Stat{PID: 10, StartTicks: 100, Comm: "a", State: 'S'}
	tests := []struct {
		name string
		b    fingerprint.Stat
		want bool
	}{
		{"identical", a, true},
		{"other fields differ", fingerprint.Stat{PID: 10, StartTicks: 100, Comm: "b", State: 'Z', PGID: 3}, true},
		{"pid recycled", fingerprint.Stat{PID: 10, StartTicks: 101}, false},
		{"other pid", fingerprint.Stat{PID: 11, StartTicks: 100}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := fingerprint.Same(a, tt.b); got != tt.want {
				t.Errorf("Same = %v, want %v", got, tt.want)
			}
			if got := fingerprint.Same(tt.b, a); got != tt.want {
				t.Errorf("Same (swapped) = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestSplitArgv(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{"empty (kernel thread, zombie)", "", nil},
		{"only NULs", "\x00\x00", nil},
		{"one", "sleep\x00", []string{"sleep"}},
		{"several", "sleep\x001000\x00", []string{"sleep", "1000"}},
		{"element with space", "sh\x00-c\x00trap '' TERM\x00", []string{"sh", "-c", "trap '' TERM"}},
		{"empty element inside", "a\x00\x00b\x00", []string{"a", "", "b"}},
		{"rewritten without NUL", "my prog --flag", []string{"my prog --flag"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := fingerprint.SplitArgv([]byte(tt.in)); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("SplitArgv(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

// TestParseStatus: the Tgid and the real, effective and saved UIDs come
// from status, and a Uid line short of them is malformed, not read as
// root's.
func TestParseStatus(t *testing.T) {
	tests := []struct {
		name    string
		status  string
		tgid    int
		uids    [3]int
		wantErr bool
	}{
		{"a process", "Name:\tsleep\nTgid:\t42\nPid:\t42\nUid:\t1000\t1000\t1000\t1000\n", 42, [3]int{1000, 1000, 1000}, false},
		{"a setuid program", "Tgid:\t42\nUid:\t1000\t0\t0\t0\n", 42, [3]int{1000, 0, 0}, false},
		{"a thread", "Tgid:\t41\nPid:\t42\nUid:\t0\t0\t0\t0\n", 41, [3]int{0, 0, 0}, false},
		{"no Uid line", "Tgid:\t42\n", 0, [3]int{}, true},
		{"no Tgid line", "Uid:\t0\t0\t0\t0\n", 0, [3]int{}, true},
		{"a Uid line of one field", "Tgid:\t42\nUid:\t1000\n", 0, [3]int{}, true},
		{"a Uid that is no number", "Tgid:\t42\nUid:\t10x0\t0\t0\t0\n", 0, [3]int{}, true},
		{"a negative Uid", "Tgid:\t42\nUid:\t-1\t0\t0\t0\n", 0, [3]int{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tgid, uids, err := fingerprint.ParseStatus([]byte(tt.status))
			if (err != nil) != tt.wantErr || (err != nil && !errors.Is(err, fingerprint.ErrMalformed)) {
				t.Fatalf("err = %v, want error %v (ErrMalformed)", err, tt.wantErr)
			}
			if !tt.wantErr && (tgid != tt.tgid || uids != tt.uids) {
				t.Errorf("ParseStatus = %d, %v; want %d, %v", tgid, uids, tt.tgid, tt.uids)
			}
		})
	}
}

// TestReadRunsAs: a setuid program keeps its caller's real UID; its
// identity says it runs as another all the same.
func TestReadRunsAs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the processes run as uid 65534")
	}
	tests := []struct {
		name   string
		argv   []string
		runsAs bool
		uids   [3]int
	}{
		{"uid 65534's process", []string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sleep", "1000"}, true, [3]int{65534, 65534, 65534}},
		{"uid 65534's setuid program", []string{"setpriv", "--ruid=65534", "--euid=0", "--init-groups", "sleep", "1000"}, false, [3]int{65534, 0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(tt.argv[0], tt.argv[1:]...)
			proc.Start(t, cmd)
			var id fingerprint.Identity
			proc.WaitFor(t, 5*time.Second, "sleep", func() bool {
				var err error
				id, err = fingerprint.Read("/proc", cmd.Process.Pid)
				return err == nil && id.Comm == "sleep"
			})
			// A read can straddle the exec (status read by setpriv before
			// it switched, stat by sleep): read again, all after it.
			id, err := fingerprint.Read("/proc", cmd.Process.Pid)
			if err != nil {
				t.Fatal(err)
			}
			if got := [3]int{id.UID, id.EUID, id.SUID}; got != tt.uids || id.RunsAs(65534) != tt.runsAs {
				t.Errorf("uids %v, RunsAs(65534) %v; want %v, %v", got, id.RunsAs(65534), tt.uids, tt.runsAs)
			}
			ids, err := fingerprint.ReadUIDs("/proc", cmd.Process.Pid)
			if err != nil || ids != tt.uids {
				t.Errorf("ReadUIDs = %v, %v; want %v", ids, err, tt.uids)
			}
		})
	}
}
