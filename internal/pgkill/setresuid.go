//go:build linux && !(386 || arm)

package pgkill

import "golang.org/x/sys/unix"

const sysSetresuid = unix.SYS_SETRESUID
