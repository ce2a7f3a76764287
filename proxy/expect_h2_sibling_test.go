package proxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"testing"
	"time"
)

// TestH2ExpectContinueKnownLengthThroughSibling: a POST of a known length
// with Expect: 100-continue to an HTTP/2 upstream that sends its 100 when
// the handler reads the body answers through a sibling as soon as it does
// on the local path, not after the caller's ExpectContinueTimeout.
func TestH2ExpectContinueKnownLengthThroughSibling(t *testing.T) {
	const timeout = 3 * time.Second
	owner, client, url := h2EchoPair(t, timeout)
	hooked := &httptrace.ClientTrace{Got1xxResponse: func(int, textproto.MIMEHeader) error { return nil }}
	for _, c := range []struct {
		name  string
		trace *httptrace.ClientTrace
	}{
		{"owner", nil}, {"sibling", nil},
		{"owner", hooked}, {"sibling", hooked},
	} {
		name := c.name
		rt := map[string]http.RoundTripper{"owner": owner.tr, "sibling": client.tr}[name]
		ctx, cancel := context.WithTimeout(context.Background(), 2*timeout)
		if c.trace != nil {
			ctx = httptrace.WithClientTrace(ctx, c.trace)
			name += " (1xx hook)"
		}
		req, _ := http.NewRequestWithContext(ctx, "POST", url+"/post", strings.NewReader("hello"))
		req.Header.Set("Expect", "100-continue")
		o := roundTripOutcome(rt, req)
		cancel()
		if o.status != 200 || o.body != "got hello" || o.duration >= timeout/2 {
			t.Errorf("%s: status %d body %q error %q after %v; want the answer well before the %v ExpectContinueTimeout",
				name, o.status, o.body, o.err, o.duration.Round(time.Millisecond), timeout)
		}
	}
	if s := client.node.Stats(); s.ReusedRemote == 0 {
		t.Errorf("the sibling's request did not go through the owner: %+v", s)
	}
}

// h2EchoPair starts an h2c upstream that answers "got " and the request
// body (and "ok" at /), and an owner, with a connection to it, and a
// sibling, both with ExpectContinueTimeout expect.
func h2EchoPair(t *testing.T, expect time.Duration) (owner, client *member, url string) {
	t.Helper()
	up := newH2CServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/" {
			io.WriteString(w, "ok")
			return
		}
		b, _ := io.ReadAll(r.Body)
		io.WriteString(w, "got "+string(b))
	})
	owner, client = remotePair(t, func(tr *Transport) {
		tr.H2C = true
		tr.ExpectContinueTimeout = expect
	})
	if err := getOK(owner, context.Background(), up.url+"/"); err != nil {
		t.Fatal(err)
	}
	return owner, client, up.url
}
