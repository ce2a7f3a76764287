package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// adv64CountingBody counts the Reads of a request body, zero-length ones
// included: a net/http server's body tells its client to continue on the
// first Read of any length.
type adv64CountingBody struct {
	r     io.Reader
	reads atomic.Int32
}

func (b *adv64CountingBody) Read(p []byte) (int, error) {
	b.reads.Add(1)
	return b.r.Read(p)
}

func (b *adv64CountingBody) Close() error { return nil }

// An https upstream that chose HTTP/1.1 answers Expect: 100-continue with
// 417 without reading the body. net/http's Transport (and the owner's own
// path) never reads the caller's body then, so a server in front never
// tells its client to send the body the upstream refused. Nor may a sibling
// that has no connection of its own to the upstream and takes it for
// HTTP/2: its own wait for the 100 holds the body until the owner relays
// the 417.
func TestAdv64GuessedH2OwnerOnH1ReadsRefusedBody(t *testing.T) {
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "POST" {
			io.WriteString(w, "ok")
			return
		}
		w.WriteHeader(http.StatusExpectationFailed)
	}))
	ts.TLS = &tls.Config{NextProtos: []string{"http/1.1"}}
	ts.StartTLS()
	t.Cleanup(ts.Close)
	roots := x509.NewCertPool()
	roots.AddCert(ts.Certificate())
	const ect = 2 * time.Second
	owner, client := remotePair(t, func(tr *Transport) {
		tr.HTTP2 = true
		tr.TLSClientConfig = &tls.Config{RootCAs: roots}
		tr.ExpectContinueTimeout = ect
	})
	{
		req, _ := http.NewRequest("GET", ts.URL+"/", nil)
		o := roundTripOutcome(owner.tr, req)
		if o.status != 200 || o.proto != "HTTP/1.1" {
			t.Fatalf("warm-up: %s %d %q", o.proto, o.status, o.err)
		}
	}
	ref := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ExpectContinueTimeout: ect}
	defer ref.CloseIdleConnections()

	reads := map[string]int32{}
	for _, p := range []struct {
		name string
		rt   http.RoundTripper
	}{{"sibling", client.tr}, {"net/http", ref}, {"owner", owner.tr}} {
		body := &adv64CountingBody{r: strings.NewReader("hello")}
		ctx, cancel := context.WithTimeout(context.Background(), 3*ect)
		req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/upload", body)
		req.ContentLength = 5
		req.Header.Set("Expect", "100-continue")
		o := roundTripOutcome(p.rt, req)
		cancel()
		if o.status != http.StatusExpectationFailed {
			t.Fatalf("%s: status %d error %q; want 417", p.name, o.status, o.err)
		}
		time.Sleep(50 * time.Millisecond) // a writer after the response
		reads[p.name] = body.reads.Load()
	}
	if s := client.node.Stats(); s.ReusedRemote == 0 {
		t.Fatalf("the sibling's request did not go through the owner: %+v", s)
	}
	if reads["sibling"] != reads["net/http"] {
		t.Errorf("reads of the caller's body: sibling %d, net/http %d, owner %d; want the sibling, whose owner runs HTTP/1.1 and waits for a 100 the upstream refused, to read it no more than net/http does (a server in front tells its client to send on the first read)",
			reads["sibling"], reads["net/http"], reads["owner"])
	}
}
