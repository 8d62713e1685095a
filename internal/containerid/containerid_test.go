package containerid

import (
	"reflect"
	"strings"
	"testing"
)

const id1 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
const id2 = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"

func TestValid(t *testing.T) {
	tests := []struct {
		in   string
		want bool
	}{
		{id1, true},
		{strings.ToUpper(id1), false},
		{id1[:63], false},
		{id1 + "0", false},
		{"../../" + id1[6:], false},
		{id1[:63] + "g", false},
		{"", false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if got := Valid(tt.in); got != tt.want {
				t.Errorf("Valid(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

func TestFromArgv(t *testing.T) {
	tests := []struct {
		name string
		argv []string
		want []string
	}{
		{"whole element", []string{"kcserver", id1}, []string{id1}},
		{"after equals", []string{"kcserver", "--container-id=" + id1}, []string{id1}},
		{"conmon style", []string{"conmon", "-c", id1, "-u", id1}, []string{id1}},
		{"two ids", []string{"x", id1, "--other=" + id2}, []string{id1, id2}},
		{"embedded in text", []string{"sh", "-c", "kcserver " + id1}, nil},
		{"prefix not after equals", []string{"x" + id1}, nil},
		{"short id", []string{id1[:12]}, nil},
		{"empty", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := FromArgv(tt.argv); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("FromArgv(%q) = %q, want %q", tt.argv, got, tt.want)
			}
		})
	}
}

func TestShort(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{id1, id1[:12]},
		{"abc", "abc"},
		{"", ""},
	} {
		if got := Short(tt.in); got != tt.want {
			t.Errorf("Short(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
