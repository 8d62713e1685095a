// Command rusage runs a program and writes its wall time, CPU time and
// peak RSS, as wait4(2) reports them, to a file as one JSON object:
//
//	rusage OUT PROGRAM [ARG…]
//
// kcbench runs the binaries it measures through it because ru_maxrss
// counts the memory of the process that started the child too: a child
// spawned by kcbench itself (clone(CLONE_VM|CLONE_VFORK), then execve)
// would report at least kcbench's own resident size, tens of megabytes
// with a large population. This program is small, so the peak it reports
// is the measured program's. stdin, stdout, stderr, the working directory
// and the environment are passed through; the exit status is in the JSON.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

type result struct {
	WallNS   int64 `json:"wall_ns"`
	UserNS   int64 `json:"user_ns"`
	SysNS    int64 `json:"sys_ns"`
	MaxRSSKB int64 `json:"maxrss_kb"`
	Exit     int   `json:"exit"`
	Signal   int   `json:"signal"`
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: rusage OUT PROGRAM [ARG...]")
		os.Exit(2)
	}
	out, argv := os.Args[1], os.Args[2:]
	path, err := exec.LookPath(argv[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, "rusage:", err)
		os.Exit(2)
	}
	start := time.Now()
	pid, err := syscall.ForkExec(path, argv, &syscall.ProcAttr{
		Env:   os.Environ(),
		Files: []uintptr{0, 1, 2},
		Sys:   &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "rusage:", err)
		os.Exit(2)
	}
	var ws syscall.WaitStatus
	var ru syscall.Rusage
	for {
		_, err = syscall.Wait4(pid, &ws, 0, &ru)
		if err != syscall.EINTR {
			break
		}
	}
	wall := time.Since(start)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rusage: wait4:", err)
		os.Exit(2)
	}
	r := result{WallNS: int64(wall), UserNS: ru.Utime.Nano(), SysNS: ru.Stime.Nano(), MaxRSSKB: ru.Maxrss, Exit: ws.ExitStatus()}
	if ws.Signaled() {
		r.Exit, r.Signal = -1, int(ws.Signal())
	}
	data, _ := json.Marshal(r)
	if err := os.WriteFile(out, append(data, '\n'), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "rusage:", err)
		os.Exit(2)
	}
}
