package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
)

// traced is what one run of a real binary did to the file system, counted
// by strace -f: files opened, and complete listings of /proc (a
// getdents64(2) on it that reached the end). Issue 26's target is under
// 1,000 opens for a reconcile at 10k processes, with one listing at most.
type traced struct {
	Opens    int `json:"opens"`
	Listings int `json:"proc_listings"`
}

var (
	straceOpen    = regexp.MustCompile(`^\d+ +openat\(`)
	straceDentsAt = regexp.MustCompile(`^(\d+) +getdents64\(\d+</proc>,`)
	straceResumed = regexp.MustCompile(`^(\d+) +<\.\.\. getdents64 resumed>`)
	straceEnd     = regexp.MustCompile(`\) += 0$`)
)

// haveStrace says whether the runs can be counted.
func haveStrace() bool {
	_, err := exec.LookPath("strace")
	return err == nil
}

// traceRun runs argv under strace -f (children included: the podman
// stand-in's shell is counted with the janitor) and counts its opens and
// /proc listings. stdin is a file to read, or "". keepAs, when not
// empty, is where the trace is written and left.
func traceRun(argv, env []string, dir, stdin, keepAs string) (traced, error) {
	var out *os.File
	var err error
	if keepAs != "" {
		out, err = os.Create(keepAs)
	} else {
		out, err = os.CreateTemp("", "kcbench-strace-")
	}
	if err != nil {
		return traced{}, err
	}
	out.Close()
	if keepAs == "" {
		defer os.Remove(out.Name())
	}
	cmd := exec.Command("strace", append([]string{"-f", "-y", "-qq", "-e", "trace=openat,getdents64", "-o", out.Name()}, argv...)...)
	cmd.Env, cmd.Dir = env, dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if stdin != "" {
		in, err := os.Open(stdin)
		if err != nil {
			return traced{}, err
		}
		defer in.Close()
		cmd.Stdin = in
	}
	if b, err := cmd.CombinedOutput(); err != nil {
		return traced{}, fmt.Errorf("strace %s: %v: %.300s", argv[0], err, b)
	}
	return countTrace(out.Name())
}

// countTrace reads strace -f -y -qq output. A call another thread
// interrupted is written in two lines (unfinished, then resumed), its
// result on the second.
func countTrace(path string) (traced, error) {
	f, err := os.Open(path)
	if err != nil {
		return traced{}, err
	}
	defer f.Close()
	var c traced
	unfinished := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if straceOpen.MatchString(line) {
			c.Opens++
			continue
		}
		if m := straceDentsAt.FindStringSubmatch(line); m != nil {
			if strings.HasSuffix(line, "<unfinished ...>") {
				unfinished[m[1]] = true
			} else if straceEnd.MatchString(line) {
				c.Listings++
			}
			continue
		}
		if m := straceResumed.FindStringSubmatch(line); m != nil && unfinished[m[1]] {
			delete(unfinished, m[1])
			if straceEnd.MatchString(line) {
				c.Listings++
			}
		}
	}
	return c, sc.Err()
}
