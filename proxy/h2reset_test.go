package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/internal/h2frame"
	"golang.org/x/net/http2"
)

// idlePeerStreams is how many idle unix streams m keeps to its siblings.
func idlePeerStreams(m *member) int {
	m.node.peers.mu.Lock()
	defer m.node.peers.mu.Unlock()
	n := 0
	for _, l := range m.node.peers.idle {
		n += len(l)
	}
	return n
}

// TestH2UpstreamResetMidBodyThroughSibling: an upstream that resets a
// stream (RST_STREAM INTERNAL_ERROR) after the head and part of the body
// gives a sibling's reader the same as the owner's: the part of the body,
// then http2.StreamError with the upstream's code, received from the peer.
// The unix stream stays in step and is used again, and the upstream keeps
// its one connection.
func TestH2UpstreamResetMidBodyThroughSibling(t *testing.T) {
	up := h2frame.New(t, 100, time.Millisecond)
	owner, client := remotePair(t, h2cConf)
	if err := getOK(owner, context.Background(), up.URL+"/"); err != nil {
		t.Fatal(err)
	}
	outcome := func(m *member) (string, error) {
		req, _ := http.NewRequest("GET", up.URL+"/reset-body", nil)
		resp, err := m.tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("local %v: %v", m == owner, err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 || resp.ProtoMajor != 2 || resp.ContentLength != 100 {
			t.Errorf("local %v: %s %d length %d", m == owner, resp.Proto, resp.StatusCode, resp.ContentLength)
		}
		b, err := io.ReadAll(resp.Body)
		if _, ok := resp.Trailer[streamResetTrailer]; ok {
			t.Errorf("local %v: the unix leg's trailer reached the caller: %v", m == owner, resp.Trailer)
		}
		return string(b), err
	}
	for i := range 3 {
		for _, m := range []*member{owner, client} {
			body, err := outcome(m)
			var se http2.StreamError
			if body != "partial" || !errors.As(err, &se) || se.Code != http2.ErrCodeInternal || se.Cause == nil || se.Cause.Error() != "received from peer" {
				t.Errorf("call %d, local %v: body %q, error %#v; want \"partial\" and the upstream's INTERNAL_ERROR", i, m == owner, body, err)
			}
		}
		// The next call through the sibling reuses the one unix stream.
		if n := idlePeerStreams(client); n != 1 {
			t.Errorf("call %d: %d idle unix streams after the reset, want the one kept", i, n)
		}
		if err := getOK(client, context.Background(), up.URL+"/"); err != nil {
			t.Fatalf("call after the reset through the sibling: %v", err)
		}
	}
	if owner.node.Stats().ServedRemote < 6 {
		t.Errorf("owner served %d of the sibling's requests, want 6", owner.node.Stats().ServedRemote)
	}
	if c, _, _, v := up.Stats(); c != 1 || len(v) != 0 {
		t.Errorf("upstream: %d connections, violations %v; want the one connection", c, v)
	}
}

// TestH2UpstreamTrailerNamedLikeResetIsDropped: an HTTP/2 upstream's own
// trailer of the unix leg's reserved name does not turn a complete body
// into an error through a sibling; it is dropped, the other trailers pass.
func TestH2UpstreamTrailerNamedLikeResetIsDropped(t *testing.T) {
	up := newH2Upstream(t, 100)
	owner, client := remotePair(t, h2cConf)
	warmH2(t, owner, up.url)
	req := grpcReq(t, context.Background(), up.url+"/reset-trailer", http.NoBody)
	resp, err := client.tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(b) != "done" || resp.Trailer.Get("Grpc-Status") != "0" || resp.Trailer.Get(streamResetTrailer) != "" {
		t.Errorf("body %q, error %v, trailers %v; want \"done\", no error, grpc-status 0 only", b, err, resp.Trailer)
	}
	if owner.node.Stats().ServedRemote != 1 {
		t.Errorf("owner served %d of the sibling's requests, want 1", owner.node.Stats().ServedRemote)
	}
}
