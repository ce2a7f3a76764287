package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv75bOwnerEndsMidResponse: siblings' responses stream (20 chunks,
// 40 ms apart, chunked or with a Content-Length, over HTTP/1.1 or h2c)
// through the owner's connection when the owner ends: by Shutdown with
// time to spare, by Shutdown with a 100 ms drain, by Close, or by its pool
// closing and then Close. With time to spare every response is whole.
// Otherwise each caller must see an error: never a body cut short reported
// as complete (a wrong response), and never a wait past its own deadline.
func TestAdv75bOwnerEndsMidResponse(t *testing.T) {
	const chunks = 20
	handler := func(w http.ResponseWriter, r *http.Request) {
		var parts []string
		for i := range chunks {
			parts = append(parts, fmt.Sprintf("c%02d-%s\n", i, r.URL.Query().Get("q")))
		}
		if r.URL.Query().Get("cl") != "" {
			total := 0
			for _, p := range parts {
				total += len(p)
			}
			w.Header().Set("Content-Length", fmt.Sprint(total+4))
		}
		if r.URL.Query().Get("q") == "warm" {
			parts = parts[:0]
			w.Header().Del("Content-Length")
			io.WriteString(w, "ok")
			return
		}
		f := w.(http.Flusher)
		for _, p := range parts {
			io.WriteString(w, p)
			f.Flush()
			time.Sleep(40 * time.Millisecond)
		}
		io.WriteString(w, "END\n")
	}
	ends := []struct {
		name  string
		spare bool
		end   func(m *member)
	}{
		{"shutdown-spare", true, func(m *member) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			m.node.Shutdown(ctx)
		}},
		{"shutdown-short", false, func(m *member) {
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			m.node.Shutdown(ctx)
		}},
		{"close", false, func(m *member) { m.node.Close() }},
		{"poolclose", false, func(m *member) { m.pool.Close(); m.node.Close() }},
	}
	for _, proto := range []string{"h1", "h2c"} {
		var url string
		var conf func(*Transport)
		if proto == "h1" {
			up := httptest.NewServer(http.HandlerFunc(handler))
			t.Cleanup(up.Close)
			url = up.URL
			conf = func(tr *Transport) { tr.MaxConnsPerKey = 1 }
		} else {
			url = newH2CServer(t, handler).url
			conf = func(tr *Transport) { tr.MaxConnsPerKey = 1; tr.H2C = true }
		}
		for _, cl := range []string{"", "1"} {
			for _, e := range ends {
				t.Run(fmt.Sprintf("%s/cl=%s/%s", proto, cl, e.name), func(t *testing.T) {
					owner, client := remotePair(t, conf)
					warm(t, owner, url+"/?q=warm")
					const n = 3
					const deadline = 8 * time.Second
					type res struct {
						q    string
						body string
						err  error
						d    time.Duration
					}
					out := make(chan res, n)
					var started atomic.Int64
					for i := range n {
						go func() {
							q := fmt.Sprintf("s%d", i)
							ctx, cancel := context.WithTimeout(context.Background(), deadline)
							defer cancel()
							start := time.Now()
							req, _ := http.NewRequestWithContext(ctx, "GET", url+"/?q="+q+"&cl="+cl, nil)
							resp, err := client.tr.RoundTrip(req)
							var b []byte
							if err == nil {
								buf := make([]byte, 64)
								k, rerr := resp.Body.Read(buf)
								b = append(b, buf[:k]...)
								started.Add(1)
								if rerr == nil {
									var rest []byte
									rest, err = io.ReadAll(resp.Body)
									b = append(b, rest...)
								} else if rerr != io.EOF {
									err = rerr
								}
								resp.Body.Close()
							} else {
								started.Add(1)
							}
							out <- res{q, string(b), err, time.Since(start)}
						}()
					}
					waitFor(t, 5*time.Second, "the responses to begin", func() bool { return started.Load() == n })
					time.Sleep(100 * time.Millisecond)
					done := make(chan struct{})
					go func() { defer close(done); e.end(owner) }()
					for range n {
						select {
						case r := <-out:
							var want strings.Builder
							for i := range chunks {
								fmt.Fprintf(&want, "c%02d-%s\n", i, r.q)
							}
							want.WriteString("END\n")
							if r.err == nil && r.body != want.String() {
								t.Errorf("%s: a wrong or cut body reported whole: %d bytes, want %d; ends %q", r.q, len(r.body), want.Len(), r.body[max(0, len(r.body)-30):])
							}
							if e.spare && r.err != nil {
								t.Errorf("%s failed though Shutdown had time to spare: %v", r.q, r.err)
							}
							if r.d > deadline+5*time.Second {
								t.Errorf("%s returned after %v, past its deadline", r.q, r.d)
							}
						case <-time.After(deadline + 10*time.Second):
							t.Fatal("a response hung past its deadline")
						}
					}
					select {
					case <-done:
					case <-time.After(15 * time.Second):
						t.Fatal("ending the owner hung")
					}
					if client.node.Stats().ReusedRemote == 0 {
						t.Errorf("no response went through the owner")
					}
				})
			}
		}
	}
}
