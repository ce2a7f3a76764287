package proxy

import (
	"context"
	"io"
	"net/http"
	"reflect"
	"testing"
	"time"
)

// TestH2EmptyBodyThroughSibling: an HTTP/2 answer without a body whose
// stream still ends with trailers (a 204, a 304) gives net/http's own
// client those trailers, and one that declares a length on a status without
// a body reports that length. Through a sibling the caller must see the
// same. (An answer that declares a length of 0 and ends with trailers loses
// them through a sibling: see relay.response.)
func TestH2EmptyBodyThroughSibling(t *testing.T) {
	withTrailer := func(head ...string) func(s *rawStream) {
		return func(s *rawStream) {
			s.headers(false, head...)
			s.headers(true, "x-t", "v")
		}
	}
	headOnly := func(head ...string) func(s *rawStream) {
		return func(s *rawStream) { s.headers(true, head...) }
	}
	cases := []struct {
		path    string
		answer  func(s *rawStream)
		trailer bool
	}{
		{"/204", withTrailer(":status", "204", "trailer", "x-t"), true},
		{"/304", withTrailer(":status", "304", "etag", `"e"`), true},
		{"/204-length", headOnly(":status", "204", "content-length", "5"), false},
		{"/304-length", headOnly(":status", "304", "content-length", "5"), false},
	}
	for _, c := range cases {
		t.Run(c.path[1:], func(t *testing.T) {
			outs, _ := rawH2Outcomes(t, "GET", c.path, c.answer)
			want := outs["x/net"]
			if c.trailer && (want.err != "" || want.trailer.Get("X-T") != "v") {
				t.Fatalf("x/net/http2 gave %+v", want)
			}
			for _, name := range h2Paths[1:] {
				g := outs[name]
				if (g.err == "") != (want.err == "") || g.status != want.status || g.length != want.length || g.body != want.body ||
					!reflect.DeepEqual(g.header, want.header) || !reflect.DeepEqual(g.trailer, want.trailer) {
					t.Errorf("%s: status %d length %d header %v body %q trailer %v err %q;\n"+
						"x/net/http2: status %d length %d header %v body %q trailer %v", name,
						g.status, g.length, g.header, g.body, g.trailer, g.err,
						want.status, want.length, want.header, want.body, want.trailer)
				}
			}
		})
	}
}

// TestH2EmptyBodyHeadNotHeldForTrailers: a sibling's caller gets a 204's
// head when the upstream sends it, as net/http's own client does, not when
// the trailers that end its stream come later; and its unix stream serves
// the next request.
func TestH2EmptyBodyHeadNotHeldForTrailers(t *testing.T) {
	const late = 400 * time.Millisecond
	up := newRawH2(t, func(s *rawStream) {
		if s.path == "/" {
			s.headers(false, ":status", "200", "content-length", "2")
			s.data(true, []byte("ok"))
			return
		}
		s.headers(false, ":status", "204", "trailer", "x-t")
		time.Sleep(late)
		s.headers(true, "x-t", "v")
	})
	_, client := h2Pair(t, up.url)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/late", nil)
	start := time.Now()
	resp, err := client.tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	headAt := time.Since(start)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if headAt >= late/2 || resp.StatusCode != 204 || err != nil || len(b) != 0 || resp.Trailer.Get("X-T") != "v" {
		t.Errorf("head after %v (the trailers came after %v): status %d body %q (%v) trailer %v",
			headAt, late, resp.StatusCode, b, err, resp.Trailer)
	}
	// The unix stream is in step: the next request reads its own answer.
	if err := getOK(client, ctx, up.url+"/"); err != nil {
		t.Errorf("the next request: %v", err)
	}
	if s := client.node.Stats(); s.ReusedRemote != 2 {
		t.Errorf("sibling %+v: want both requests through the owner", s)
	}
}
