package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv74aCloseMidRelayPost: a client relays an unreplayable POST
// (RelayUnreplayable) through the owner's connection; the upstream reads
// it whole and answers 400ms later. The client's Node closes (or shuts
// down) mid-exchange. Properties: the request ends soon after; the upstream
// saw the POST exactly once; an error is not retry-safe (the upstream saw
// it); the client's counts settle.
func TestAdv74aCloseMidRelayPost(t *testing.T) {
	for _, how := range []string{"close", "shutdown"} {
		t.Run(how, func(t *testing.T) {
			var saw atomic.Int32
			entered := make(chan struct{}, 1)
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				if r.Method == "POST" {
					saw.Add(1)
					select {
					case entered <- struct{}{}:
					default:
					}
					time.Sleep(400 * time.Millisecond)
				}
				io.WriteString(w, "ok")
			}))
			t.Cleanup(up.Close)
			ms := newFleet(t, 2, func(tr *Transport) { tr.RelayUnreplayable = true; tr.MaxConnsPerKey = 1 })
			owner, client := ms[0], ms[1]
			warm(t, owner, up.URL)
			type res struct {
				err  error
				body string
				at   time.Time
			}
			done := make(chan res, 1)
			go func() {
				ctx, cancel := contextWithTimeout(5 * time.Second)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, "POST", up.URL+"/p", strings.NewReader("payload"))
				resp, err := client.tr.RoundTrip(req)
				var b []byte
				if err == nil {
					b, err = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				done <- res{err, string(b), time.Now()}
			}()
			select {
			case <-entered:
			case <-time.After(3 * time.Second):
				t.Fatalf("the POST never reached the upstream")
			}
			if client.node.Stats().ReusedRemote != 1 {
				t.Fatalf("setup: the POST did not go through the owner: %+v", client.node.Stats())
			}
			start := time.Now()
			client.leave(how)
			var r res
			select {
			case r = <-done:
			case <-time.After(3 * time.Second):
				t.Fatalf("the POST had not ended 3s after %s", how)
			}
			if d := r.at.Sub(start); d > time.Second {
				t.Errorf("the POST ended %v after %s", d.Round(time.Millisecond), how)
			}
			time.Sleep(500 * time.Millisecond) // past the upstream's answer
			if n := saw.Load(); n != 1 {
				t.Errorf("the upstream saw the POST %d times", n)
			}
			if r.err != nil && IsRetrySafe(r.err) {
				t.Errorf("error %v is retry-safe, though the upstream saw the POST", r.err)
			}
			if r.err == nil && r.body != "ok" {
				t.Errorf("body %q", r.body)
			}
			t.Logf("%s: err %v", how, r.err)
			if o, h := adv70Counted(client); o != 0 || h != 0 {
				t.Errorf("after %s: n.open %d, held %d", how, o, h)
			}
		})
	}
}
