package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// adv19SlowBody yields n bytes in chunks of 16 KiB, with a pause before each.
type adv19SlowBody struct {
	left  int
	pause time.Duration
}

func (b *adv19SlowBody) Read(p []byte) (int, error) {
	if b.left == 0 {
		return 0, io.EOF
	}
	time.Sleep(b.pause)
	k := min(len(p), b.left, 16<<10)
	for i := range k {
		p[i] = 'b'
	}
	b.left -= k
	return k, nil
}

func (b *adv19SlowBody) Close() error { return nil }

// TestAdv19EarlyOKWhileBodyStreams: an upstream answers a POST 200 at once
// without reading its body (net/http's server then discards up to 256 KiB
// of it and keeps the connection). The client's body trickles in. Each
// transport gives the 200, and the next requests (each with its own id in
// the answer) get their own answers, never one meant for another.
func TestAdv19EarlyOKWhileBodyStreams(t *testing.T) {
	for _, withTLS := range []bool{false, true} {
		t.Run(fmt.Sprint("tls=", withTLS), func(t *testing.T) { testAdv19EarlyOK(t, withTLS) })
	}
}

func testAdv19EarlyOK(t *testing.T, withTLS bool) {
	var n atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := n.Add(1)
		if r.URL.Path == "/early" {
			fmt.Fprintf(w, "early %d", id)
			return
		}
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %d %d", r.URL.Path, len(b), id)
	}))
	var roots *x509.CertPool
	if withTLS {
		srv.StartTLS()
		roots = x509.NewCertPool()
		roots.AddCert(srv.Certificate())
	} else {
		srv.Start()
	}
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	conf := func(tr *Transport) {
		if roots != nil {
			tr.TLSClientConfig = &tls.Config{RootCAs: roots}
		}
	}

	run := func(t *testing.T, rt http.RoundTripper) {
		for round := range 3 {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/early", &adv19SlowBody{left: 200 << 10, pause: 5 * time.Millisecond})
			req.ContentLength = 200 << 10
			resp, err := rt.RoundTrip(req)
			if err != nil {
				cancel()
				t.Fatalf("round %d: early: %v", round, err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			cancel()
			if err != nil || resp.StatusCode != 200 || !strings.HasPrefix(string(b), "early ") {
				t.Fatalf("round %d: early: %d %q %v", round, resp.StatusCode, b, err)
			}
			for i := range 3 {
				path := fmt.Sprintf("/next%d", i)
				_, body, err := adv10Do(t, rt, "GET", srv.URL+path, nil)
				if err != nil || !strings.HasPrefix(body, path+" 0 ") {
					t.Fatalf("round %d: after the early answer, %s: %q %v", round, path, body, err)
				}
			}
		}
	}
	t.Run("stock", func(t *testing.T) {
		tr := &http.Transport{MaxConnsPerHost: 1}
		if roots != nil {
			tr.TLSClientConfig = &tls.Config{RootCAs: roots}
		}
		defer tr.CloseIdleConnections()
		run(t, tr)
	})
	t.Run("local", func(t *testing.T) {
		m := localTransportMember(t, conf)
		warm(t, m, srv.URL+"/warm")
		run(t, m.tr)
	})
	t.Run("remote", func(t *testing.T) {
		owner, client := remotePair(t, conf)
		warm(t, owner, srv.URL+"/warm")
		run(t, client.tr)
		if s := owner.node.Stats(); s.ServedRemote == 0 {
			t.Fatalf("not through the owner: %+v", s)
		}
	})
}
