package proxy

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestAdv75cHangUpFreesOwner: a caller with no deadline uploads an endless
// body through the owner to an upstream that never reads it (the owner's
// writer blocks upstream, in the body phase), then gives up (cancel). The
// owner must end the exchange by itself within a bounded time (the
// hang-up poll; no deadline exists to do it), and then serve the next
// sibling request through the sibling again.
func TestAdv75cHangUpFreesOwner(t *testing.T) {
	arrived := make(chan struct{}, 4)
	u := newAdv10Upstream(t, false, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
		if req.URL.Path == "/sink" {
			arrived <- struct{}{}
			<-t.Context().Done()
			return false
		}
		return adv10Fresh(c, req, conn, n)
	})
	owner, client := remotePair(t, u.conf(nil))
	warm(t, owner, u.url("/warm"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body := &adv75aEndless{}
	req, _ := http.NewRequestWithContext(ctx, "POST", u.url("/sink"), body)
	req.ContentLength = -1
	done := make(chan error, 1)
	go func() {
		resp, err := client.tr.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("upload never reached the upstream")
	}
	waitFor(t, 10*time.Second, "owner serving the upload", func() bool { return owner.node.srv.active.Load() == 1 })
	time.Sleep(200 * time.Millisecond) // buffers fill; the writer blocks upstream
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("cancelled upload succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("RoundTrip did not return after cancel")
	}
	start := time.Now()
	waitFor(t, 5*time.Second, "owner ending the exchange whose caller hung up", func() bool { return owner.node.srv.active.Load() == 0 })
	t.Logf("owner ended it %v after the caller returned", time.Since(start))
	served := owner.node.Stats().ServedRemote
	warm(t, owner, u.url("/warm2"))
	resp, err := client.tr.RoundTrip(adv75cReq(t, "GET", u.url("/after")))
	if err != nil {
		t.Fatalf("request after the hang-up: %v", err)
	}
	drain(resp)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d after the hang-up", resp.StatusCode)
	}
	if owner.node.Stats().ServedRemote <= served {
		t.Fatalf("next request did not go through the sibling: %+v", owner.node.Stats())
	}
}

func adv75cReq(t *testing.T, method, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}
