package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// adv64Events records the events of one request's wait for a 100, in
// order. Where a 1xx or the end of the request's write falls among them is
// a race in x/net's client too, so those are left out.
type adv64Events struct {
	mu sync.Mutex
	ev []string
}

func (e *adv64Events) add(s string) {
	e.mu.Lock()
	e.ev = append(e.ev, s)
	e.mu.Unlock()
}

func (e *adv64Events) String() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return strings.Join(e.ev, ",")
}

func (e *adv64Events) trace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		Wait100Continue: func() { e.add("Wait100Continue") },
		Got100Continue:  func() { e.add("Got100Continue") },
	}
}

// A sibling that guessed HTTP/1.1 for an upstream its owner reaches over
// HTTP/2 sends an Expect: 100-continue body at once when the accept says
// HTTP/2 (flagAcceptH2), "as x/net's client does". x/net's client, which
// runs the same request on the owner and in a plain http2.Transport, never
// waits for a 100 and so never reports Wait100Continue. The sibling's trace
// must report the same 100-continue events as the reference for the same
// request.
func TestAdv64H2AcceptTraceWait100Continue(t *testing.T) {
	const ect = 3 * time.Second
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "POST" {
			io.WriteString(w, "ok")
			return
		}
		// No 100 once a 103 has gone out (net/http's HTTP/2 server).
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		b, _ := io.ReadAll(r.Body)
		io.WriteString(w, "got "+string(b))
	}))
	ts.EnableHTTP2 = true
	ts.StartTLS()
	t.Cleanup(ts.Close)
	roots := x509.NewCertPool()
	roots.AddCert(ts.Certificate())
	owner, client := remotePair(t, func(tr *Transport) {
		tr.HTTP2 = true
		tr.TLSClientConfig = &tls.Config{RootCAs: roots}
		tr.ExpectContinueTimeout = ect
	})
	if err := getOK(owner, context.Background(), ts.URL+"/"); err != nil {
		t.Fatal(err)
	}
	probe, _ := http.NewRequest("POST", ts.URL+"/", nil)
	e, err := client.tr.upstream(probe)
	if err != nil {
		t.Fatal(err)
	}
	e.spokeH1.Store(true) // as after a connection of its own chose http/1.1
	ref := &http2.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}
	defer ref.CloseIdleConnections()

	got := map[string]string{}
	for _, p := range []struct {
		name string
		rt   http.RoundTripper
	}{{"x/net", ref}, {"owner", owner.tr}, {"sibling", client.tr}} {
		ev := &adv64Events{}
		ctx, cancel := context.WithTimeout(context.Background(), 3*ect)
		ctx = httptrace.WithClientTrace(ctx, ev.trace())
		req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/upload", strings.NewReader("hello"))
		req.Header.Set("Expect", "100-continue")
		o := roundTripOutcome(p.rt, req)
		cancel()
		if o.status != 200 || o.body != "got hello" {
			t.Fatalf("%s: status %d body %q error %q", p.name, o.status, o.body, o.err)
		}
		got[p.name] = ev.String()
	}
	if s := client.node.Stats(); s.ReusedRemote == 0 {
		t.Fatalf("the sibling's request did not go through the owner: %+v", s)
	}
	if got["sibling"] != got["x/net"] {
		t.Errorf("100-continue trace events: sibling %q, x/net %q, owner %q; want the sibling's as x/net's for the same request on the same HTTP/2 connection",
			got["sibling"], got["x/net"], got["owner"])
	}
}
