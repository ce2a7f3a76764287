package proxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv59H2ExpectWithoutRelayed100ThroughSibling: a POST with Expect:
// 100-continue to an HTTP/2 upstream that reads the body without its client
// ever seeing a 100 waits for the 100 as long as net/http's HTTP/2 client
// waits (its transport's ExpectContinueTimeout), on the owner's path and
// through a sibling, reports the same waits for a 100, and through a
// sibling waits once, not once on each side of the unix leg.
//
// Through a sibling, the caller's own exchange on the unix leg holds the
// body back until a relayed 100 or its ExpectContinueTimeout, and the
// owner's HTTP/2 stream holds it until the upstream's 100 or its own. Two
// upstreams whose client sees no 100:
//   - net/http's own HTTP/2 server, whose handler sends 103 Early Hints
//     and then reads the body (no 100 reaches the client then);
//   - an upstream that reads the body and never sends a 100 at all.
func TestAdv59H2ExpectWithoutRelayed100ThroughSibling(t *testing.T) {
	const timeout = time.Second
	up := newH2CServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/" {
			io.WriteString(w, "ok")
			return
		}
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		b, _ := io.ReadAll(r.Body)
		io.WriteString(w, "got "+string(b))
	})
	raw := newRawH2(t, func(s *rawStream) {
		// Called once the request's body has ended; sends no 100.
		if s.path == "/" {
			s.headers(false, ":status", "200", "content-length", "2")
			s.data(true, []byte("ok"))
			return
		}
		b := "got " + strconv.Itoa(s.bodyLen) + " bytes"
		s.headers(false, ":status", "200", "content-length", strconv.Itoa(len(b)))
		s.data(true, []byte(b))
	})
	owner, client := remotePair(t, func(tr *Transport) {
		tr.H2C = true
		tr.ExpectContinueTimeout = timeout
	})
	for _, u := range []string{up.url, raw.url} {
		if err := getOK(owner, context.Background(), u+"/"); err != nil {
			t.Fatal(err)
		}
	}
	ref := stockH2C(t, timeout)
	waitsOn := map[string]int32{}
	for _, c := range []struct{ name, url, want string }{
		{"net/http upstream sending 103 then reading", up.url + "/post", "got hello"},
		{"upstream reading without a 100", raw.url + "/post", "got 5 bytes"},
	} {
		for _, path := range []string{"net/http", "owner", "sibling"} {
			rt := map[string]http.RoundTripper{"net/http": ref, "owner": owner.tr, "sibling": client.tr}[path]
			var waits atomic.Int32
			ctx, cancel := context.WithTimeout(context.Background(), 3*timeout)
			ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{Wait100Continue: func() { waits.Add(1) }})
			req, _ := http.NewRequestWithContext(ctx, "POST", c.url, strings.NewReader("hello"))
			req.Header.Set("Expect", "100-continue")
			o := roundTripOutcome(rt, req)
			cancel()
			t.Logf("%s, %s: %d %q %q after %v; Wait100Continue %d", c.name, path, o.status, o.body, o.err,
				o.duration.Round(time.Millisecond), waits.Load())
			waitsOn[path] = waits.Load()
			held := o.duration >= timeout*2/3
			if path == "net/http" {
				if o.status != 200 || o.body != c.want || !held {
					t.Fatalf("%s: reference changed: net/http's client: %+v", c.name, o)
				}
				continue
			}
			if waitsOn[path] != waitsOn["net/http"] {
				t.Errorf("%s, %s: Wait100Continue fired %d times, net/http's client %d times", c.name, path, waitsOn[path], waitsOn["net/http"])
			}
			if o.status != 200 || o.body != c.want || !held || o.duration >= timeout*9/5 {
				t.Errorf("%s, %s: status %d body %q error %q after %v; want 200 %q after the %v ExpectContinueTimeout, once, as net/http's client",
					c.name, path, o.status, o.body, o.err, o.duration.Round(time.Millisecond), c.want, timeout)
			}
		}
	}
	if s := client.node.Stats(); s.ReusedRemote == 0 {
		t.Errorf("the sibling's requests did not go through the owner: %+v", s)
	}
}
