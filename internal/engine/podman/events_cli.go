package podman

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/containerid"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/headbuf"
)

// cliEventsSettle: a `podman events` still running this long after its
// start has opened its events log (a wrong store or an unreadable log
// fails at once), so the subscription counts as in place. Deaths in
// between are replayed through --since.
const cliEventsSettle = time.Second

// deathsWithoutAPI follows `podman events` when the API service could not
// be asked (apiErr), or says why there are no events.
func (p *podman) deathsWithoutAPI(ctx context.Context, w engine.DeathWatch, apiErr error) error {
	args, ok := LocalCLIArgs(p.cfg.PodmanURL, p.cfg.PodmanArgs)
	if !ok {
		// The CLI could only go to the same service, through --url.
		return p.noEvents(fmt.Errorf("%w; the CLI reaches that podman only through it", apiErr))
	}
	err := p.deathsCLI(ctx, w, args)
	if errors.Is(err, errNoCLI) {
		return p.noEvents(fmt.Errorf("%w; %w", apiErr, err))
	}
	return err
}

// noEvents is ErrNoEvents for a podman never followed, and a drop to retry
// for one that was.
func (p *podman) noEvents(why error) error {
	if p.subscribed.Load() {
		return fmt.Errorf("podman events: %w", why)
	}
	return fmt.Errorf("%w: %w", engine.ErrNoEvents, why)
}

var errNoCLI = errors.New("no podman CLI")

// podmanCLIEvent is the part of a `podman events --format json` line we
// read. podman 4 writes Time as RFC 3339 text; podman 5 as Unix seconds,
// with timeNano next to it.
type podmanCLIEvent struct {
	ID       string          `json:"ID"`
	Status   string          `json:"Status"`
	Type     string          `json:"Type"`
	Time     json.RawMessage `json:"Time"`
	TimeNano int64           `json:"timeNano"`
}

func (e podmanCLIEvent) at() time.Time {
	if e.TimeNano > 0 {
		return time.Unix(0, e.TimeNano)
	}
	var s string
	if json.Unmarshal(e.Time, &s) == nil {
		if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
			return t
		}
	}
	return time.Now()
}

// deathsCLI runs `podman <args> events` for container deaths until ctx is
// done (nil) or the CLI exits (an error). The deaths it reports are only
// triggers, as the API's: the decision asks the engines again.
func (p *podman) deathsCLI(parent context.Context, w engine.DeathWatch, global []string) error {
	args := append(append([]string{}, global...), "events", "--stream", "--format", "json",
		"--filter", "type=container", "--filter", "event=died")
	if !w.Since.IsZero() {
		args = append(args, "--since", w.Since.UTC().Format(time.RFC3339Nano))
	}
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	cmd, err := Command(ctx, p.cfg.PodmanBin, args)
	if err != nil {
		return fmt.Errorf("%w: %w", errNoCLI, err)
	}
	endpoint := cmd.Path + " " + strings.Join(args, " ")
	stderr := &headbuf.Buffer{Max: 4096}
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("podman events (CLI) %s: %w", endpoint, err)
	}
	lines := make(chan []byte)
	readErr := make(chan error, 1)
	go func() {
		msgs := engine.NewMessages(out, engine.MaxEventMessage, w.Skipped)
		for {
			l, err := msgs.Next()
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				readErr <- err
				return
			}
			select {
			case lines <- append([]byte(nil), l...):
			case <-ctx.Done():
				readErr <- nil
				return
			}
		}
	}()

	isReady := false
	ready := func() {
		if isReady {
			return
		}
		isReady = true
		p.subscribed.Store(true)
		p.cfg.Log().Debug("podman events (CLI) followed", "cmd", endpoint, "since", w.Since)
		if w.Ready != nil {
			w.Ready()
		}
	}
	settle := time.NewTimer(cliEventsSettle)
	defer settle.Stop()
	var streamErr error
loop:
	for {
		select {
		case <-settle.C:
			ready()
		case l := <-lines:
			ready()
			var ev podmanCLIEvent
			if err := json.Unmarshal(l, &ev); err != nil {
				if w.Skipped != nil {
					w.Skipped(engine.SkipMalformed, int64(len(l)))
				}
				continue
			}
			if ev.Type != "container" || ev.Status != "died" || !containerid.Valid(ev.ID) {
				continue
			}
			w.Death(engine.Death{Engine: "podman", ID: ev.ID, At: ev.at()})
		case streamErr = <-readErr:
			break loop
		case <-ctx.Done():
			break loop
		}
	}
	cancel()
	waitErr := cmd.Wait()
	if parent.Err() != nil {
		return nil
	}
	if streamErr == nil {
		streamErr = waitErr
	}
	if streamErr == nil {
		streamErr = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("podman events (CLI) %s: stream ended: %w%s", endpoint, streamErr, QuoteStderr(stderr.Bytes()))
}
