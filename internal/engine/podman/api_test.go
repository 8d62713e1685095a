package podman

import (
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestQueryAPIAnswers: what a libpod API service answers is read as
// podman's own list or refused as a whole, in words that say what came
// back. The service is an HTTP server on a unix socket; the CLI is
// absent, so that the API's answer alone decides.
func TestQueryAPIAnswers(t *testing.T) {
	const id = "f42f18001b7374827d29bf73169b3dfdceaa6921283e13ada4e90a659a4c0147"
	tests := []struct {
		name    string
		status  int
		body    string
		live    bool
		wantErr string
	}{
		{name: "running", status: 200, body: `[{"Id":"` + id + `","State":"running","Names":["k"],"Pid":42}]`, live: true},
		{name: "exited", status: 200, body: `[{"Id":"` + id + `","State":"exited","Names":["k"],"Pid":0}]`},
		{name: "no containers", status: 200, body: `[]`},
		{name: "server error", status: 500, body: `{"cause":"boom","message":"database is locked","response":500}`, wantErr: "answered 500: database is locked"},
		{name: "not JSON", status: 200, body: `<html>proxy</html>`, wantErr: "parse ps JSON"},
		{name: "no state", status: 200, body: `[{"Id":"` + id + `","Names":["k"]}]`, wantErr: "no state"},
		{name: "empty", status: 200, body: ``, wantErr: "no output"},
		{name: "null", status: 200, body: `null`, wantErr: "answered null"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			sock := filepath.Join(dir, "podman.sock")
			ln, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			var asked []string
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				asked = append(asked, r.URL.RequestURI())
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tt.status)
				w.Write([]byte(tt.body))
			})}
			go srv.Serve(ln)
			t.Cleanup(func() { srv.Close() })

			set, err := Query(t.Context(), Options{URL: "unix://" + sock, PodmanBin: filepath.Join(dir, "no-cli"), Timeout: 10 * time.Second, Logger: testLogger(t)})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := set.IsLive(id); got != tt.live {
				t.Errorf("live = %v, want %v (states %v)", got, tt.live, set.States)
			}
			if len(asked) != 1 || asked[0] != "/v4.0.0/libpod/containers/json?all=true" {
				t.Errorf("asked %q, want the libpod list of all containers", asked)
			}
		})
	}
}
