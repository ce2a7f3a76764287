package proxy

import (
	"crypto/tls"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// adv74aOwe makes m owe a dial of u's key: relaysPerTLSDial relays through
// the owner's connection.
func adv74aOwe(t *testing.T, m *member, url string) {
	t.Helper()
	for i := range relaysPerTLSDial {
		if _, _, err := adv10Do(t, m.tr, "GET", url, nil); err != nil {
			t.Fatalf("relay %d: %v", i, err)
		}
	}
}

// adv74aStuckIn reports goroutines whose stack names any of fns.
func adv74aStuckIn(fns ...string) []string {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		for _, f := range fns {
			if strings.Contains(g, f) {
				out = append(out, g)
				break
			}
		}
	}
	return out
}

// TestAdv74aCloseMidPaidDial: a process owes a dial (relaysPerTLSDial
// relays), and the dial the relays paid for hangs in the TLS handshake
// (its request has 6s, so the paid dial has 3s). The process's Node closes
// mid-dial. Properties: the request ends soon after Close (not when the
// paid dial's half-time runs out), no goroutine of the transport's stays
// in the attempt, and the process's counts settle (nothing open, nothing
// dialing, the stalled handshake's socket closed).
func TestAdv74aCloseMidPaidDial(t *testing.T) {
	for _, how := range []string{"close", "shutdown"} {
		t.Run(how, func(t *testing.T) { adv74aCloseMidPaidDial(t, how) })
	}
}

func adv74aCloseMidPaidDial(t *testing.T, how string) {
	u := newStallingTLSUpstream(t)
	ms := newFleet(t, 2, func(tr *Transport) { tr.TLSClientConfig = &tls.Config{RootCAs: u.roots} })
	owner, client := ms[0], ms[1]
	warm(t, owner, u.url)
	adv74aOwe(t, client, u.url)
	type res struct {
		err error
		at  time.Time
	}
	done := make(chan res, 1)
	go func() {
		ctx, cancel := contextWithTimeout(6 * time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", u.url, nil)
		resp, err := client.tr.RoundTrip(req)
		if err == nil {
			drain(resp)
		}
		done <- res{err, time.Now()}
	}()
	waitFor(t, 3*time.Second, "the paid dial", func() bool { return u.accepted.Load() >= 2 })
	time.Sleep(50 * time.Millisecond)
	closed := time.Now()
	client.leave(how)
	var r res
	select {
	case r = <-done:
	case <-time.After(4 * time.Second):
		t.Fatalf("RoundTrip still running 4s after Close (stuck: %q)", adv74aStuckIn("(*Transport).once"))
	}
	if d := r.at.Sub(closed); d > time.Second {
		t.Errorf("%s: RoundTrip ended %v after it (err %v); want it to end soon after Close, not when the paid dial times out", how, d.Round(time.Millisecond), r.err)
	}
	waitFor(t, 3*time.Second, "the stalled handshake's socket to close", func() bool { return u.cur.Load() == 0 })
	if d := client.node.dialing.Load(); d != 0 {
		t.Errorf("node.dialing %d after Close and the request ended", d)
	}
	if o, h := adv70Counted(client); o != 0 || h != 0 {
		t.Errorf("after Close: n.open %d, held %d; want 0", o, h)
	}
	if g := adv74aStuckIn("(*Transport).once", "(*dialer).dial"); len(g) != 0 {
		t.Errorf("%d goroutines still in an attempt after Close:\n%s", len(g), strings.Join(g, "\n\n"))
	}
}

// TestAdv74aPaidDialsFleetDialCap: MaxDialingPerKey 1, and two processes
// each owe a dial of the key (relaysPerTLSDial relays each) to an upstream
// whose new connections hang in the handshake; the owner's one connection
// still serves. Both fire bursts of requests with short deadlines. Paid
// dials race for the one creation unit of the key across the fleet.
// Properties: at no instant does the upstream hold more than one hanging
// handshake (MaxDialingPerKey is fleet-wide); every request ends by its
// deadline plus a grace; afterwards nothing of the key is creating,
// waiting, pending or in use, and every process's counts match what it
// holds.
func TestAdv74aPaidDialsFleetDialCap(t *testing.T) {
	u := newStallingTLSUpstream(t)
	ms := newFleet(t, 3, func(tr *Transport) {
		tr.TLSClientConfig = &tls.Config{RootCAs: u.roots}
		tr.MaxDialingPerKey = 1
	})
	owner := ms[0]
	warm(t, owner, u.url)
	for round := range 2 {
		adv74aOwe(t, ms[1], u.url)
		adv74aOwe(t, ms[2], u.url)
		var wg sync.WaitGroup
		var ok, failed atomic.Int32
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				m := ms[1+w%2]
				d := time.Duration(300+100*w) * time.Millisecond
				ctx, cancel := contextWithTimeout(d)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, "GET", u.url, nil)
				start := time.Now()
				resp, err := m.tr.RoundTrip(req)
				took := time.Since(start)
				if err == nil {
					drain(resp)
					ok.Add(1)
				} else {
					failed.Add(1)
				}
				if took > d+250*time.Millisecond {
					t.Errorf("round %d worker %d: ended after %v, deadline %v (err %v)", round, w, took.Round(time.Millisecond), d, err)
				}
			}()
		}
		wg.Wait()
		t.Logf("round %d: %d served, %d failed, upstream accepted %d, most stalled at once %d", round, ok.Load(), failed.Load(), u.accepted.Load(), u.max.Load())
		if ok.Load() == 0 {
			t.Errorf("round %d: no request served though the owner's connection serves", round)
		}
	}
	if m := u.max.Load(); m > 1 {
		t.Errorf("%d dials of the key hung at once across the fleet; MaxDialingPerKey is 1", m)
	}
	for i, m := range ms {
		adv72bSettled(t, m, u.url)
		if d := m.node.dialing.Load(); d != 0 {
			t.Errorf("member %d: node.dialing %d", i, d)
		}
	}
}

