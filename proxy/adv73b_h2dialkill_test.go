package proxy

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"
)

// TestAdv73bH2DialerKilledMidHandshake: an https upstream speaking HTTP/2,
// cap 1: the fleet's requests wait for the one connection being dialed
// anywhere (MaxCreating 1). A child process is SIGKILLed while it dials
// that connection (its TLS handshake hangs), with 8 requests of two
// surviving members waiting for it; the upstream keeps the dead process's
// TCP connection 1.5s. Properties: the upstream never holds more than 1
// connection at once; every survivor request succeeds within 6s of the
// kill; the survivors make exactly one connection.
func TestAdv73bH2DialerKilledMidHandshake(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(50 * time.Millisecond)
		io.WriteString(w, "ok")
	}))
	sl := &adv73bStallListener{Listener: srv.Listener, linger: 1500 * time.Millisecond}
	sl.stall.Store(true)
	srv.Listener = sl
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(func() {
		srv.Close()
		sl.wg.Wait()
	})
	seg := filepath.Join(t.TempDir(), "seg")
	dead := startAdv73bChild(t, seg, 1, "ORBIT_HTTP2=1")
	conf := func(tr *Transport) {
		tr.MaxConnsPerKey = 1
		tr.HTTP2 = true
		tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} // the child's: one key
	}
	a, b := adv73bMember(t, seg, 0, conf), adv73bMember(t, seg, 0, conf)

	dead.send(t, "fire 3 "+srv.URL+"/")
	dead.expect(t, "fired")
	waitFor(t, 5*time.Second, "the child's dial to reach the upstream", func() bool { return sl.stashed.Load() == 1 })

	type result struct {
		err   error
		at    time.Time
		proto int
	}
	const n = 4
	done := make(chan result, 2*n)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, m := range []*member{a, b} {
		for i := range n {
			go func() {
				req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("%s/?i=%d", srv.URL, i), nil)
				resp, err := m.tr.RoundTrip(req)
				proto := 0
				if err == nil {
					proto = resp.ProtoMajor
					var body []byte
					body, err = io.ReadAll(resp.Body)
					resp.Body.Close()
					if err == nil && string(body) != "ok" {
						err = fmt.Errorf("body %q", body)
					}
				}
				done <- result{err, time.Now(), proto}
			}()
		}
	}
	time.Sleep(300 * time.Millisecond)
	if k := sl.stashed.Load(); k != 1 {
		t.Fatalf("while the child dials the key's one connection, %d were dialed", k)
	}
	sl.stall.Store(false)
	killedAt := time.Now()
	dead.kill(t)
	for range 2 * n {
		select {
		case r := <-done:
			if r.err != nil {
				t.Errorf("a survivor's request failed %v after the kill (retry-safe %v): %v",
					r.at.Sub(killedAt).Round(time.Millisecond), IsRetrySafe(r.err), r.err)
			} else if d := r.at.Sub(killedAt); d > 6*time.Second {
				t.Errorf("a survivor's request ended %v after the kill", d)
			} else if r.proto != 2 {
				t.Errorf("a survivor's request went over HTTP/%d", r.proto)
			}
		case <-time.After(12 * time.Second):
			t.Fatalf("survivors' requests hung after the kill (stashed %d ended %d, served peak %d)",
				sl.stashed.Load(), sl.stashedEnded.Load(), sl.servedPeak.Load())
		}
	}
	if p := sl.peak.Load(); p > 1 {
		t.Errorf("the upstream held %d connections at once, cap 1", p)
	}
	if total := sl.servedTotal.Load(); total != 1 {
		t.Errorf("survivors made %d connections, want 1", total)
	}
	if sp := sl.servedPeak.Load(); sp != 1 {
		t.Errorf("survivors held %d connections at once, want 1", sp)
	}
}
