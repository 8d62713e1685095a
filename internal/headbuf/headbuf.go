// Package headbuf keeps the start of output kc-watchman does not control:
// a podman CLI's answer and errors, a program that claims to be kc-hook.
package headbuf

// Buffer keeps the first Max bytes written to it and drops the rest. It
// never fails a write, so a child writing without end is neither blocked
// nor told to stop early; it costs at most Max bytes.
type Buffer struct {
	Max     int
	buf     []byte
	dropped bool
}

func (b *Buffer) Write(p []byte) (int, error) {
	room := b.Max - len(b.buf)
	if room < len(p) {
		b.dropped = true
	}
	if room > 0 {
		b.buf = append(b.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

// Bytes is what was kept: the first Max bytes written, or all of them.
func (b *Buffer) Bytes() []byte { return b.buf }

// Dropped reports whether more than Max bytes were written, so Bytes is
// not the whole output.
func (b *Buffer) Dropped() bool { return b.dropped }
