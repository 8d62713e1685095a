package engine

import (
	"context"
	"fmt"
	"net/http"
	"time"
)

// OpenStream sends an event-stream request and waits at most wait for the
// answer's headers. The stream itself stays open for hours, so the
// request's context carries no deadline; but an engine that accepts the
// connection and never answers would otherwise leave the subscription deaf
// and silent for the life of watch. The returned cancel ends the stream.
func OpenStream(ctx context.Context, hc *http.Client, req *http.Request, wait time.Duration) (*http.Response, context.CancelFunc, error) {
	sctx, cancel := context.WithCancel(ctx)
	timer := time.AfterFunc(wait, cancel)
	resp, err := hc.Do(req.WithContext(sctx))
	if !timer.Stop() && ctx.Err() == nil {
		// The timer fired: whatever Do returned, the stream is cancelled.
		if err == nil {
			resp.Body.Close()
		}
		cancel()
		return nil, nil, fmt.Errorf("no answer within %v (--podman-timeout)", wait)
	}
	if err != nil {
		cancel()
		return nil, nil, err
	}
	return resp, cancel, nil
}
