package proxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestAdv5H2HeadNoContentNotModified: HEAD (with the length a GET would
// have), 204 and 304 from an HTTP/2 upstream read through a sibling as
// through x/net/http2 itself: status, ContentLength, headers, no body; and
// the sibling's unix stream stays in step after each.
func TestAdv5H2HeadNoContentNotModified(t *testing.T) {
	up := newH2CServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/head":
			w.Header().Set("Content-Length", "1234")
			w.Header().Set("X-Head", "yes")
			if r.Method != http.MethodHead {
				io.WriteString(w, strings.Repeat("h", 1234))
			}
		case "/204":
			w.Header().Set("X-Empty", "1")
			w.WriteHeader(http.StatusNoContent)
		case "/304":
			w.Header().Set("Etag", `"v1"`)
			w.WriteHeader(http.StatusNotModified)
		default:
			io.WriteString(w, "ok")
		}
	})
	owner, client := h2Pair(t, up.url)
	ref := refH2C()
	defer ref.CloseIdleConnections()
	for _, tc := range []struct{ method, path string }{{"HEAD", "/head"}, {"GET", "/204"}, {"GET", "/304"}, {"HEAD", "/204"}} {
		var got [3]h2Outcome
		for i, rt := range []http.RoundTripper{ref, owner.tr, client.tr} {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			req, _ := http.NewRequestWithContext(ctx, tc.method, up.url+tc.path, nil)
			req.Header.Set("Accept-Encoding", "identity") // x/net's own would ask for gzip
			got[i] = roundTripOutcome(rt, req)
			cancel()
			delete(got[i].header, "Date")
		}
		want := got[0]
		if want.err != "" {
			t.Fatalf("%s %s: x/net/http2: %s", tc.method, tc.path, want.err)
		}
		for i, name := range []string{"owner", "sibling"} {
			g := got[i+1]
			if g.err != "" || g.status != want.status || g.length != want.length || g.body != "" || g.proto != "HTTP/2.0" ||
				!reflect.DeepEqual(g.header, want.header) || len(g.trailer) != 0 {
				t.Errorf("%s %s through the %s: %+v; x/net/http2: %+v", tc.method, tc.path, name, g, want)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := getOK(client, ctx, up.url+"/"); err != nil {
			t.Errorf("%s %s: the sibling's next request: %v", tc.method, tc.path, err)
		}
		cancel()
	}
	if s := client.node.Stats(); s.Created != 0 || s.ReusedRemote != 8 {
		t.Errorf("sibling %+v: want every request through the owner", s)
	}
	capacityBack(t, owner, up.url)
}

// TestAdv5H2InterimResponses: a 103 Early Hints before the final response
// reaches the caller's Got1xxResponse through a sibling as through
// x/net/http2, with its Link header; and a request with Expect:
// 100-continue, whose upstream answers 100 when it reads the body, gets
// its body through at once (not after ExpectContinueTimeout) with the 100
// seen through Got100Continue.
func TestAdv5H2InterimResponses(t *testing.T) {
	up := newH2CServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/hints":
			w.Header().Set("Link", "</style.css>; rel=preload; as=style")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Del("Link")
			io.WriteString(w, "final")
		case "/continue":
			b, _ := io.ReadAll(r.Body)
			io.WriteString(w, "got "+string(b))
		default:
			io.WriteString(w, "ok")
		}
	})
	owner, client := remotePair(t, func(tr *Transport) {
		tr.H2C = true
		tr.ExpectContinueTimeout = 3 * time.Second
	})
	if err := getOK(owner, context.Background(), up.url+"/"); err != nil {
		t.Fatal(err)
	}
	ref := refH2C()
	defer ref.CloseIdleConnections()
	type interim struct {
		code int
		link string
	}
	for _, name := range []string{"x/net", "owner", "sibling"} {
		rt := map[string]http.RoundTripper{"x/net": ref, "owner": owner.tr, "sibling": client.tr}[name]
		var mu sync.Mutex
		var seen []interim
		var got100 bool
		trace := &httptrace.ClientTrace{
			Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
				mu.Lock()
				seen = append(seen, interim{code, h.Get("Link")})
				mu.Unlock()
				return nil
			},
			Got100Continue: func() { mu.Lock(); got100 = true; mu.Unlock() },
		}
		ctx, cancel := context.WithTimeout(httptrace.WithClientTrace(context.Background(), trace), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/hints", nil)
		o := roundTripOutcome(rt, req)
		mu.Lock()
		if o.err != "" || o.status != 200 || o.body != "final" || len(seen) != 1 || seen[0] != (interim{103, "</style.css>; rel=preload; as=style"}) {
			t.Errorf("%s: 103 then 200: %+v, interim responses %v; want one 103 with its Link", name, o, seen)
		}
		seen = nil
		mu.Unlock()

		pr, pw := io.Pipe()
		go func() {
			pw.Write([]byte(strings.Repeat("c", 8<<10)))
			pw.Close()
		}()
		req, _ = http.NewRequestWithContext(ctx, "POST", up.url+"/continue", pr)
		req.Header.Set("Expect", "100-continue")
		o = roundTripOutcome(rt, req)
		cancel()
		pr.Close()
		mu.Lock()
		if o.err != "" || o.status != 200 || o.body != "got "+strings.Repeat("c", 8<<10) || o.duration > 2*time.Second {
			t.Errorf("%s: Expect: 100-continue: %+v", name, o)
		}
		if name != "x/net" && (!got100 || len(seen) != 1 || seen[0].code != 100) {
			// A bare x/net/http2 client (no net/http transport, so no
			// ExpectContinueTimeout) sends the body at once; ours waits
			// for the 100, and sees it.
			t.Errorf("%s: Expect: 100-continue: Got100Continue %v, interim %v; want the upstream's 100 seen", name, got100, seen)
		}
		mu.Unlock()
	}
	if s := client.node.Stats(); s.Created != 0 || s.ReusedRemote != 2 {
		t.Errorf("sibling %+v: want every request through the owner", s)
	}
	capacityBack(t, owner, up.url)
}
