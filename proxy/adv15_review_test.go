package proxy

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
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
	ms, url := expiredH2Burst(t, 2, func(i int) int { return 0 }, conns)
	owner, client := ms[0], ms[1]
	key := mustKey(t, owner.tr, url)
	if c, _ := owner.pool.Candidates(key, nil); len(c) != conns {
		t.Fatalf("%d connection(s) after the burst, want %d", len(c), conns)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url+"/fast", nil)
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

// TestAdv15ReviewIdleExpiredLeasesAcrossOwners: as
// TestAdv15ReviewIdleExpiredLeasesNotRefusedUntilFail, with the expired
// connections spread over more owners than the request has retries, one
// each: every owner refuses the lease once (and drains what it holds), and
// the request, which pays a retry per refusal, fails before it dials. A
// lease refused because the connection is gone reached nothing upstream
// and leaves the owner with one connection fewer: it must not use up the
// request's retries.
func TestAdv15ReviewIdleExpiredLeasesAcrossOwners(t *testing.T) {
	const owners = 5
	ms, url := expiredH2Burst(t, owners+1, func(i int) int { return i }, owners)
	client := ms[owners]
	key := mustKey(t, client.tr, url)
	c, _ := client.pool.Candidates(key, nil)
	lanes := map[int]bool{}
	for _, r := range c {
		lanes[r.ID.Lane()] = true
	}
	if len(c) != owners || len(lanes) != owners {
		t.Fatalf("%d connection(s) on %d owner(s) after the burst, want one on each of %d", len(c), len(lanes), owners)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url+"/fast", nil)
	resp, err := client.tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("sibling's request failed against %d owners' idle-expired connections: %v", owners, err)
	}
	drain(resp)
}

