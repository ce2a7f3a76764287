package proxy

import (
	"context"
	"crypto/tls"
	"net/http"
	"testing"
	"time"
)

// TestAdv73aOwedDialStallsWhileSiblingIdle: a TLS upstream accepts new TCP
// connections but no longer completes a handshake (an overloaded upstream,
// a full accept backlog behind a load balancer); its one established
// connection, the owner's, still serves. A sibling relays through it
// relaysPerTLSDial times; its next request owes a dial. Without the debt it
// would go through the owner's idle connection, as every request before it
// did; with it, a dial that hangs in the handshake must not cost the request
// its deadline while that idle connection could serve it: the request is
// served within its deadline (the default dial timeout is longer).
func TestAdv73aOwedDialStallsWhileSiblingIdle(t *testing.T) {
	u := newStallingTLSUpstream(t)
	url, roots, accepted := u.url, u.roots, &u.accepted
	ms := newFleet(t, 2, func(tr *Transport) { tr.TLSClientConfig = &tls.Config{RootCAs: roots} })
	owner, client := ms[0], ms[1]
	warm(t, owner, url)
	for i := range relaysPerTLSDial {
		if _, _, err := adv10Do(t, client.tr, "GET", url, nil); err != nil {
			t.Fatalf("relay %d: %v", i, err)
		}
	}
	if st := client.node.Stats(); st.ReusedRemote != relaysPerTLSDial {
		t.Fatalf("setup: %+v", st)
	}
	// Its deadline is short enough that the relays after it still come
	// within relayWindow of the ones before.
	ctx, cancel := contextWithTimeout(600 * time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	start := time.Now()
	resp, err := client.tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("after %v, with the owner's connection idle all along: %v (client %+v, upstream accepted %d)", time.Since(start).Round(time.Millisecond), err, client.node.Stats(), accepted.Load())
	}
	drain(resp)
	// The dial was tried, and the relays that paid for it are spent: the
	// next requests relay at once, and none dials again until as many
	// relays have paid for another (without that, each would wait half its
	// time in a dial that hangs).
	dialed := accepted.Load()
	for i := range relaysPerTLSDial - 1 {
		ctx, cancel := contextWithTimeout(2 * time.Second)
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		start := time.Now()
		resp, err := client.tr.RoundTrip(req)
		d := time.Since(start)
		if err == nil {
			drain(resp)
		}
		cancel()
		if err != nil || d > 500*time.Millisecond {
			t.Fatalf("request %d after the failed paid dial: %v after %v; want it relayed at once", i, err, d.Round(time.Millisecond))
		}
	}
	if n := accepted.Load(); n != dialed {
		t.Fatalf("the upstream accepted %d connections after the failed paid dial; want none until the relays pay for another", n-dialed)
	}
}

func contextWithTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

// TestAdv73aOwedDialWaitsBehindStalledDial: as
// TestAdv73aOwedDialStallsWhileSiblingIdle, with MaxDialingPerKey 1 (a
// dial limit, not a cap on connections, so relays still pay for dials):
// one request owing a dial hangs in the handshake (its deadline 4s); a
// second one, deadline 1s, must not wait behind that dial while the
// owner's connection is idle: it is served.
func TestAdv73aOwedDialWaitsBehindStalledDial(t *testing.T) {
	u := newStallingTLSUpstream(t)
	url, roots, accepted := u.url, u.roots, &u.accepted
	ms := newFleet(t, 2, func(tr *Transport) {
		tr.TLSClientConfig = &tls.Config{RootCAs: roots}
		tr.MaxDialingPerKey = 1
	})
	owner, client := ms[0], ms[1]
	warm(t, owner, url)
	for i := range relaysPerTLSDial {
		if _, _, err := adv10Do(t, client.tr, "GET", url, nil); err != nil {
			t.Fatalf("relay %d: %v", i, err)
		}
	}
	first := make(chan error, 1)
	go func() {
		ctx, cancel := contextWithTimeout(4 * time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		resp, err := client.tr.RoundTrip(req)
		if err == nil {
			drain(resp)
		}
		first <- err
	}()
	waitFor(t, 2*time.Second, "the owed dial", func() bool { return accepted.Load() >= 2 })
	ctx, cancel := contextWithTimeout(time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := client.tr.RoundTrip(req)
	if err != nil {
		t.Errorf("the second request, with the owner's connection idle and a dial of the key hanging: %v (client %+v)", err, client.node.Stats())
	} else {
		drain(resp)
	}
	<-first
}
