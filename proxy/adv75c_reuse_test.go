package proxy

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestAdv75cPeekKeepsHealthyStreams: many exchanges of every response shape
// through one sibling (plain, chunked with trailers, HEAD, 204, 304, 103
// then 200, Expect: 100-continue POST, a slow chunked body), one after the
// other. The peek of a pooled stream must find nothing pending after any of
// them: no "bytes nobody asked for" warning, every answer right, and the
// client keeps reusing the one stream (a shape that left bytes behind would
// cost a new stream, and a warning, on every next request).
func TestAdv75cPeekKeepsHealthyStreams(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		switch r.URL.Path {
		case "/chunked":
			w.Header().Set("Trailer", "X-T")
			io.WriteString(w, "part1-")
			w.(http.Flusher).Flush()
			io.WriteString(w, "part2")
			w.Header().Set("X-T", "tv")
		case "/head":
			w.Header().Set("Content-Length", "10")
		case "/204":
			w.WriteHeader(204)
		case "/304":
			w.WriteHeader(304)
		case "/103":
			w.Header().Set("Link", "</a.css>; rel=preload")
			w.WriteHeader(103)
			io.WriteString(w, "hinted")
		case "/slow":
			for i := range 5 {
				io.WriteString(w, strings.Repeat(string(rune('0'+i)), 1000))
				w.(http.Flusher).Flush()
				time.Sleep(5 * time.Millisecond)
			}
		default:
			io.WriteString(w, "ok"+r.URL.Path)
		}
	}))
	t.Cleanup(up.Close)
	owner, client, logs := adv75cPair(t, 0)
	warm(t, owner, up.URL+"/warm")

	seen := map[net.Conn]bool{}
	sample := func() {
		owner.node.srv.mu.Lock()
		for c := range owner.node.srv.conns {
			seen[c] = true
		}
		owner.node.srv.mu.Unlock()
	}
	type shape struct {
		method, path string
		body         string
		expect       bool
		want         string
		status       int
	}
	shapes := []shape{
		{"GET", "/plain", "", false, "ok/plain", 200},
		{"GET", "/chunked", "", false, "part1-part2", 200},
		{"HEAD", "/head", "", false, "", 200},
		{"GET", "/204", "", false, "", 204},
		{"GET", "/304", "", false, "", 304},
		{"GET", "/103", "", false, "hinted", 200},
		{"POST", "/expect", strings.Repeat("x", 3000), true, "ok/expect", 200},
		{"POST", "/post", strings.Repeat("y", 70000), false, "ok/post", 200},
		{"GET", "/slow", "", false, "", 200},
	}
	served := owner.node.Stats().ServedRemote
	n := 0
	for round := range 3 {
		for _, s := range shapes {
			var body io.Reader
			if s.body != "" {
				body = strings.NewReader(s.body)
			}
			req, _ := http.NewRequest(s.method, up.URL+s.path, body)
			if s.expect {
				req.Header.Set("Expect", "100-continue")
			}
			resp, err := client.tr.RoundTrip(req)
			if err != nil {
				t.Fatalf("round %d %s %s: %v", round, s.method, s.path, err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != s.status {
				t.Fatalf("round %d %s %s: status %d err %v", round, s.method, s.path, resp.StatusCode, err)
			}
			if s.want != "" && string(got) != s.want {
				t.Fatalf("round %d %s %s: got %q want %q", round, s.method, s.path, got, s.want)
			}
			if s.path == "/chunked" && resp.Trailer.Get("X-T") != "tv" {
				t.Fatalf("round %d: trailer lost: %v", round, resp.Trailer)
			}
			n++
			time.Sleep(5 * time.Millisecond) // let anything late arrive before the next peek
			sample()
		}
	}
	if got := owner.node.Stats().ServedRemote - served; got < uint64(n) {
		t.Fatalf("only %d of %d requests went through the sibling", got, n)
	}
	for _, e := range logs.All() {
		if strings.Contains(e.Message, "bytes nobody asked for") {
			t.Fatalf("healthy stream taken for stray bytes: %s %v", e.Message, e.ContextMap())
		}
	}
	if len(seen) > 1 {
		t.Fatalf("client used %d streams for %d sequential exchanges, want 1 (a stream was dropped after some shape)", len(seen), n)
	}
}
