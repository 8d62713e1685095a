package systemd

import (
	"context"

	"github.com/kc-watchman/kc-watchman/internal/contain"
)

// Scoper is contain.Options.Systemd: a connection to the system manager
// for one supervised tree's scope. Containment is root's only (a rootless
// hook gets the subreaper alone), so the system bus is the one asked.
func Scoper(ctx context.Context) (contain.Scoper, error) {
	m, err := Dial(ctx, "")
	if err != nil {
		return nil, err // never a typed nil inside the interface
	}
	return m, nil
}
