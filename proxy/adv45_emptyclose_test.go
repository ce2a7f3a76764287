package proxy

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// TestAdv45EmptyAnswerClosedUnreadKeepsStream: net/http's own HTTP/2
// server answers an empty handler with HEADERS carrying END_STREAM and
// "content-length: 0", the commonest empty answer there is. x/net/http2
// gives it length 0 and a body that is already done; a caller that closes
// it without reading (as callers do for an empty answer) costs nothing, on
// the owner's own exchange either. Since 80e757b the relay takes any
// declared length 0 of an HTTP/2 answer for a body (x/net's noBody is not
// http.NoBody, so "ended with its head" is never seen), the sibling makes
// it a body that must be read to EOF, and Close before that tears the unix
// stream down: every such exchange through a sibling costs a new stream to
// the owner, where before the commit (and for HTTP/1.1 upstreams) the
// stream goes back to the idle pool.
func TestAdv45EmptyAnswerClosedUnreadKeepsStream(t *testing.T) {
	up := newH2CServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/" {
			w.Write([]byte("ok"))
		}
	})
	owner, client := h2Pair(t, up.url)
	ref := refH2C()
	defer ref.CloseIdleConnections()
	req, _ := http.NewRequest("GET", up.url+"/empty", nil)
	resp, err := ref.RoundTrip(req)
	if err != nil || resp.ContentLength != 0 || resp.Header.Get("Content-Length") != "0" {
		t.Fatalf("x/net: %v %+v; the reference itself changed", err, resp)
	}
	resp.Body.Close()

	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/empty", nil)
		resp, err := client.tr.RoundTrip(req)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		if resp.StatusCode != 200 || resp.ContentLength != 0 {
			t.Errorf("%d: status %d length %d", i, resp.StatusCode, resp.ContentLength)
		}
		resp.Body.Close()
		cancel()
		var idle int
		for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			if idle = client.node.Stats().IdlePeerConns; idle > 0 {
				break
			}
		}
		if idle == 0 {
			t.Errorf("%d: an empty answer closed unread left no idle unix stream to the owner (body %T): the stream was torn down", i, resp.Body)
		}
	}
	if st := client.node.Stats(); st.ReusedRemote < 3 {
		t.Errorf("the sibling's requests did not go through the owner (%+v)", st)
	}
	capacityBack(t, owner, up.url)
}
