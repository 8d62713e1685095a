package sweep

import (
	"errors"
	"io/fs"

	"github.com/kc-watchman/kc-watchman/internal/sockets"
)

// Kind tells a control socket from a per-session socket. It is the kind
// sockets.ParseName reads from a name; the alias lets callers of the sweep
// say sweep.KindControl without importing the name parser.
type Kind = sockets.Kind

// Socket kinds.
const (
	KindControl = sockets.KindControl // kc-<pid>.sock
	KindSession = sockets.KindSession // kc-<pid>.<x>.sock, or the hashed kc-<hex>.sock
)

func isNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }
