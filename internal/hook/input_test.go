package hook

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

const cid = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestReadState(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr bool
	}{
		{"poststop", `{"ociVersion":"1.0.2","id":"` + cid + `","status":"stopped","bundle":"/b"}`, false},
		{"createRuntime with pid", `{"ociVersion":"1.0.2","id":"` + cid + `","status":"created","pid":42,"bundle":"/b","annotations":{"a":"b"}}`, false},
		{"unknown fields tolerated", `{"id":"` + cid + `","future":{"x":1}}`, false},
		{"empty", ``, true},
		{"whitespace", " \n\t", true},
		{"not json", `hello`, true},
		{"json array", `[1,2]`, true},
		{"no id", `{"status":"stopped"}`, true},
		{"short id", `{"id":"0123456789ab"}`, true},
		{"upper case id", `{"id":"` + strings.ToUpper(cid) + `"}`, true},
		{"path traversal id", `{"id":"../../../../etc/passwd"}`, true},
		{"traversal padded to 64", `{"id":"../` + cid[3:] + `"}`, true},
		{"negative pid", `{"id":"` + cid + `","pid":-5}`, true},
		{"pid wrong type", `{"id":"` + cid + `","pid":"5"}`, true},
		{"trailing garbage", `{"id":"` + cid + `"} {"id":"x"}`, true},
		{"truncated", `{"id":"` + cid, true},
		{"nul bytes", "\x00\x00\x00", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, err := ReadState(strings.NewReader(tt.in))
			if tt.wantErr {
				if err == nil {
					t.Fatalf("ReadState accepted %q: %+v", tt.in, st)
				}
				if !errors.Is(err, ErrBadInput) {
					t.Errorf("error %v does not wrap ErrBadInput", err)
				}
				if strings.Contains(err.Error(), "\n") {
					t.Errorf("error is not one line: %q", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ReadState: %v", err)
			}
			if st.ID != cid {
				t.Errorf("id = %q", st.ID)
			}
		})
	}
}

func TestReadStateTooLarge(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 10<<20)
	_, err := ReadState(bytes.NewReader(big))
	if !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("err = %v, want a size error", err)
	}
}

func TestParseStage(t *testing.T) {
	tests := []struct {
		in      string
		want    Stage
		wantErr bool
	}{
		{"prestart", StageCreateRuntime, false},
		{"createRuntime", StageCreateRuntime, false},
		{"createContainer", StageCreateContainer, false},
		{"startContainer", StageStartContainer, false},
		{"poststart", StagePoststart, false},
		{"poststop", StagePoststop, false},
		{"PostStop", "", true},
		{"", "", true},
		{"../x", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseStage(tt.in)
			if (err != nil) != tt.wantErr || got != tt.want || (err != nil && !errors.Is(err, ErrUnknownStage)) {
				t.Errorf("ParseStage(%q) = %q, %v", tt.in, got, err)
			}
		})
	}
}

// FuzzReadState checks that no input crashes the stdin path and that every
// accepted state names a valid container ID (the hook's only file name).
func FuzzReadState(f *testing.F) {
	f.Add([]byte(`{"ociVersion":"1.0.2","id":"` + cid + `","status":"stopped","bundle":"/b"}`))
	f.Add([]byte(`{"id":"` + cid + `","pid":1,"annotations":{"io.kc-watchman.supervisor":"x"}}`))
	f.Add([]byte(`{"id":"../../etc"}`))
	f.Add([]byte(`[]`))
	f.Add([]byte{0xff, 0xfe, 0x00})
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := ReadState(bytes.NewReader(data))
		if err != nil {
			if !errors.Is(err, ErrBadInput) {
				t.Fatalf("error does not wrap ErrBadInput: %v", err)
			}
			return
		}
		if len(st.ID) != 64 || strings.ContainsAny(st.ID, "/.\x00") || st.Pid < 0 {
			t.Fatalf("accepted unusable state %+v", st)
		}
	})
}
