package logkeys

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
)

func TestUnique(t *testing.T) {
	for _, tc := range []struct {
		name string
		log  func(l *slog.Logger)
		want map[string]any
	}{
		{"a With's key on the record", func(l *slog.Logger) {
			l.With("container", "a").Info("m", "container", "a", "pgid", 7)
		}, map[string]any{"container": "a", "pgid": 7.0}},
		{"a later With wins", func(l *slog.Logger) {
			l.With("step", "event").With("step", "pidfd").Info("m")
		}, map[string]any{"step": "pidfd"}},
		{"the record wins", func(l *slog.Logger) {
			l.With("step", "event").Info("m", "step", "sweep")
		}, map[string]any{"step": "sweep"}},
		{"twice on one record: the last", func(l *slog.Logger) {
			l.Info("m", "n", 1, "n", 2)
		}, map[string]any{"n": 2.0}},
		{"a group's keys are its own", func(l *slog.Logger) {
			l.With("id", "a").WithGroup("g").Info("m", "id", "b")
		}, map[string]any{"id": "a", "g": map[string]any{"id": "b"}}},
		{"distinct keys untouched", func(l *slog.Logger) {
			l.With("a", 1).Info("m", "b", 2)
		}, map[string]any{"a": 1.0, "b": 2.0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			tc.log(slog.New(Unique(slog.NewJSONHandler(&buf, &slog.HandlerOptions{
				ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
					if len(groups) == 0 && (a.Key == slog.TimeKey || a.Key == slog.LevelKey || a.Key == slog.MessageKey) {
						return slog.Attr{}
					}
					return a
				},
			}))))
			line := strings.TrimSpace(buf.String())
			var got map[string]any
			if err := json.Unmarshal([]byte(line), &got); err != nil {
				t.Fatalf("%v: %s", err, line)
			}
			for k, v := range tc.want {
				if n := strings.Count(line, `"`+k+`":`); n != 1 && k != "id" {
					t.Errorf("key %q written %d times: %s", k, n, line)
				}
				if gb, _ := json.Marshal(got[k]); string(gb) != mustJSON(t, v) {
					t.Errorf("%s = %s, want %s (line %s)", k, gb, mustJSON(t, v), line)
				}
			}
			if len(got) != len(tc.want) {
				t.Errorf("line %s, want exactly %v", line, tc.want)
			}
		})
	}
}

func mustJSON(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
