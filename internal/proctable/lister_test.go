package proctable

import "testing"

func TestParseLister(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want Lister
		ok   bool
	}{
		{"auto", ListAuto, true}, {"on", ListBPF, true}, {"off", ListProc, true},
		{"", ListAuto, false}, {"bpf", ListAuto, false}, {"ON", ListAuto, false}, {"true", ListAuto, false},
	} {
		got, err := ParseLister(tt.in)
		if (err == nil) != tt.ok || (tt.ok && got != tt.want) {
			t.Errorf("ParseLister(%q) = %v, %v; want %v (ok %v)", tt.in, got, err, tt.want, tt.ok)
		}
		if tt.ok && got.String() != tt.in {
			t.Errorf("ParseLister(%q).String() = %q", tt.in, got.String())
		}
	}
}
