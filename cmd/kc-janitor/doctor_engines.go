package main

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"

	"github.com/urfave/cli/v2"

	"github.com/kc-watchman/kc-watchman/internal/doctor"
	"github.com/kc-watchman/kc-watchman/internal/engine"
)

// engineInputs asks every engine --engine selects, and its version, for
// doctor's per-engine checks, and records what auto looked for. It is a
// question apart from the strays check's: the engines' own numbers (each
// answer's time, its version) are not in the union reconcile works from.
func engineInputs(ctx context.Context, c *cli.Context, g globals, log *slog.Logger) doctor.EnginesInput {
	cfg := engineConfig(c, g, log)
	in := doctor.EnginesInput{Auto: g.Engines == nil}
	es, selErr := engine.Select(g.Engines, cfg)

	var tr engine.Truth
	versions := make([]string, len(es))
	versionErrs := make([]error, len(es))
	var wg sync.WaitGroup
	if selErr == nil && len(es) > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr, _ = engine.Ask(ctx, es) // each engine's error is in its Status
		}()
		for i, e := range es {
			wg.Add(1)
			go func() {
				defer wg.Done()
				versions[i], versionErrs[i] = engine.VersionOf(ctx, e)
			}()
		}
	}
	wg.Wait()

	statuses := map[string]engine.Status{}
	for _, st := range tr.Statuses {
		statuses[st.Name] = st
	}
	answers := map[string]engine.Answer{}
	for _, a := range tr.Answers {
		answers[a.Engine] = a
	}
	asked := map[string]int{}
	for i, e := range es {
		asked[e.Name()] = i
	}
	for _, d := range engine.Detect(cfg) {
		ei := doctor.EngineInput{Name: d.Name, Endpoint: d.Endpoint, Found: d.Found, Named: slices.Contains(g.Engines, d.Name)}
		i, ok := asked[d.Name]
		switch {
		case selErr != nil && (ei.Named || (in.Auto && d.Found)):
			ei.Asked, ei.Err = true, selErr
		case ok:
			ei.Asked = true
			st := statuses[d.Name]
			ei.Endpoint = st.Endpoint
			if st.Error != nil {
				ei.Err = errors.New(*st.Error)
				break
			}
			ei.Source, ei.UID, ei.Containers, ei.Live = st.Source, st.UID, st.Containers, st.Live
			ei.Took = answers[d.Name].Took
			ei.Version, ei.VersionErr = versions[i], versionErrs[i]
			if ei.VersionErr != nil {
				log.Debug("engine did not say its version", "engine", d.Name, "err", ei.VersionErr)
			}
		}
		in.Engines = append(in.Engines, ei)
	}
	return in
}

// podmanLive is how many containers podman lists as live, for the hook
// alive check (the hook is podman's: Docker's and containerd's containers
// say nothing about it); -1 when podman could not be asked, 0 when it is
// not asked here.
func podmanLive(in doctor.EnginesInput) int {
	for _, e := range in.Engines {
		if e.Name == doctor.NamePodman && e.Asked {
			if e.Err != nil {
				return -1
			}
			return e.Live
		}
	}
	return 0
}

// podmanAsked says whether podman is one of the engines asked here
// (named, or found by auto), answering or not.
func podmanAsked(in doctor.EnginesInput) bool {
	for _, e := range in.Engines {
		if e.Name == doctor.NamePodman && e.Asked {
			return true
		}
	}
	return false
}
