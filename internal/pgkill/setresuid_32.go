//go:build linux && (386 || arm)

package pgkill

import "golang.org/x/sys/unix"

// sysSetresuid is the 32-bit-UID setresuid: on these architectures
// SYS_SETRESUID takes 16-bit UIDs.
const sysSetresuid = unix.SYS_SETRESUID32
