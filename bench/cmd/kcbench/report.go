package main

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/trees"
)

// report prints the results as Markdown.
func (b *bench) report(w io.Writer) {
	r := &b.res
	fmt.Fprintf(w, "\n## kcbench results\n\nCommand: `%s`\n\n", r.Command)
	if len(r.Machine) > 0 {
		fmt.Fprintln(w, "| machine | |\n|---|---|")
		keys := make([]string, 0, len(r.Machine))
		for k := range r.Machine {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "| %s | %s |\n", k, r.Machine[k])
		}
		fmt.Fprintln(w)
	}

	if len(r.Scans) > 0 {
		for _, kind := range []string{"wall", "CPU"} {
			get := samples.wall
			if kind == "CPU" {
				get = samples.cpu
			}
			fmt.Fprintf(w, "### Tree scan, %s time (median of %d runs; in brackets: ÷ the project's fast scan with the BPF task iterator / ÷ with the /proc lister)\n\n", kind, b.cfg.runs)
			fmt.Fprintln(w, "| N (processes) | project fast, BPF task iterator (`--bpf on`) | project fast, /proc (`--bpf off`) | project full (`--full-scan`) | naive Go (stat+cmdline each) | `ps -e -o pid=,pgid=,lstart=,args=` | seed approach (Python, scan) | seed approach (Python, whole run) | load |")
			fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
			for _, s := range r.Scans {
				bpf, proc := get(s.FastBPF), get(s.FastProc)
				cell := func(v samples) string {
					if len(s.FastBPF) == 0 {
						return fmt.Sprintf("%s (– / %.1f×)", ms(get(v)), ratio(get(v), proc))
					}
					return fmt.Sprintf("%s (%.1f× / %.1f×)", ms(get(v)), ratio(get(v), bpf), ratio(get(v), proc))
				}
				bpfCell := ms(bpf)
				if len(s.FastBPF) == 0 {
					bpfCell = "**failed** (see below)"
				}
				fmt.Fprintf(w, "| %d (%d) | %s | %s | %s | %s | %s | %s | %s | %s |\n", s.N, s.Processes, bpfCell, cell(s.FastProc), cell(s.Full), cell(s.Naive), cell(s.PS), cell(s.SeedScan), cell(s.SeedWall), s.Load)
			}
			fmt.Fprintln(w)
		}
		fmt.Fprintln(w, "| N | fast scan reads, BPF task iterator | fast scan reads, /proc lister | full scan reads | decisions |")
		fmt.Fprintln(w, "|---|---|---|---|---|")
		for _, s := range r.Scans {
			bpf := "**failed**: " + s.BPFError
			if s.BPFError == "" {
				bpf = fastReads(s.BPFStats)
			}
			fmt.Fprintf(w, "| %d | %s | %s | %d stat, %d full identities | %s |\n",
				s.N, bpf, fastReads(s.ProcStats), s.FullStats.StatReads, s.FullStats.FullReads, s.Agreement)
		}
		fmt.Fprintln(w)
	}

	if len(r.Hooks) > 0 {
		fmt.Fprintf(w, "### kc-hook poststop (the real binary, State on stdin; median of %d runs; CPU and peak RSS from wait4)\n\n", b.cfg.hookRuns)
		fmt.Fprintln(w, "| N (processes) | no tree, `--bpf auto`: wall | CPU | peak RSS | no tree, `KC_BPF=off` (/proc lister): wall | CPU | peak RSS | one 3-process tree, `--bpf auto`: wall | CPU | peak RSS | seed approach's scan, same rounds: wall (CPU) | ÷ no tree (wall) | no tree: files opened, /proc listings | load |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
		for _, h := range r.Hooks {
			fmt.Fprintf(w, "| %d (%d) | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s (%s) | %.1f× | %s | %s |\n", h.N, h.Processes,
				ms(h.NoTree.wall()), ms(h.NoTree.cpu()), mb(medianInt(h.NoTreeRSS)),
				ms(h.NoTreeOff.wall()), ms(h.NoTreeOff.cpu()), mb(medianInt(h.NoTreeOffRSS)),
				ms(h.Tree.wall()), ms(h.Tree.cpu()), mb(medianInt(h.TreeRSS)),
				ms(h.Seed.wall()), ms(h.Seed.cpu()), ratio(h.Seed.wall(), h.NoTree.wall()), tracedText(h.Traced), h.Load)
		}
		// The hook logs its lister only at debug level, which its log
		// does not keep: say what auto amounts to rather than claim it.
		fmt.Fprintln(w, "\n`--bpf auto` lists through the BPF task iterator wherever the kernel allows it, else through /proc. The hook does not report which it used; it runs as root on the kernel where the harness's own `--bpf on` scans above ran.")
		fmt.Fprintln(w)
	}

	if len(r.Reconciles) > 0 {
		fmt.Fprintf(w, "### kc-janitor reconcile, dry run, end to end (%d live containers with a tree each + %d strays; median of %d runs; decisions of the last run, over all trees on the host)\n\n", len(b.liveIDs), len(b.strayIDs), b.cfg.janitorRuns)
		fmt.Fprintln(w, "| N (processes) | liveness path | wall | CPU | peak RSS | seed approach's scan, same rounds: wall (CPU) | ÷ (wall) | files opened, /proc listings (strace, one run) | decisions | load |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
		for _, rr := range r.Reconciles {
			var acts []string
			for k, v := range rr.Actions {
				acts = append(acts, fmt.Sprintf("%d %s", v, k))
			}
			slices.Sort(acts)
			fmt.Fprintf(w, "| %d (%d) | %s (source %s) | %s | %s | %s | %s (%s) | %.1f× | %s | %s | %s |\n", rr.N, rr.Processes, rr.Path, rr.Source, ms(rr.Wall.wall()), ms(rr.Wall.cpu()), mb(medianInt(rr.RSS)),
				ms(rr.Seed.wall()), ms(rr.Seed.cpu()), ratio(rr.Seed.wall(), rr.Wall.wall()), tracedText(rr.Traced), strings.Join(acts, ", "), rr.Load)
		}
		fmt.Fprintln(w)
	}

	b.engineTable(w)
	b.deathTable(w)

	if sw := r.Sweep; sw != nil {
		fmt.Fprintf(w, "### kc-janitor sweep, dry run (%d sockets: %d live, %d hung, %d stale; median of %d runs)\n\n", sw.Sockets, sw.Live, sw.Hung, sw.Stale, b.cfg.sweepRuns)
		fmt.Fprintln(w, "| wall | CPU | peak RSS | verdicts | seed approach (computed) | ratio (wall) | load |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
		var vs []string
		for k, v := range sw.Verdicts {
			vs = append(vs, fmt.Sprintf("%d %s", v, k))
		}
		slices.Sort(vs)
		fmt.Fprintf(w, "| %s | %s | %s | %s | ≥ %s | %.0f× | %s |\n\n", ms(sw.Wall.wall()), ms(sw.Wall.cpu()), mb(medianInt(sw.RSS)), strings.Join(vs, ", "), sw.SeedCost, ratio(sw.SeedCost, sw.Wall.wall()), sw.Load)
	}

	if len(r.OpCosts) > 0 {
		fmt.Fprintln(w, "### What a scan is made of, on this machine (best of 5)")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| N | getpid(2) | getpgid(2) | read /proc/<pid>/stat (openat+read+close) | one /proc entry (getdents64) | `kc-hook --version` (process start-up) |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|")
		for i, c := range r.OpCosts {
			n := 0
			if i < len(r.Scans) {
				n = r.Scans[i].N
			}
			fmt.Fprintf(w, "| %d | %s | %s | %s | %s | %s |\n", n, us(c.Syscall), us(c.Getpgid), us(c.StatRead), us(c.DirEntry), ms(c.GoStartup))
		}
		fmt.Fprintln(w)
	}

	l := r.Link
	fmt.Fprintf(w, "### kc-hook's dependencies\n\n`go version -m bin/kc-hook`: %d modules, podman modules %s; `go list -deps ./cmd/kc-hook`: %d packages, podman %s. Binary sizes: kc-hook %s, kc-janitor %s.\n\n",
		l.Modules, podmanWord(l.VersionMChecked, l.VersionM), l.Packages, podmanWord(l.ListDepsChecked, l.ListDeps), mb(l.HookBytes/1024), mb(l.JanitorBytes/1024))

	if len(r.Targets) > 0 {
		fmt.Fprintln(w, "### Targets\n\n| target | goal | measured | met |\n|---|---|---|---|")
		for _, t := range r.Targets {
			met := okWord(t.Met, "yes", "**no**")
			if t.Comparison {
				met = "—"
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s |\n", t.What, t.Goal, t.Measured, met)
		}
		fmt.Fprintln(w)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "- note: %s\n", n)
	}
	for _, f := range r.Failures {
		fmt.Fprintf(w, "- FAILURE: %s\n", f)
	}
}

func us(d time.Duration) string { return fmt.Sprintf("%.2f µs", float64(d)/float64(time.Microsecond)) }

func mb(kb int64) string { return fmt.Sprintf("%.1f MB", float64(kb)/1024) }

// fastReads says what a fast scan read and which lister it ran with.
func fastReads(st trees.Stats) string {
	out := fmt.Sprintf("lister `%s`: %d processes, %d groups: %d stat, %d full identities", st.Lister, st.Processes, st.Groups, st.StatReads, st.FullReads)
	if st.IterConfirmed {
		out += fmt.Sprintf("; listing checked against /proc's: %d processes the iterator missed", st.IterMissed)
	}
	return out
}

// tracedText is a traced run's counts, or why there are none.
func tracedText(t *traced) string {
	if t == nil {
		return "— (no strace)"
	}
	return fmt.Sprintf("%d, %d", t.Opens, t.Listings)
}
