package main

import (
	"encoding/binary"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// opCosts are the costs of the operations a /proc scan is made of, on this
// machine, so that the results can be carried over to others: a system
// call that does nothing, getpgid(2), reading /proc/<pid>/stat (openat,
// read, close), and one /proc directory entry (getdents64).
type opCosts struct {
	Syscall   time.Duration `json:"syscall_ns"`
	Getpgid   time.Duration `json:"getpgid_ns"`
	StatRead  time.Duration `json:"stat_read_ns"`
	DirEntry  time.Duration `json:"dir_entry_ns"`
	GoStartup time.Duration `json:"go_startup_ns"`
}

func measureOpCosts(hookBin string) opCosts {
	var c opCosts
	const n = 20000
	best := func(f func() time.Duration) time.Duration {
		m := f()
		for range 4 {
			m = min(m, f())
		}
		return m
	}
	c.Syscall = best(func() time.Duration {
		t := time.Now()
		for range n {
			unix.RawSyscall(unix.SYS_GETPID, 0, 0, 0)
		}
		return time.Since(t) / n
	})
	self := uintptr(os.Getpid())
	c.Getpgid = best(func() time.Duration {
		t := time.Now()
		for range n {
			unix.RawSyscall(unix.SYS_GETPGID, self, 0, 0)
		}
		return time.Since(t) / n
	})
	path := "/proc/" + strconv.Itoa(os.Getpid()) + "/stat"
	buf := make([]byte, 4096)
	c.StatRead = best(func() time.Duration {
		t := time.Now()
		for range n / 10 {
			fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return 0
			}
			unix.Read(fd, buf)
			unix.Close(fd)
		}
		return time.Since(t) / (n / 10)
	})
	c.DirEntry = best(func() time.Duration {
		t := time.Now()
		entries := 0
		fd, err := unix.Open("/proc", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return 0
		}
		defer unix.Close(fd)
		dbuf := make([]byte, 64<<10)
		for {
			m, err := unix.Getdents(fd, dbuf)
			if err != nil || m <= 0 {
				break
			}
			for off := 0; off+19 < m; {
				rl := int(binary.NativeEndian.Uint16(dbuf[off+16:]))
				if rl <= 0 {
					break
				}
				entries++
				off += rl
			}
		}
		if entries == 0 {
			return 0
		}
		return time.Since(t) / time.Duration(entries)
	})
	c.GoStartup = best(func() time.Duration {
		r, err := runBinary([]string{hookBin, "--version"}, nil, "", nil)
		if err != nil {
			return 0
		}
		return r.Wall
	})
	return c
}
