package proxy

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// adv73bStallListener counts the upstream's open TCP connections (its view
// of the fleet's cap). While stall is set it keeps each new connection to
// itself, never answering (a TLS handshake that hangs: the dialing process
// holds its creation permit), until the peer closes it, then keeps it open
// linger longer (as an upstream slow to notice) before closing.
type adv73bStallListener struct {
	net.Listener
	stall                  atomic.Bool
	linger                 time.Duration
	open, peak             atomic.Int64 // every connection
	served, servedPeak     atomic.Int64 // those handed to the server
	stashed, stashedEnded  atomic.Int64
	wg                     sync.WaitGroup
	firstServed, lastEnded atomic.Int64 // unix ns
	servedTotal            atomic.Int64
}

func adv73bMax(p *atomic.Int64, n int64) {
	for {
		v := p.Load()
		if n <= v || p.CompareAndSwap(v, n) {
			return
		}
	}
}

func (l *adv73bStallListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		adv73bMax(&l.peak, l.open.Add(1))
		if l.stall.Load() {
			l.stashed.Add(1)
			l.wg.Go(func() {
				io.Copy(io.Discard, c)
				time.Sleep(l.linger)
				l.open.Add(-1)
				l.stashedEnded.Add(1)
				l.lastEnded.Store(time.Now().UnixNano())
				c.Close()
			})
			continue
		}
		adv73bMax(&l.servedPeak, l.served.Add(1))
		l.servedTotal.Add(1)
		l.firstServed.CompareAndSwap(0, time.Now().UnixNano())
		return &countedConn{Conn: c, closed: func() { l.open.Add(-1); l.served.Add(-1) }}, nil
	}
}

// TestAdv73bKilledInDialHoldingPermits: cap C of a key over TLS. A child
// process dials all C of the key's connections and is SIGKILLed while the
// TLS handshakes hang (it holds C creation permits; the upstream holds C
// TCP connections, which it keeps 1.5s after their peer went away). Two
// surviving members each have C requests waiting from before the kill.
// Properties: the upstream never holds more than C connections at once
// (counting the dead process's); every survivor request succeeds; the
// survivors get the whole cap back (C connections at once) and finish
// within 6s of the kill.
func TestAdv73bKilledInDialHoldingPermits(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	const C = 3
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		time.Sleep(time.Duration(ms) * time.Millisecond)
		io.WriteString(w, "ok")
	}))
	sl := &adv73bStallListener{Listener: srv.Listener, linger: 1500 * time.Millisecond}
	sl.stall.Store(true)
	srv.Listener = sl
	srv.StartTLS()
	t.Cleanup(func() {
		srv.Close()
		sl.wg.Wait()
	})
	seg := filepath.Join(t.TempDir(), "seg")
	dead := startAdv73bChild(t, seg, C)
	conf := func(tr *Transport) {
		tr.MaxConnsPerKey = C
		tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} // the child's: one key
	}
	a, b := adv73bMember(t, seg, 0, conf), adv73bMember(t, seg, 0, conf)

	dead.send(t, "fire "+strconv.Itoa(C)+" "+srv.URL+"/?ms=10")
	dead.expect(t, "fired")
	waitFor(t, 5*time.Second, "the child's dials to reach the upstream", func() bool { return sl.stashed.Load() == C })

	type result struct {
		err error
		at  time.Time
	}
	done := make(chan result, 2*C)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, m := range []*member{a, b} {
		for i := range C {
			go func() {
				req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("%s/?ms=300&i=%d", srv.URL, i), nil)
				resp, err := m.tr.RoundTrip(req)
				if err == nil {
					var body []byte
					body, err = io.ReadAll(resp.Body)
					resp.Body.Close()
					if err == nil && string(body) != "ok" {
						err = fmt.Errorf("body %q", body)
					}
				}
				done <- result{err, time.Now()}
			}()
		}
	}
	time.Sleep(300 * time.Millisecond)
	if n := sl.stashed.Load(); n != C {
		t.Fatalf("while the child holds the cap's %d permits in its dials, %d connections were dialed (survivors dialed past the cap)", C, n)
	}
	sl.stall.Store(false)
	killedAt := time.Now()
	dead.kill(t)

	for range 2 * C {
		select {
		case r := <-done:
			if r.err != nil {
				t.Errorf("a survivor's request failed %v after the kill (retry-safe %v): %v",
					r.at.Sub(killedAt).Round(time.Millisecond), IsRetrySafe(r.err), r.err)
			} else if d := r.at.Sub(killedAt); d > 6*time.Second {
				t.Errorf("a survivor's request ended %v after the kill", d)
			}
		case <-time.After(12 * time.Second):
			t.Fatalf("survivors' requests hung after the kill: dead process's permits never reclaimed (stashed %d, ended %d, open %d)",
				sl.stashed.Load(), sl.stashedEnded.Load(), sl.open.Load())
		}
	}
	if p := sl.peak.Load(); p > C {
		t.Errorf("the upstream held %d connections at once, cap %d: the survivors dialed %v after the kill, the upstream let go of the dead process's at %v",
			p, C, time.Unix(0, sl.firstServed.Load()).Sub(killedAt).Round(time.Millisecond), time.Unix(0, sl.lastEnded.Load()).Sub(killedAt).Round(time.Millisecond))
	}
	if p := sl.servedPeak.Load(); p != C {
		t.Errorf("survivors used at most %d connections at once with %d requests of 300ms waiting, want the whole cap %d", p, 2*C, C)
	}
}
