package action

import (
	"slices"
	"testing"
)

func TestIsSkip(t *testing.T) {
	tests := []struct {
		a    Action
		skip bool
	}{
		{WouldReap, false},
		{Reaped, false},
		{Gone, false},
		{WouldNotDie, false},
		{Nothing, false},
		{"", false},
		{SkipLive, true},
		{SkipYoung, true},
		{SkipAgeUnknown, true},
		{SkipForeign, true},
		{SkipOtherUID, true},
		{SkipAmbiguous, true},
		{SkipContradicted, true},
		// A reason a later version may write into the ledger.
		{"skipped-not-yet-invented", true},
		{"skipped", false},
	}
	for _, tt := range tests {
		t.Run(string(tt.a), func(t *testing.T) {
			if got := tt.a.IsSkip(); got != tt.skip {
				t.Errorf("IsSkip(%q) = %v, want %v", tt.a, got, tt.skip)
			}
		})
	}
}

// TestStrings pins the outside contract (DESIGN "The outside"): reconcile's JSON,
// the ledger and the metrics print these byte for byte.
func TestStrings(t *testing.T) {
	want := map[Action]string{
		WouldReap: "would-reap", Reaped: "reaped", Gone: "gone", WouldNotDie: "would-not-die",
		SkipLive: "skipped-live", SkipYoung: "skipped-young", SkipAgeUnknown: "skipped-age-unknown",
		SkipForeign: "skipped-foreign", SkipOtherUID: "skipped-other-uid", SkipAmbiguous: "skipped-ambiguous",
		SkipContradicted: "skipped-contradicted", Nothing: "nothing",
	}
	for a, s := range want {
		if string(a) != s {
			t.Errorf("%q printed as %q", s, string(a))
		}
	}
}

// TestSkips: the list reports count from holds every reason once.
func TestSkips(t *testing.T) {
	want := []Action{SkipLive, SkipYoung, SkipAgeUnknown, SkipForeign, SkipOtherUID, SkipAmbiguous, SkipContradicted}
	if !slices.Equal(Skips, want) {
		t.Errorf("Skips = %q, want %q", Skips, want)
	}
	for _, a := range Skips {
		if !a.IsSkip() {
			t.Errorf("%q in Skips is no skip", a)
		}
	}
}
