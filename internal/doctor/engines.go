package doctor

import (
	"fmt"
	"strings"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/engine"
)

// EngineInput is one container engine as doctor found it.
type EngineInput struct {
	Name     string
	Endpoint string
	// Found: --engine auto found its endpoint on this host.
	Found bool
	// Named: --engine named it.
	Named bool
	// Asked: it was asked (named, or found by auto).
	Asked bool
	// Err is why it could not be asked; nil when it answered.
	Err error
	// Source, UID, Containers, Live, Took describe its answer.
	Source     string
	UID        int
	Containers int
	Live       int
	Took       time.Duration
	// Version is what the engine says it is ("" with VersionErr set when
	// it would not say: not a failure, the list is what counts).
	Version    string
	VersionErr error
}

// EnginesInput is every built-in engine, in the order they are asked.
type EnginesInput struct {
	// Auto: --engine auto (else the engines were named).
	Auto bool
	// NotRoot: doctor runs as a user other than root, for whom auto
	// leaves out sockets that exist but he cannot connect to.
	NotRoot bool
	Engines []EngineInput
}

// EngineReport is one engine in doctor's JSON "engines" array.
type EngineReport struct {
	Name       string  `json:"name"`
	Endpoint   string  `json:"endpoint"`
	Found      bool    `json:"found"`
	Named      bool    `json:"named"`
	Asked      bool    `json:"asked"`
	Reachable  bool    `json:"reachable"`
	Version    string  `json:"version"`
	Source     string  `json:"source"`
	UID        int     `json:"uid"`
	Containers int     `json:"containers"`
	Live       int     `json:"live"`
	Error      *string `json:"error"`
}

// Engines turns what was found into the "engines" check (which engines
// auto found, or which were named), one check per built-in engine, and
// the JSON report of each.
func Engines(in EnginesInput) (summary Check, perEngine []Check, reports []EngineReport) {
	summary = enginesSummary(in)
	for _, e := range in.Engines {
		// An engine --engine leaves out gets no check: doctor --engine
		// docker says nothing of podman. Its JSON report says so.
		if in.Auto || e.Asked {
			perEngine = append(perEngine, engineCheck(e, in.Auto, in.NotRoot))
		}
		r := EngineReport{Name: e.Name, Endpoint: e.Endpoint, Found: e.Found, Named: e.Named, Asked: e.Asked,
			Version: e.Version, Source: e.Source, UID: engine.UIDUnknown}
		switch {
		case e.Asked && e.Err == nil:
			r.Reachable, r.UID, r.Containers, r.Live = true, e.UID, e.Containers, e.Live
		case e.Err != nil:
			msg := e.Err.Error()
			r.Error = &msg
		}
		reports = append(reports, r)
	}
	return summary, perEngine, reports
}

func enginesSummary(in EnginesInput) Check {
	var asked, absent []string
	notFound := "not found"
	if in.NotRoot {
		notFound = "not found or not connectable"
	}
	for _, e := range in.Engines {
		switch {
		case e.Asked:
			asked = append(asked, fmt.Sprintf("%s (%s)", e.Name, e.Endpoint))
		case in.Auto:
			absent = append(absent, fmt.Sprintf("%s at %s", e.Name, e.Endpoint))
		}
	}
	if !in.Auto {
		return newCheck(NameEngines, OK, "named by --engine: %s", strings.Join(asked, ", "))
	}
	if len(asked) == 0 {
		c := newCheck(NameEngines, Warn, "auto found no engine%s (looked for %s), so reconcile would touch nothing (exit 3)",
			connectable(in.NotRoot), strings.Join(absent, ", "))
		c.Remedy = "start one, or name it with --engine and its endpoint"
		return c
	}
	detail := "auto found " + strings.Join(asked, ", ")
	if len(absent) > 0 {
		detail += "; " + notFound + ": " + strings.Join(absent, ", ")
	}
	return newCheck(NameEngines, OK, "%s", detail)
}

// connectable qualifies what auto did not find for a user other than
// root: a socket he cannot connect to is left out as if absent.
func connectable(notRoot bool) string {
	if notRoot {
		return " this user can connect to"
	}
	return ""
}

func engineCheck(e EngineInput, auto, notRoot bool) Check {
	name := e.Name
	if !e.Asked {
		return newCheck(name, OK, "not asked: auto found nothing%s at %s", connectable(notRoot), e.Endpoint)
	}
	if e.Err != nil {
		// A named engine that cannot be asked fails every run that needs
		// ground truth: an error. One auto found is a warning, as podman
		// unreachable has always been.
		v, why := Warn, "auto found its endpoint"
		if e.Named {
			v, why = Error, "--engine names it"
		}
		c := newCheck(name, v, "unreachable, so stray trees could not be looked for (reconcile would touch nothing, exit 3; %s): %v",
			why, e.Err)
		c.Remedy = remedies[name]
		return c
	}
	version := e.Version
	if version == "" {
		version = "?"
	}
	detail := fmt.Sprintf("%s %s: version %s, %s, %d live, uid %d (%s)", e.Source, e.Endpoint, version,
		plural(e.Containers, "container", "containers"), e.Live, e.UID, e.Took.Round(time.Millisecond))
	if e.UID == engine.UIDUnknown {
		c := newCheck(name, Warn, "%s: the endpoint's owner is unknown (tcp, or the CLI through --url), so no tree can be judged a stray by it", detail)
		c.Remedy = "ask the engine at its unix socket, whose owner the connection tells"
		return c
	}
	if e.Source == string(engine.SourceCLI) {
		detail += "; the API did not answer"
	}
	return newCheck(name, OK, "%s", detail)
}
