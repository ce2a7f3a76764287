package proxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"testing"
	"time"
)

// TestAdv23H2Status101IsNotAnUpgradeForSibling: an HTTP/2 upstream sends a
// 101 (which HTTP/2 does not have) before its 200. x/net hands it to the
// request's Got1xxResponse, as any 1xx, and goes on to the 200, which a
// local exchange returns. The owner's relay wrote it onto the unix leg as an
// interim head, "HTTP/1.1 101", which the sibling, reading HTTP/1.1, takes
// for the final answer: an upgrade, with the owner's framing of the real
// 200 as the tunnel's bytes.
func TestAdv23H2Status101IsNotAnUpgradeForSibling(t *testing.T) {
	up := newRawH2(t, func(s *rawStream) {
		s.headers(false, ":status", "101", "upgrade", "websocket", "connection", "upgrade")
		s.headers(false, ":status", "200", "content-length", "2")
		s.data(true, []byte("ok"))
	})
	owner, client := remotePair(t, h2cConf)

	get := func(m *member) (int, string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
			Got1xxResponse: func(int, textproto.MIMEHeader) error { return nil },
		})
		req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/", nil)
		resp, err := m.tr.RoundTrip(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		done := make(chan struct{})
		var b []byte
		go func() { b, _ = io.ReadAll(io.LimitReader(resp.Body, 4096)); close(done) }()
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			resp.Body.Close()
			<-done
		}
		return resp.StatusCode, string(b), nil
	}
	code, body, err := get(owner)
	if err != nil || code != 200 || body != "ok" {
		t.Fatalf("local exchange: %d %q %v, want 200 \"ok\" as x/net returns it", code, body, err)
	}
	code, body, err = get(client)
	if owner.node.Stats().ServedRemote == 0 {
		t.Fatal("the sibling's request did not go through the owner: the test shows nothing")
	}
	if err != nil || code != 200 || body != "ok" {
		t.Fatalf("sibling's exchange: %d %q %v, want 200 \"ok\" as the local exchange", code, body, err)
	}
}
