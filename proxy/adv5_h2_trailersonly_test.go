package proxy

import (
	"context"
	"io"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/internal/grpcmsg"
)

// TestAdv5H2TrailersOnlyThroughSibling: gRPC answers an error with one
// HEADERS frame that ends the stream (trailers-only: grpc-status in the
// head, no body, no Content-Length). x/net/http2 returns it with
// ContentLength 0 and a body at EOF. Through a sibling it must read the
// same, at once, not as a body delimited by the unix stream's close; and
// the unix stream stays in step for the next request.
func TestAdv5H2TrailersOnlyThroughSibling(t *testing.T) {
	up := newRawH2(t, func(s *rawStream) {
		switch s.path {
		case "/trailers-only", "/early/trailers-only":
			s.headers(true, ":status", "200", "content-type", "application/grpc",
				"grpc-status", "12", "grpc-message", "unknown method")
		case "/empty-200":
			s.headers(true, ":status", "200")
		default:
			s.headers(false, ":status", "200", "content-type", "text/plain")
			s.data(true, []byte("ok"))
		}
	})
	owner, client := h2Pair(t, up.url)
	ref := refH2C()
	defer ref.CloseIdleConnections()
	for _, path := range []string{"/trailers-only", "/empty-200"} {
		var got [3]h2Outcome
		for i, rt := range []http.RoundTripper{ref, owner.tr, client.tr} {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			req := grpcReq(t, ctx, up.url+path, http.NoBody)
			got[i] = roundTripOutcome(rt, req)
			cancel()
		}
		want := got[0]
		if want.err != "" || want.status != 200 || want.length != 0 {
			t.Fatalf("%s: x/net/http2 gave %+v", path, want)
		}
		for i, name := range []string{"", "owner", "sibling"} {
			if i == 0 {
				continue
			}
			g := got[i]
			if g.err != "" || g.status != want.status || g.length != want.length || g.body != want.body ||
				!reflect.DeepEqual(g.header, want.header) || len(g.trailer) != 0 || g.duration > time.Second {
				t.Errorf("%s through the %s: status %d length %d header %v body %q trailer %v err %q after %v;\n"+
					"x/net/http2: status %d length %d header %v body %q", path, name, g.status, g.length, g.header, g.body,
					g.trailer, g.err, g.duration, want.status, want.length, want.header, want.body)
			}
		}
		// The sibling's unix stream is in step: the next request reads
		// its own answer.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := getOK(client, ctx, up.url+"/"); err != nil {
			t.Errorf("%s: the sibling's next request: %v", path, err)
		}
		cancel()
	}
	if s := client.node.Stats(); s.Created != 0 || s.ReusedRemote != 4 {
		t.Errorf("sibling %+v: want every request through the owner", s)
	}
	// The same answer to a request whose body still streams, unread
	// (a client-streaming call to an unknown method): the caller gets
	// it at once.
	for i, rt := range []http.RoundTripper{ref, owner.tr, client.tr} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		pr, pw := io.Pipe()
		go pw.Write(grpcmsg.Frame([]byte("first")))
		o := roundTripOutcome(rt, grpcReq(t, ctx, up.url+"/early/trailers-only", pr))
		if o.err != "" || o.status != 200 || o.length != 0 || o.header.Get("Grpc-Status") != "12" || o.duration > time.Second {
			t.Errorf("streamed request, %s: %+v", []string{"x/net", "owner", "sibling"}[i], o)
		}
		werr := make(chan error, 1)
		go func() {
			var err error
			for j := 0; err == nil && j < 1000; j++ {
				_, err = pw.Write(grpcmsg.Frame([]byte("more")))
			}
			werr <- err
		}()
		// x/net/http2 goes on sending it (the stream is half-closed on
		// the upstream's side only); the sibling gives it up. Either way
		// the caller's writes do not block.
		select {
		case <-werr:
		case <-time.After(2 * time.Second):
			pr.Close()
			<-werr
			t.Errorf("streamed request, %s: a writer stayed blocked on the request body", []string{"x/net", "owner", "sibling"}[i])
		}
		pw.Close()
		cancel()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := getOK(client, ctx, up.url+"/"); err != nil {
		t.Errorf("the sibling's next request: %v", err)
	}
	capacityBack(t, owner, up.url)
}

// TestAdv5H2EmptyResponseFreesStreamAtOnce: a response that ended with
// its HEADERS (trailers-only, 204, HEAD's) has no body to read: its
// stream is over upstream, and net/http frees what it used at once, as
// orbit's HTTP/1.1 path does for a body of length 0. Locally and through a
// sibling, the stream's unit is back before the caller touches the body.
func TestAdv5H2EmptyResponseFreesStreamAtOnce(t *testing.T) {
	up := newRawH2(t, func(s *rawStream) {
		switch s.path {
		case "/trailers-only":
			s.headers(true, ":status", "200", "content-type", "application/grpc", "grpc-status", "5")
		case "/204":
			s.headers(true, ":status", "204")
		case "/head":
			s.headers(true, ":status", "200", "content-length", "1234")
		default:
			s.headers(false, ":status", "200", "content-type", "text/plain")
			s.data(true, []byte("ok"))
		}
	})
	owner, client := h2Pair(t, up.url)
	key := mustKey(t, owner.tr, up.url)
	for _, path := range []string{"/trailers-only", "/204", "/head"} {
		for _, m := range []*member{owner, client} {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			req := grpcReq(t, ctx, up.url+path, http.NoBody)
			wantLength := int64(0)
			if path == "/head" {
				req.Method, wantLength = http.MethodHead, 1234
			}
			resp, err := m.tr.RoundTrip(req)
			if err != nil {
				cancel()
				t.Fatalf("%s: %v", path, err)
			}
			if resp.ContentLength != wantLength {
				t.Errorf("%s, local %v: ContentLength %d, want %d", path, m == owner, resp.ContentLength, wantLength)
			}
			deadline := time.Now().Add(time.Second)
			for {
				c, _ := owner.pool.Candidates(key, nil)
				if len(c) == 1 && c[0].InUse == 0 && c[0].Pending == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("%s, local %v: the stream's unit is still in use with the response over upstream: %+v", path, m == owner, c)
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			resp.Body.Close()
			cancel()
		}
	}
	capacityBack(t, owner, up.url)
}
