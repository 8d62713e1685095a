package printable

import "testing"

func TestQuote(t *testing.T) {
	for _, tc := range []struct {
		name, in, quote, word string
	}{
		{"plain", "kcserver", "kcserver", "kcserver"},
		{"path", "/tmp/kc-1.sock", "/tmp/kc-1.sock", "/tmp/kc-1.sock"},
		{"unicode", "/tmp/kc-ü.sock", "/tmp/kc-ü.sock", "/tmp/kc-ü.sock"},
		{"space", "a b", "a b", `"a b"`},
		{"empty", "", "", ""},
		{"newline forges a line", "x\nCONTAINER", `"x\nCONTAINER"`, `"x\nCONTAINER"`},
		{"tab shifts a column", "x\ty", `"x\ty"`, `"x\ty"`},
		{"terminal escape", "kc-\x1b[2J.sock", `"kc-\x1b[2J.sock"`, `"kc-\x1b[2J.sock"`},
		{"carriage return", "ok\rFAILED", `"ok\rFAILED"`, `"ok\rFAILED"`},
		{"invalid UTF-8", "kc-\xff.sock", `"kc-\xff.sock"`, `"kc-\xff.sock"`},
		{"right-to-left override", "kc-\u202egpj.sock", `"kc-\u202egpj.sock"`, `"kc-\u202egpj.sock"`},
		{"C1 control", "a\u009bb", `"a\u009bb"`, `"a\u009bb"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Quote(tc.in); got != tc.quote {
				t.Errorf("Quote(%q) = %s, want %s", tc.in, got, tc.quote)
			}
			if got := Word(tc.in); got != tc.word {
				t.Errorf("Word(%q) = %s, want %s", tc.in, got, tc.word)
			}
		})
	}
}
