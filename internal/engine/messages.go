package engine

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
)

// MaxEventMessage bounds one event message read into memory. A death
// event is a few hundred bytes; an engine's labels can make it a few KiB.
// Anyone able to start a container chooses its labels, so an engine's
// stream cannot be trusted to keep its messages small.
const MaxEventMessage = 1 << 20

// Skip reasons DeathWatch.Skipped reports.
const (
	SkipTooLarge  = "too_large"
	SkipMalformed = "malformed"
)

// Messages reads the newline-delimited JSON messages of an event stream
// (dockerd's and libpod's encoders end each with "\n"; so does `podman
// events --format json`). A message longer than max is passed over up to
// the next newline without being held, and reported: the stream goes on.
// Dropping the stream instead would bring the same message back on every
// re-subscription that replays since the last event.
type Messages struct {
	r    *bufio.Reader
	max  int
	buf  []byte
	skip func(reason string, size int64)
	// end is the reader's error, kept to return after the last message.
	end error
}

func NewMessages(r io.Reader, max int, skip func(reason string, size int64)) *Messages {
	if skip == nil {
		skip = func(string, int64) {}
	}
	return &Messages{r: bufio.NewReaderSize(r, 64<<10), max: max, skip: skip}
}

// Next returns the next message that is not empty and fits, or the
// reader's error (io.EOF at a clean end). The slice is valid until the
// next call.
func (m *Messages) Next() ([]byte, error) {
	for m.end == nil {
		m.buf = m.buf[:0]
		var size int64
		over := false
		for {
			chunk, err := m.r.ReadSlice('\n')
			size += int64(len(chunk))
			if !over {
				if len(m.buf)+len(chunk) > m.max+1 { // +1: the newline is not the message's
					over = true
					m.buf = m.buf[:0]
				} else {
					m.buf = append(m.buf, chunk...)
				}
			}
			if errors.Is(err, bufio.ErrBufferFull) {
				continue
			}
			if err != nil {
				// The last message may lack its newline: it is read (and
				// passed over if cut short).
				m.end = err
			}
			break
		}
		if over {
			m.skip(SkipTooLarge, size)
			continue
		}
		if msg := bytes.TrimSpace(m.buf); len(msg) > 0 {
			return msg, nil
		}
	}
	return nil, m.end
}

// Decode reads the next message into v. A message that is not JSON of
// v's shape is reported and passed over like an oversized one.
func (m *Messages) Decode(v any) error {
	for {
		msg, err := m.Next()
		if err != nil {
			return err
		}
		reflect.ValueOf(v).Elem().SetZero() // nothing left from a malformed one
		if err := json.Unmarshal(msg, v); err != nil {
			m.skip(SkipMalformed, int64(len(msg)))
			continue
		}
		return nil
	}
}

// APIMessage is the operator-facing text of an engine API error answer:
// its JSON "message" when there is one, else the body, cut at 200 bytes.
func APIMessage(body []byte) string {
	var m struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &m) == nil && m.Message != "" {
		return m.Message
	}
	s := strings.TrimSpace(string(body))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
