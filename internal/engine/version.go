package engine

import (
	"context"
	"errors"
)

// Versioner is an engine that can say which version answers: doctor shows
// it next to the engine's check. It is a question apart from Live, so an
// engine whose version cannot be read is still ground truth.
type Versioner interface {
	Version(ctx context.Context) (string, error)
}

// ErrNoVersion is VersionOf's answer for an engine that cannot say.
var ErrNoVersion = errors.New("this engine does not report its version")

// VersionOf asks e its version, bounded by the engine's timeout.
func VersionOf(ctx context.Context, e Engine) (string, error) {
	v, ok := e.(Versioner)
	if !ok {
		return "", ErrNoVersion
	}
	return v.Version(ctx)
}
