package engine

import (
	"bufio"
	"fmt"
	"io"
	"strings"
	"testing"
)

func TestMessages(t *testing.T) {
	big := strings.Repeat("x", 100)
	for _, tc := range []struct {
		name, in string
		want     []string
		tooLarge int
	}{
		{"lines", "a\nb\n", []string{"a", "b"}, 0},
		{"blank lines and no final newline", "\n\na\r\n  \nb", []string{"a", "b"}, 0},
		{"exactly the cap", big[:64] + "\n" + "c\n", []string{big[:64], "c"}, 0},
		{"over the cap, then the next", big[:65] + "\n" + "c\n", []string{"c"}, 1},
		{"over the cap at the end", "c\n" + big, []string{"c"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := 0
			m := NewMessages(strings.NewReader(tc.in), 64, func(reason string, size int64) {
				if reason == SkipTooLarge {
					n++
				}
			})
			m.r = bufio.NewReaderSize(strings.NewReader(tc.in), 16) // messages span several buffer fills
			var got []string
			for {
				msg, err := m.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, string(msg))
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) || n != tc.tooLarge {
				t.Errorf("got %q and %d too large, want %q and %d", got, n, tc.want, tc.tooLarge)
			}
		})
	}
}
