package proxy

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/backpressure"
	"github.com/orbitproxy/orbit/governor"
)

// TestAdv39BudgetReturnedEveryResponseKind: whatever the response (none of
// a body, a body read, a body closed early, an upgrade, a failed attempt
// retried), once the caller closed it the request's permit and worker are
// back, on the local and the remote path.
func TestAdv39BudgetReturnedEveryResponseKind(t *testing.T) {
	u := newTestUpstream(t)
	for _, remote := range []bool{false, true} {
		name := "local"
		if remote {
			name = "remote"
		}
		t.Run(name, func(t *testing.T) {
			lim := backpressure.New(backpressure.WithCap(4))
			gov := governor.New(4, 0)
			lim2 := backpressure.New(backpressure.WithCap(4))
			gov2 := governor.New(4, 0)
			spec := testSpec
			spec.Path = filepath.Join(t.TempDir(), "seg")
			owner := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond, Governor: gov}, func(tr *Transport) {
				tr.MaxConnsPerKey = 1
				tr.Limiter = lim
			})
			client := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond, Governor: gov2}, func(tr *Transport) {
				tr.MaxConnsPerKey = 1
				tr.Limiter = lim2
			})
			m, l, g := owner, lim, gov
			if remote {
				m, l, g = client, lim2, gov2
			}
			warm(t, owner, u.url("/cl"))
			check := func(what string) {
				t.Helper()
				deadline := time.Now().Add(2 * time.Second)
				for (l.Active() != 0 || g.Outstanding() != 0 || gov.Outstanding() != 0) && time.Now().Before(deadline) {
					time.Sleep(5 * time.Millisecond)
				}
				if l.Active() != 0 || g.Outstanding() != 0 || gov.Outstanding() != 0 {
					t.Errorf("%s: %d permits, %d workers (owner %d) still held", what, l.Active(), g.Outstanding(), gov.Outstanding())
				}
			}
			for _, tc := range []struct {
				method, path string
				hdr          map[string]string
				read         bool
			}{
				{"HEAD", "/head", nil, false},
				{"GET", "/204", nil, false},
				{"GET", "/304", nil, false},
				{"GET", "/1xx", nil, true},
				{"GET", "/cl", nil, true},
				{"GET", "/cl", nil, false},
				{"GET", "/chunked", nil, false},
				{"GET", "/gzip", nil, true},
				{"GET", "/gzip", nil, false},
				{"GET", "/big?n=3000000", nil, false},
				{"GET", "/nope", nil, true},
			} {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				req, _ := http.NewRequestWithContext(ctx, tc.method, u.url(tc.path), nil)
				resp, err := m.tr.RoundTrip(req)
				if err != nil {
					t.Errorf("%s %s: %v", tc.method, tc.path, err)
					cancel()
					continue
				}
				if tc.read {
					io.ReadAll(resp.Body)
				}
				resp.Body.Close()
				cancel()
				check(tc.method + " " + tc.path)
			}
			// upgrade
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			req, _ := http.NewRequestWithContext(ctx, "GET", u.url("/upgrade"), nil)
			req.Header.Set("Upgrade", "echo")
			req.Header.Set("Connection", "Upgrade")
			resp, err := m.tr.RoundTrip(req)
			if err != nil {
				t.Logf("upgrade: %v", err)
			} else {
				if rw, ok := resp.Body.(io.ReadWriteCloser); ok {
					io.WriteString(rw, "hi")
				}
				resp.Body.Close()
			}
			cancel()
			check("upgrade")
			// POST with body
			ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
			req, _ = http.NewRequestWithContext(ctx, "POST", u.url("/sink"), strings.NewReader(strings.Repeat("x", 100000)))
			resp, err = m.tr.RoundTrip(req)
			if err == nil {
				resp.Body.Close()
			}
			cancel()
			check("post")
		})
	}
}