// TestAdv74aPaidDialShortDeadline: a request owing a dial with a short
// deadline (400ms): the paid dial hangs in the handshake for half of it,
// and the owner's idle connection could serve it all along. Properties: it
// ends by its deadline plus a grace, and it is served (a relay after the
// paid dial's half-time still has 200ms on loopback, enough on a loaded
// machine under -race).
func TestAdv74aPaidDialShortDeadline(t *testing.T) {
	u := newStallingTLSUpstream(t)
	ms := newFleet(t, 2, func(tr *Transport) { tr.TLSClientConfig = &tls.Config{RootCAs: u.roots} })
	owner, client := ms[0], ms[1]
	warm(t, owner, u.url)
	adv74aOwe(t, client, u.url)
	const d = 400 * time.Millisecond
	ctx, cancel := contextWithTimeout(d)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", u.url, nil)
	start := time.Now()
	resp, err := client.tr.RoundTrip(req)
	took := time.Since(start)
	if err == nil {
		drain(resp)
	}
	if took > d+150*time.Millisecond {
		t.Errorf("ended after %v, deadline %v", took.Round(time.Millisecond), d)
	}
	if err != nil {
		t.Errorf("not served after %v with the owner's connection idle: %v (client %+v)", took.Round(time.Millisecond), err, client.node.Stats())
	}
	adv72bSettled(t, client, u.url)
}

// TestAdv74aOwnerDiesMidPaidDial: the client's paid dial hangs in the
// handshake, and the owner whose connection the relays went through dies
// (killed) meanwhile, so the fallback finds no sibling's connection and
// dials again into the hanging upstream. Properties: the request ends by
// its deadline plus a grace; its error is retry-safe (the upstream never
// saw it: no request reached a second connection); and the client's
// counts settle: nothing dialing, creating, waiting or in use, n.open what
// it holds, no stalled handshake left open.
func TestAdv74aOwnerDiesMidPaidDial(t *testing.T) {
	u := newStallingTLSUpstream(t)
	ms := newFleet(t, 2, func(tr *Transport) { tr.TLSClientConfig = &tls.Config{RootCAs: u.roots} })
	owner, client := ms[0], ms[1]
	warm(t, owner, u.url)
	adv74aOwe(t, client, u.url)
	const d = 1200 * time.Millisecond
	done := make(chan error, 1)
	var took time.Duration
	go func() {
		ctx, cancel := contextWithTimeout(d)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", u.url, nil)
		start := time.Now()
		resp, err := client.tr.RoundTrip(req)
		took = time.Since(start)
		if err == nil {
			drain(resp)
		}
		done <- err
	}()
	waitFor(t, 3*time.Second, "the paid dial", func() bool { return u.accepted.Load() >= 2 })
	owner.dieAsKilled()
	var err error
	select {
	case err = <-done:
	case <-time.After(d + 2*time.Second):
		t.Fatalf("RoundTrip still running %v past its deadline", 2*time.Second)
	}
	if took > d+250*time.Millisecond {
		t.Errorf("ended after %v, deadline %v (err %v)", took.Round(time.Millisecond), d, err)
	}
	if err == nil {
		t.Fatalf("served, though the only serving connection died and new ones never handshake")
	}
	if !IsRetrySafe(err) {
		t.Errorf("error %v is not retry-safe, though no connection that handshook carried the request", err)
	}
	waitFor(t, 3*time.Second, "the client to settle", func() bool {
		k := adv72bKeyStats(t, client, u.url)
		o, h := adv70Counted(client)
		return k.Creating == 0 && k.Waiting == 0 && k.Pending == 0 && k.InUse == 0 &&
			o == int64(h) && client.node.dialing.Load() == 0 && client.node.room.n.Load() == 0 && u.cur.Load() == 0
	})
}
