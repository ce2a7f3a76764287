package proxy

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// TestH2HeaderLimitAsStock: a response head from an HTTP/2 upstream is
// bounded as net/http's HTTP/2 client bounds it under the same
// MaxResponseHeaderBytes, which stock Caddy sets from
// max_response_header_size: by the limit plus an allowance of 320 bytes for
// HPACK's per-field overhead. Orbit's HTTP/2 connections advertised the
// limit itself, and refused on the owner and through a sibling a head that
// stock passed.
func TestH2HeaderLimitAsStock(t *testing.T) {
	const limit = 16 << 10
	up := newRawH2(t, func(s *rawStream) {
		over, _ := strconv.Atoi(strings.TrimPrefix(s.path, "/over/"))
		// HPACK counts a field as its name, its value and 32 bytes:
		// ":status: 200" is 42, "x-big" 37 and its value.
		s.bigHeaders(false, ":status", "200", "x-big", strings.Repeat("b", limit+over-42-37))
		s.data(true, []byte("ok"))
	})
	owner, client, ref := limitedH2Pair(t, up.url, limit)
	for _, over := range []int{100, 320, 321, 1000} {
		outs := eachH2PathVia(ref, owner, client, getVia(up.url+"/over/"+strconv.Itoa(over)))
		refused := over > 320
		if got := outs["x/net"]; (got.err != "") != refused || !refused && got.body != "ok" {
			t.Fatalf("a head %d bytes over the %d-byte limit: the reference changed: net/http's client got status %d body %q error %q",
				over, limit, got.status, got.body, got.err)
		}
		for _, name := range h2Paths[1:] {
			if got := outs[name]; (got.err != "") != refused || !refused && got.body != "ok" {
				t.Errorf("a head %d bytes over the %d-byte limit: %s got status %d body %q error %q; net/http's client: status %d error %q",
					over, limit, name, got.status, got.body, got.err, outs["x/net"].status, outs["x/net"].err)
			}
		}
	}
	// A head over the limit is the same failure as on HTTP/1.1, for a
	// caller of either path, and a sibling's error says it once.
	for name, rt := range map[string]http.RoundTripper{"owner": owner.tr, "sibling": client.tr} {
		req, _ := http.NewRequest("GET", up.url+"/over/321", nil)
		resp, err := rt.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
			t.Fatalf("%s: a head over the limit passed", name)
		}
		if !errors.Is(err, ErrHeaderTooLarge) || strings.Count(err.Error(), ErrHeaderTooLarge.Error()) != 1 {
			t.Errorf("%s: a head over the limit failed with %q; want ErrHeaderTooLarge, said once", name, err)
		}
	}
	if s := client.node.Stats(); s.ReusedRemote == 0 {
		t.Errorf("the sibling's request did not go through the owner: %+v", s)
	}
}

// TestH2HeaderListSizeAdvertisedAsStock: the header list size orbit's
// HTTP/2 connections advertise (and enforce, as x/net enforces what it
// advertises) is stock's client's, with no MaxResponseHeaderBytes (x/net's
// 10 MiB, as Caddy's transports run unless max_response_header is set) and
// with one (the limit and its allowance).
func TestH2HeaderListSizeAdvertisedAsStock(t *testing.T) {
	advertised := func(rt http.RoundTripper) uint32 {
		t.Helper()
		up := newRawH2(t, func(s *rawStream) {
			s.headers(false, ":status", "200", "content-length", "2")
			s.data(true, []byte("ok"))
		})
		req, _ := http.NewRequest("GET", up.url+"/", nil)
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		up.mu.Lock()
		defer up.mu.Unlock()
		if len(up.raws) != 1 {
			t.Fatalf("%d connections, want 1", len(up.raws))
		}
		return up.raws[0].headerListSize.Load()
	}
	for _, limit := range []int64{0, 16 << 10, 1 << 20} {
		ref := stockH2C(t, 0)
		ref.MaxResponseHeaderBytes = limit
		tr := localTransport(t, func(tr *Transport) { h2cConf(tr); tr.MaxResponseHeaderBytes = limit })
		want, got := advertised(ref), advertised(tr)
		if want == 0 {
			t.Fatalf("limit %d: stock's client advertised no header list size", limit)
		}
		if got != want {
			t.Errorf("limit %d: orbit advertised a header list size of %d, stock's client %d", limit, got, want)
		}
	}
}
