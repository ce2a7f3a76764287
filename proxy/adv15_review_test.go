package proxy

import (
	"context"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestAdv15ReviewIdleExpiredLeasesNotRefusedUntilFail: an owner holds
// several HTTP/2 connections (a burst, against an upstream that allows one
// stream per connection) that then all sit idle past their timeout, between
// two sweeps. A sibling's request takes a lease on one of them (LocalFirst:
// a sibling's connection before a dial); the owner finds it idle-expired
// (usableH2) and refuses the lease, retry-safe. The request plans again and
// is offered the owner's next expired connection, refused again: each
// refusal costs the request one of its MaxRetries, so with more expired
// connections than retries it fails, while stock net/http (whose idle
// connections close on their own timer) would have dialed. It must
// succeed, with no retry spent per expired connection.
func TestAdv15ReviewIdleExpiredLeasesNotRefusedUntilFail(t *testing.T) {
	const conns = 6
	release := make(chan struct{})
	var slow sync.WaitGroup
	up := newH2CServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			slow.Done()
			<-release
		}
		w.Write([]byte("ok"))
	}, 1)
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	conf := func(tr *Transport) {
		tr.H2C = true
		tr.IdleConnTimeout = 300 * time.Millisecond
	}
	// No sweep during the test: the connections expire between sweeps.
	opts := NodeOptions{SweepInterval: time.Hour}
	owner := newMemberOpts(t, spec, opts, conf)
	client := newMemberOpts(t, spec, opts, conf)

	// conns concurrent streams: one connection each.
	slow.Add(conns)
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for range conns {
		wg.Go(func() {
			req, _ := http.NewRequest("GET", up.url+"/slow", nil)
			resp, err := owner.tr.RoundTrip(req)
			if err != nil {
				errs <- err
				return
			}
			drain(resp)
		})
	}
	slow.Wait()
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("owner's burst: %v", err)
	}
	key := mustKey(t, owner.tr, up.url)
	if c, _ := owner.pool.Candidates(key, nil); len(c) != conns {
		t.Fatalf("%d connection(s) after the burst, want %d", len(c), conns)
	}
	// All of them idle past their timeout.
	time.Sleep(500 * time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/fast", nil)
	retries0 := client.node.stats.retries.Load()
	resp, err := client.tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("sibling's request failed after %d retries against %d idle-expired connections: %v",
			client.node.stats.retries.Load()-retries0, conns, err)
	}
	drain(resp)
	if n := client.node.stats.retries.Load() - retries0; n > 1 {
		t.Errorf("sibling's request spent %d retries on idle-expired connections, want at most 1", n)
	}
}
