package proxy

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// adv69bPanicBody panics on its first Read.
type adv69bPanicBody struct{}

func (adv69bPanicBody) Read([]byte) (int, error) { panic("adv69b body") }
func (adv69bPanicBody) Close() error             { return nil }

// adv69bChurn sends one random request outside the full table: plain,
// stray bytes, dropped, Connection: close, cancelled mid-body, a body that
// panics, a short deadline.
func adv69bChurn(tr *Transport, url string, r *rand.Rand) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var req *http.Request
	switch r.IntN(8) {
	case 0:
		req, _ = http.NewRequestWithContext(ctx, "GET", url+"/conn", nil)
	case 1:
		req, _ = http.NewRequestWithContext(ctx, "GET", url+"/stray", nil)
	case 2:
		req, _ = http.NewRequestWithContext(ctx, "GET", url+"/drop", nil)
	case 3:
		req, _ = http.NewRequestWithContext(ctx, "GET", url+"/close", nil)
	case 4:
		req, _ = http.NewRequestWithContext(ctx, "GET", url+"/big", nil)
		d := time.Duration(r.IntN(2000)) * time.Microsecond
		go func() {
			time.Sleep(d)
			cancel()
		}()
	case 5:
		req, _ = http.NewRequestWithContext(ctx, "POST", url+"/x", adv69bPanicBody{})
		req.ContentLength = 10
	case 6:
		c2, cancel2 := context.WithTimeout(ctx, time.Duration(r.IntN(3000))*time.Microsecond)
		defer cancel2()
		req, _ = http.NewRequestWithContext(c2, "GET", url+"/big", nil)
	default:
		req, _ = http.NewRequestWithContext(ctx, "POST", url+"/x", strings.NewReader("hello"))
	}
	func() {
		defer func() { recover() }()
		resp, err := tr.RoundTrip(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
}

// TestAdv69bSpareAccountingChurn: many concurrent requests outside a full
// table, with stray bytes, drops, cancellations, panicking bodies, deadlines,
// CloseIdleConnections and a fast sweep all racing: afterwards the dial
// admission count equals the connections held plus the spares, never went
// negative, and after Close it is zero and the upstream sees every
// connection closed.
func TestAdv69bSpareAccountingChurn(t *testing.T) {
	for _, mode := range adv69bModes() {
		t.Run(mode.name, func(t *testing.T) {
			release := make(chan struct{})
			rel := sync.OnceFunc(func() { close(release) })
			defer rel()
			up, tc := newAdv69bUpstream(t, mode.useTLS, adv69bAnswer(release))
			m := newMemberOpts(t, adv69bSpec, NodeOptions{SweepInterval: 3 * time.Millisecond}, func(tr *Transport) {
				tr.TLSClientConfig = tc
				tr.IdleConnTimeout = 20 * time.Millisecond
			})
			drainHeld := adv69bHold(t, m.tr, up.url, 2)

			stop := make(chan struct{})
			var neg sync.WaitGroup
			negative := make(chan int64, 1)
			neg.Add(1)
			go func() {
				defer neg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if o := m.node.open.Load(); o < 0 {
						select {
						case negative <- o:
						default:
						}
					}
					time.Sleep(200 * time.Microsecond)
				}
			}()
			var wg sync.WaitGroup
			for g := range 6 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(g), 7))
					for range 40 {
						adv69bChurn(m.tr, up.url, r)
						if r.IntN(10) == 0 {
							m.tr.CloseIdleConnections()
						}
					}
				}()
			}
			wg.Wait()
			close(stop)
			neg.Wait()
			select {
			case o := <-negative:
				t.Fatalf("n.open went negative: %d", o)
			default:
			}
			// Every exchange has ended (give the body writers and aborts a moment).
			waitFor(t, 3*time.Second, "the count to settle at held + spares", func() bool {
				return int(m.node.open.Load()) == 2+m.node.spares.len()
			})
			assertAdv69bOpen(t, m, 2)
			rel()
			drainHeld()
			m.node.Close()
			if o, sp := m.node.open.Load(), m.node.spares.len(); o != 0 || sp != 0 {
				t.Fatalf("after Close: n.open %d, %d spares; want none", o, sp)
			}
			waitFor(t, 3*time.Second, "the upstream to see every connection closed", func() bool { return up.open() == 0 })
		})
	}
}

// TestAdv69bSpareCloseRace: requests outside a full table keep going while
// Close (or Shutdown) runs: when they have all ended no spare is left, the
// count is zero, and the upstream sees every connection closed; a request
// after Close fails with ErrClosed, at once.
func TestAdv69bSpareCloseRace(t *testing.T) {
	for _, shutdown := range []bool{false, true} {
		name := "close"
		if shutdown {
			name = "shutdown"
		}
		t.Run(name, func(t *testing.T) {
			for round := range 5 {
				release := make(chan struct{})
				up, _ := newAdv69bUpstream(t, false, adv69bAnswer(release))
				m := newMemberOpts(t, adv69bSpec, NodeOptions{SweepInterval: time.Millisecond}, nil)
				func() {
					defer close(release)
					adv69bHold(t, m.tr, up.url, 2)
					var wg sync.WaitGroup
					for g := range 4 {
						wg.Add(1)
						go func() {
							defer wg.Done()
							for i := range 30 {
								ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
								p := "/conn"
								if (g+i)%3 == 0 {
									p = "/x"
								}
								req, _ := http.NewRequestWithContext(ctx, "GET", up.url+p, nil)
								resp, err := m.tr.RoundTrip(req)
								if err == nil {
									io.Copy(io.Discard, resp.Body)
									resp.Body.Close()
								}
								cancel()
							}
						}()
					}
					time.Sleep(time.Duration(1+round*2) * time.Millisecond)
					if shutdown {
						ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
						m.node.Shutdown(ctx)
						cancel()
					} else {
						m.node.Close()
					}
					wg.Wait()
				}()
				if sp := m.node.spares.len(); sp != 0 {
					t.Fatalf("round %d: %d spares after Close and every request ended", round, sp)
				}
				waitFor(t, 3*time.Second, "n.open to reach 0", func() bool { return m.node.open.Load() == 0 })
				waitFor(t, 3*time.Second, "the upstream to see every connection closed", func() bool { return up.open() == 0 })
				start := time.Now()
				_, _, err := adv69bDo(t, m.tr, "GET", up.url+"/conn", "")
				if !errors.Is(err, ErrClosed) || time.Since(start) > time.Second {
					t.Fatalf("round %d: a request after Close: %v after %v; want ErrClosed at once", round, err, time.Since(start))
				}
			}
		})
	}
}
