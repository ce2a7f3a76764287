package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/orbitproxy/orbit/internal/grpcmsg"
)

// TestRequestTrailersWithLengthThroughSibling: a request that declares both
// a Content-Length and trailers reaches an HTTP/2 upstream through a sibling
// as it does locally: with its length and its trailers. To an HTTP/1.1
// upstream it goes with its length, and without trailers, locally and
// remotely alike (HTTP/1.1 carries trailers only in a chunked body, and
// net/http sends the declared length).
func TestRequestTrailersWithLengthThroughSibling(t *testing.T) {
	body := grpcmsg.Frame([]byte("with a length"))
	newReq := func(t *testing.T, url string) *http.Request {
		req := grpcReq(t, context.Background(), url, bytes.NewReader(body))
		req.Trailer = http.Header{"X-Req-Trailer": {"declared"}}
		if req.ContentLength != int64(len(body)) {
			t.Fatalf("request ContentLength %d", req.ContentLength)
		}
		return req
	}
	t.Run("h2c", func(t *testing.T) {
		up := newH2Upstream(t, 100)
		owner, client := remotePair(t, h2cConf)
		warmH2(t, owner, up.url)
		for _, m := range []*member{owner, client} {
			resp, err := m.tr.RoundTrip(newReq(t, up.url+"/len"))
			if err != nil {
				t.Fatal(err)
			}
			p, err := grpcmsg.Read(resp.Body)
			drain(resp)
			if err != nil || string(p) != fmt.Sprint(len(body)) {
				t.Errorf("local %v: upstream saw ContentLength %q (%v), want %d", m == owner, p, err, len(body))
			}
			if got := resp.Trailer.Get("X-Got-Trailer"); got != "declared" {
				t.Errorf("local %v: upstream saw request trailer %q, want %q", m == owner, got, "declared")
			}
		}
		if s := client.node.Stats(); s.ReusedRemote != 1 {
			t.Fatalf("client stats %+v: want the request through the owner", s)
		}
	})
	t.Run("http1", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n, _ := io.Copy(io.Discard, r.Body)
			fmt.Fprintf(w, "length %d te %v read %d trailer %v", r.ContentLength, r.TransferEncoding, n, r.Trailer)
		}))
		t.Cleanup(srv.Close)
		owner, client := remotePair(t, nil)
		var got []string
		for _, m := range []*member{owner, client} {
			resp, err := m.tr.RoundTrip(newReq(t, srv.URL+"/"))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			got = append(got, string(b))
		}
		want := fmt.Sprintf("length %d te [] read %d trailer map[]", len(body), len(body))
		if got[0] != want || got[1] != want {
			t.Errorf("upstream saw, locally %q and through the sibling %q; want both %q", got[0], got[1], want)
		}
		if s := client.node.Stats(); s.ReusedRemote != 1 {
			t.Fatalf("client stats %+v: want the request through the owner", s)
		}
	})
}