// expiredH2Burst starts n members of one fleet, whose HTTP/2 connections
// expire 300ms idle and are swept only hourly, and an h2c upstream that
// allows one stream per connection. It runs a burst of streams requests at
// once, request i by member holder(i), so that each takes a connection of
// its own, and returns once the burst's connections are all idle past
// their timeout.
func expiredH2Burst(t *testing.T, n int, holder func(i int) int, streams int) ([]*member, string) {
	t.Helper()
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
	opts := NodeOptions{SweepInterval: time.Hour}
	var ms []*member
	for range n {
		ms = append(ms, newMemberOpts(t, spec, opts, conf))
	}
	slow.Add(streams)
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for i := range streams {
		m := ms[holder(i)]
		wg.Go(func() {
			req, _ := http.NewRequest("GET", up.url+"/slow", nil)
			resp, err := m.tr.RoundTrip(req)
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
		t.Fatalf("burst: %v", err)
	}
	time.Sleep(500 * time.Millisecond)
	return ms, up.url
}

// TestAdv15ReviewClosedH2NotOfferedWhileRetiring: an HTTP/2 connection the
// upstream closed is retired by retireH2 (syncH2Now finds the ClientConn
// closed): it leaves h2slots at once, but stays in the pool, with its
// capacity, until its ClientConn is closed and it is unregistered. Closing
// takes a while on a loaded machine (up to 250ms in x/net when the close
// blocks). Meanwhile the pool still offers it: a sibling's lease on it finds
// no connection on the owner ("connection closed"), is refused and given
// back, and the sibling's next plan is offered the same connection again,
// refused again, until the request has used up its retries (within a
// millisecond) and fails, where it should dial. The hook holds retireH2 in
// that window while the sibling's request runs.
func TestAdv15ReviewClosedH2NotOfferedWhileRetiring(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveConns(t, ln, func(c net.Conn, id int) {
		if id > 1 {
			(&http2.Server{}).ServeConn(c, &http2.ServeConnOpts{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Write([]byte("ok"))
			})})
			return
		}
		// The first connection answers one stream, then the upstream
		// closes it.
		serveH2Frames(c, []http2.Setting{{ID: http2.SettingMaxConcurrentStreams, Val: 100}},
			func(fr *http2.Framer, f *http2.HeadersFrame) {
				var b bytes.Buffer
				enc := hpack.NewEncoder(&b)
				enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
				enc.WriteField(hpack.HeaderField{Name: "content-length", Value: "0"})
				fr.WriteHeaders(http2.HeadersFrameParam{StreamID: f.StreamID, BlockFragment: b.Bytes(), EndStream: true, EndHeaders: true})
			})
	})
	url := "http://" + ln.Addr().String()
	ms := newFleet(t, 2, h2cConf)
	owner, client := ms[0], ms[1]

	var fired atomic.Bool
	hookDone := make(chan error, 1)
	hook := func(n *Node, hc *h2conn) {
		if n != owner.node || !fired.CompareAndSwap(false, true) {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", url+"/", nil)
		resp, err := client.tr.RoundTrip(req)
		if err == nil {
			drain(resp)
		}
		hookDone <- err
	}
	testHookRetireH2.Store(&hook)
	defer testHookRetireH2.Store(nil)

	req, _ := http.NewRequest("GET", url+"/", nil)
	resp, err := owner.tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	drain(resp)
	select {
	case err := <-hookDone:
		if err != nil {
			t.Fatalf("sibling's request while the owner retired its closed connection: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the owner never retired the connection its upstream closed")
	}
}

// TestAdv15ReviewGoAwayEachPooledConnNotFatal: an upstream restarts
// gracefully while a process holds several idle HTTP/2 connections to
// it, and each connection's GOAWAY names the stream the request sent on it
// as not processed (sent after the upstream's last one): x/net/http2
// reports it retry-safe ("received Server's graceful shutdown GOAWAY"), and
// the connection takes no new stream. Each connection can refuse a request
// so only once, but each refusal cost the request one of its MaxRetries:
// with more such connections than retries, it failed, without ever
// reaching the restarted upstream, where stock net/http's HTTP/2 client
// retries these streams up to 6 times (with backoff) and would have dialed.
// The same holds for a sibling's request on the owner's connections: the
// owner's error frame says the connection went away (flagConnGone).
func TestAdv15ReviewGoAwayEachPooledConnNotFatal(t *testing.T) {
	t.Run("local", func(t *testing.T) { goAwayEachPooledConn(t, false) })
	t.Run("sibling", func(t *testing.T) { goAwayEachPooledConn(t, true) })
}

func goAwayEachPooledConn(t *testing.T, sibling bool) {
	const conns = 5
	var restarted atomic.Bool
	var mu sync.Mutex
	old := map[*rawConn]bool{}
	var goAways atomic.Int64
	up := newRawH2(t, func(s *rawStream) {
		mu.Lock()
		wasOld := old[s.c]
		if !restarted.Load() {
			old[s.c] = true
		}
		mu.Unlock()
		if restarted.Load() && wasOld {
			goAways.Add(1)
			s.goAway(s.id - 2)
			return
		}
		s.headers(false, ":status", "200")
		s.data(true, []byte("ok"))
	})
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	opts := NodeOptions{SweepInterval: time.Hour}
	m := newMemberOpts(t, spec, opts, h2cConf)
	client := m
	if sibling {
		client = newMemberOpts(t, spec, opts, h2cConf)
	}
	key := mustKey(t, m.tr, up.url)
	// One connection at a time: each, once used, is made full (the
	// upstream's limit 0), so that the next request dials.
	for i := range conns {
		if err := getOK(m, context.Background(), up.url+"/"); err != nil {
			t.Fatal(err)
		}
		up.setLimit(0)
		waitFor(t, 5*time.Second, "every connection at capacity 0", func() bool {
			c, _ := m.pool.Candidates(key, nil)
			for _, r := range c {
				if r.Capacity != 0 {
					return false
				}
			}
			return len(c) == i+1
		})
	}
	up.setLimit(100)
	waitFor(t, 5*time.Second, "every connection at capacity 100", func() bool {
		c, _ := m.pool.Candidates(key, nil)
		for _, r := range c {
			if r.Capacity != 100 {
				return false
			}
		}
		return len(c) == conns
	})
	restarted.Store(true)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	before := client.node.Stats().ReusedRemote
	if err := getOK(client, ctx, up.url+"/"); err != nil {
		t.Fatalf("request failed after %d GOAWAYs from %d pooled connections: %v", goAways.Load(), conns, err)
	}
	if sibling && client.node.Stats().ReusedRemote-before < 2 {
		t.Fatalf("the sibling's request went through the owner %d time(s); want it refused on several of the owner's connections, or the test shows nothing",
			client.node.Stats().ReusedRemote-before)
	}
}
