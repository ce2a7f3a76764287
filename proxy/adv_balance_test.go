package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// lingerUpstream is a keep-alive HTTP/1.1 upstream that, when its client
// half-closes, keeps its side open for linger before closing (as an upstream
// behind a load balancer, or across a WAN, is seen to do by the client: the
// FIN takes a round trip). It counts open connections and their peak.
type lingerUpstream struct {
	ln                  net.Listener
	url                 string
	open, peak, refused atomic.Int64
	max                 int64 // if > 0, connections past max open are closed at once
	wg                  sync.WaitGroup
}

func startLingerUpstream(t *testing.T, linger, delay time.Duration) *lingerUpstream {
	return startLingerUpstreamMax(t, linger, delay, 0)
}

func startLingerUpstreamMax(t *testing.T, linger, delay time.Duration, max int64) *lingerUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &lingerUpstream{ln: ln, url: "http://" + ln.Addr().String(), max: max}
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if u.max > 0 && u.open.Load() >= u.max {
				u.refused.Add(1)
				c.Close()
				continue
			}
			o := u.open.Add(1)
			for {
				p := u.peak.Load()
				if o <= p || u.peak.CompareAndSwap(p, o) {
					break
				}
			}
			u.wg.Add(1)
			go func() {
				defer u.wg.Done()
				// Uncounted before the close the client waits for.
				defer c.Close()
				defer u.open.Add(-1)
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						if err == io.EOF {
							time.Sleep(linger)
						}
						return
					}
					io.Copy(io.Discard, req.Body)
					if delay > 0 {
						time.Sleep(delay)
					}
					if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		u.wg.Wait()
	})
	return u
}

// TestAdvBalanceOvershootWhileRetiring: a process holding all four of a
// capped key's connections, a sibling with the same demand waiting, an
// upstream that closes its side linger after the client's. Two moves
// ([4 0] -> [3 1] -> [2 2]) settle it. A connection that moves used to keep
// its capacity and its registration until the upstream's close arrived, so
// Neediest still counted it as the mover's, Live still showed the cap, and
// every 64th use in that time moved one more toward the same sibling: the
// mover overshot, then the sibling did, and so on (40 to 100 moves). Now one
// connection per key moves at a time, and a moving one does not count.
//
// The load runs without a pause, so that the sibling always has a waiter
// for the unit to go to.
func TestAdvBalanceOvershootWhileRetiring(t *testing.T) {
	for _, linger := range []time.Duration{150 * time.Millisecond, 10 * time.Millisecond, 0} {
		t.Run(linger.String(), func(t *testing.T) { testOvershoot(t, linger) })
	}
}

func testOvershoot(t *testing.T, linger time.Duration) {
	const limit = 4
	// A delay keeps the first process's eight goroutines on all four
	// connections.
	up := startLingerUpstream(t, linger, time.Millisecond)
	ms := windowFleet(t, 2, 16, func(tr *Transport) { tr.MaxConnsPerKey = limit })
	errs := steadyLoad(ms, []int{2 * limit, 0}, up.url+"/", 50*limit)
	_, _, start := ownership(ms)
	if start[0] < limit-1 {
		t.Fatalf("first process holds %v, want %d", start, limit)
	}
	// From [a 0], a/2 moves even it out; each lowers the sum of squares.
	// Twice that, and two more, allows for wasted moves
	// (TestAdvMovesSmallWindow), of which a machine loaded well past its
	// cores makes more: one run of the CI command beside other test runs
	// made 5 from [4 0]. The overshoot this test is about made 40 to 100.
	maxMoves := uint64(start[0]) + 2
	var stop atomic.Bool
	done := make(chan int64)
	go func() { done <- loadUntil(ms, []int{limit, limit}, up.url+"/", &stop) }()
	time.Sleep(1500 * time.Millisecond)
	half, _, _ := ownership(ms)
	time.Sleep(750 * time.Millisecond)
	stop.Store(true)
	errs += <-done
	moved, created, owned := ownership(ms)
	if moved > maxMoves || moved != half {
		t.Errorf("from %v: %d moves in all (want at most %d), %d in the last 750ms (want 0); held %v, %d connections created",
			start, moved, maxMoves, moved-half, owned, created)
	}
	if errs != 0 || up.peak.Load() > limit {
		t.Errorf("%d requests failed; upstream peak %d connections (cap %d)", errs, up.peak.Load(), limit)
	}
}

// loadUntil is steadyLoad until stop is set.
func loadUntil(ms []*member, goroutines []int, url string, stop *atomic.Bool) int64 {
	var errs atomic.Int64
	var wg sync.WaitGroup
	for i, m := range ms {
		for range goroutines[i] {
			wg.Go(func() {
				for !stop.Load() {
					if err := getBody(context.Background(), m.tr, url); err != nil {
						errs.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	return errs.Load()
}

// TestAdvMoveFailsRequests: the upstream enforces the fleet's cap of 4 and
// takes 300ms to close a connection its client half-closed (more than
// closeWait). Without moves (one process holds all four and its sibling
// reuses them through leases) no request fails. A move turns a sibling's
// reuse into a dial, which the upstream refused while the moved connection
// was still open on its side, after closeWait: 358 to 683 requests failed.
// A move now holds its unit until the upstream has closed (moveCloseWait),
// and one that took longer than closeWait stops the key's moves.
func TestAdvMoveFailsRequests(t *testing.T) {
	for _, window := range []uint32{0, 16} {
		t.Run(fmt.Sprint("window ", window), func(t *testing.T) {
			const limit = 4
			up := startLingerUpstreamMax(t, 300*time.Millisecond, 200*time.Microsecond, limit)
			ms := windowFleet(t, 2, window, func(tr *Transport) { tr.MaxConnsPerKey = limit })
			errs := steadyLoad(ms, []int{2 * limit, 0}, up.url+"/", 50*limit)
			_, _, start := ownership(ms)
			errs += steadyLoad(ms, []int{limit, limit}, up.url+"/", 3000)
			moved, created, owned := ownership(ms)
			t.Logf("from %v: %d moves, %d created, held %v; upstream refused %d", start, moved, created, owned, up.refused.Load())
			if errs != 0 {
				t.Errorf("%d requests failed (%d moves; the upstream refused %d connections)", errs, moved, up.refused.Load())
			}
			if moved > 1 {
				t.Errorf("%d moves: the first found the upstream slow to close, and should have been the last", moved)
			}
		})
	}
}
