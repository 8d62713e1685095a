package cull

import (
	"strings"
	"testing"
)

// TestSmallWords: counts agree with their nouns, a whole day is "1d", a
// hashed socket's missing PID is not "pid 0".
func TestSmallWords(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{plural(1, "supervisor"), "1 supervisor"},
		{plural(0, "session"), "0 sessions"},
		{plural(2, "session"), "2 sessions"},
		{HumanSeconds(86400), "1d"},
		{HumanSeconds(90000), "1d1h"},
		{HumanSeconds(3600), "1h"},
		{HumanSeconds(5400), "1h30m"},
		{HumanSeconds(120), "2m"},
		{HumanSeconds(61), "1m1s"},
		{HumanSeconds(59), "59s"},
		{ExactSeconds(86400), "1d"},
		{ExactSeconds(131400), "1d12h30m"},
		{ExactSeconds(131401), "1d12h30m1s"},
		{ExactSeconds(0), "0s"},
		{pidText(0), "unknown"},
		{pidText(42), "42"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	var b strings.Builder
	if err := WriteText(&b, 86400, nil); err != nil {
		t.Fatal(err)
	}
	if want := "0 supervisors; 0 sessions idle and disconnected for more than 1d,"; !strings.Contains(b.String(), want) {
		t.Errorf("%q lacks %q", b.String(), want)
	}
}

// TestHumanBytes: binary units, one decimal, up to exbibytes.
func TestHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 200 << 20: "200.0 MiB", 3 << 30: "3.0 GiB", 7 << 60: "7.0 EiB"} {
		if got := HumanBytes(n); got != want {
			t.Errorf("HumanBytes(%d) = %s, want %s", n, got, want)
		}
	}
}
