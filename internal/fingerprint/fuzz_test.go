package fingerprint_test

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// FuzzParseStat checks the allocation-free ParseStat against refParseStat,
// the same rules written the plain way: value, or ErrMalformed.
func FuzzParseStat(f *testing.F) {
	self, _ := os.ReadFile("/proc/self/stat")
	for _, s := range []string{
		string(self),
		"1 (systemd) S 0 1 1 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 5 1000 100 18446744073709551615\n",
		"100 (a) (b)) Z 1 100 100 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 3 0 90000 1000 100\n",
		"100 (kc server) S +1 100 100 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 90000\n",
		"100 (x) S 1 100 100 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99999999999999999999\n",
		"100 (x) S 1 100 100 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 18446744073709551615\n",
		"100 (x) S 9223372036854775808 100 100 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 1\n",
		"100 (x) S 1 100 100 0 -1 0 0 0 0 0 0 0 0 0 20 0 1\n",
		"100 (x) SS 1 100 100 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 1\n",
		"100 (x)\u00a0S 1 100 100 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 1\n",
		" 0100 (x)\tS\v1 100 100 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 1",
		"-1 (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 1\n",
		"(x) S 1 1 1",
		"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		want, werr := refParseStat(data)
		got, gerr := fingerprint.ParseStat(data)
		if (werr == nil) != (gerr == nil) || (gerr != nil && !errors.Is(gerr, fingerprint.ErrMalformed)) || (werr == nil && got != want) {
			t.Fatalf("ParseStat(%q) = %+v, %v; reference: %+v, %v", data, got, gerr, want, werr)
		}
	})
}

// refParseStat is ParseStat's rules with bytes.FieldsFunc and strconv:
// fields apart by ASCII white space, a positive PID of ten digits at
// most, a one-letter state, and unsigned decimal numbers that fit their
// type.
func refParseStat(data []byte) (fingerprint.Stat, error) {
	var s fingerprint.Stat
	bad := errors.New("malformed")
	space := func(r rune) bool { return r < 0x80 && bytes.ContainsRune([]byte(" \t\n\v\f\r"), r) }
	open, end := bytes.IndexByte(data, '('), bytes.LastIndexByte(data, ')')
	if open < 1 || end < open {
		return s, bad
	}
	head := bytes.TrimFunc(data[:open], space)
	pid, err := strconv.ParseUint(string(head), 10, 64)
	if err != nil || len(head) > 10 || pid == 0 {
		return s, bad
	}
	s.PID, s.Comm = int(pid), string(data[open+1:end])
	fields := bytes.FieldsFunc(data[end+1:], space)
	if len(fields) < 20 || len(fields[0]) != 1 {
		return s, bad
	}
	s.State = fields[0][0]
	for dst, at := range map[*int]int{&s.PPID: 1, &s.PGID: 2, &s.SID: 3, &s.Threads: 17} {
		v, err := strconv.ParseUint(string(fields[at]), 10, 63)
		if err != nil {
			return s, bad
		}
		*dst = int(v)
	}
	if s.StartTicks, err = strconv.ParseUint(string(fields[19]), 10, 64); err != nil {
		return s, bad
	}
	return s, nil
}
