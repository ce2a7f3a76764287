package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv71gH2EvictChurnPOSTOnce: a table of two slots per process, two
// processes (A, B) on one segment. Both send POSTs (each with its own body)
// to an h2c upstream; A also sends GETs to two capped HTTP/1.1 upstreams,
// which find A's table full and evict A's idle connections, its HTTP/2 one
// (no stream between POSTs) among them, again and again, while A's own
// POSTs and B's leases on A's HTTP/2 connection race those evictions.
//
// Asserted: no POST reaches the upstream twice; every request either gets
// its own answer or fails retry-safe, and a POST that failed retry-safe
// never reached the upstream, and ends by its deadline; once the load stops, A's connection count
// (n.open) equals the connections in its slots, the table's count of A's
// lane equals it, and no key holds a unit in use or pending (no slot stuck
// draining with active 0).
func TestAdv71gH2EvictChurnPOSTOnce(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	h2 := newH2CServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen[string(b)]++
		mu.Unlock()
		io.WriteString(w, "ok:"+string(b))
	}, 4)
	h1 := func() string {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(time.Millisecond)
			io.WriteString(w, "h1")
		}))
		t.Cleanup(s.Close)
		return s.URL
	}
	l1, l2, l3 := h1(), h1(), h1()
	spec := orbitpool.PoolSpec{Lanes: 2, Keys: 16, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
	// One HTTP/2 connection for the fleet: B's POSTs lease A's (or B's
	// own once A's leaves), and A's evictions retire it again and again.
	conf := func(tr *Transport) { tr.H2C = true; tr.HTTP2 = true; tr.MaxConnsPerKey = 1 }
	a := newMember(t, spec, conf)
	b := newMember(t, spec, conf)
	ah1 := &Transport{Node: a.node, MaxConnsPerKey: 4}
	// B's own slots are held by exchanges that last the test: B dials no
	// HTTP/2 connection, and its POSTs go to A's over the unix leg.
	relB := make(chan struct{})
	defer close(relB)
	holdStreams(t, &member{pool: b.pool, node: b.node, tr: &Transport{Node: b.node}}, closingStreamUpstream(t, relB, false), 2)
	// A's HTTP/2 connection first.
	if _, body, err := adv71gPost(a.tr, h2.url, "warm"); err != nil || body != "ok:warm" {
		t.Fatalf("A's first POST: %q %v", body, err)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var seq atomic.Int64
	var okPosts, rsPosts, h1ok atomic.Int64
	bad := make(chan string, 32)
	report := func(s string) {
		select {
		case bad <- s:
		default:
		}
	}
	// Each request has its deadline, and must end by it. B's POSTs can
	// wait most of it: the fleet's one HTTP/2 connection is A's, which
	// A's GETs retire about every millisecond, and a request of B, whose
	// table is full, finds it only when it asks the pool again (5 to
	// 80ms apart); on a loaded machine under -race that was 2s once.
	const deadline = 5 * time.Second
	const late = deadline + time.Second
	var rsMu sync.Mutex
	var retrySafeIDs []string
	// B's POSTs stop first: B dials no HTTP/2 connection, and once A's
	// stopped, nothing would make one for B.
	stopB := make(chan struct{})
	var wgB sync.WaitGroup
	post := func(who string, tr *Transport, stop <-chan struct{}, wg *sync.WaitGroup) {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			id := fmt.Sprintf("%s%d", who, seq.Add(1))
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), deadline)

			req, _ := http.NewRequestWithContext(ctx, "POST", h2.url+"/p", strings.NewReader(id))
			resp, err := tr.RoundTrip(req)
			var got []byte
			if err == nil {
				got, err = io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil {
					report(fmt.Sprintf("%s POST %s: body: %v", who, id, err))
				} else if string(got) != "ok:"+id {
					report(fmt.Sprintf("%s POST %s: body %q", who, id, got))
				} else {
					okPosts.Add(1)
				}
			} else if IsRetrySafe(err) {
				t.Logf("%s POST %s: retry-safe after %v: %v", who, id, time.Since(start), err)
				rsPosts.Add(1)
				rsMu.Lock()
				retrySafeIDs = append(retrySafeIDs, id)
				rsMu.Unlock()
			} else {
				report(fmt.Sprintf("%s POST %s: not retry-safe: %v", who, id, err))
			}
			if d := time.Since(start); d > late {
				report(fmt.Sprintf("%s POST %s outlived its deadline (%v): took %v: %v", who, id, deadline, d, err))
			}
			cancel()
			time.Sleep(time.Duration(seq.Load()%3) * time.Millisecond)
		}
	}
	get := func(urls ...string) {
		defer wg.Done()
		for i := 0; ; i++ {
			url := urls[i%len(urls)]
			select {
			case <-stop:
				return
			default:
			}
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			req, _ := http.NewRequestWithContext(ctx, "GET", url+"/", nil)
			resp, err := ah1.RoundTrip(req)
			if err == nil {
				got, rerr := io.ReadAll(resp.Body)
				resp.Body.Close()
				if rerr != nil || string(got) != "h1" {
					report(fmt.Sprintf("A GET %s: %q %v", url, got, rerr))
				} else {
					h1ok.Add(1)
				}
			} else if !IsRetrySafe(err) {
				report(fmt.Sprintf("A GET %s: not retry-safe: %v", url, err))
			} else {
				t.Logf("A GET %s: retry-safe after %v: %v", url, time.Since(start), err)
			}
			if d := time.Since(start); d > late {
				report(fmt.Sprintf("A GET %s outlived its deadline (%v): took %v: %v", url, deadline, d, err))
			}
			cancel()
		}
	}
	for range 2 {
		wg.Add(1)
		wgB.Add(1)
		go post("a", a.tr, stop, &wg)
		go post("b", b.tr, stopB, &wgB)
	}
	wg.Add(2)
	go get(l1, l2, l3)
	go get(l3, l2, l1)
	stopAll := func() {
		select {
		case <-stopB:
		default:
			close(stopB)
		}
		wgB.Wait()
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}
	defer stopAll()
	time.Sleep(2 * time.Second)
	stopAll()
	close(bad)
	for s := range bad {
		t.Errorf("%s", s)
	}
	mu.Lock()
	delete(seen, "warm")
	for id, n := range seen {
		if n > 1 {
			t.Errorf("POST %s reached the upstream %d times", id, n)
		}
	}
	rsMu.Lock()
	for _, id := range retrySafeIDs {
		if seen[id] != 0 {
			t.Errorf("POST %s failed retry-safe but reached the upstream %d times", id, seen[id])
		}
	}
	rsMu.Unlock()
	mu.Unlock()
	st := a.node.Stats()
	t.Logf("posts ok %d, retry-safe %d; h1 ok %d; A %+v; h2 upstream conns %d", okPosts.Load(), rsPosts.Load(), h1ok.Load(), st, h2.conns.Load())
	if st.Evicted == 0 {
		t.Errorf("no eviction on A: the test exercised nothing (%+v)", st)
	}
	// Counts settle once the connections retired in good order are gone
	// (closeWait) and nothing runs.
	var why string
	settled := false
	settleStart := time.Now()
	logged := false
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		live := 0
		for i := range a.node.slots {
			if a.node.slots[i].Load() != nil {
				live++
			}
			if a.node.h2slots[i].Load() != nil {
				live++
			}
		}
		open := a.node.open.Load() - int64(a.node.spares.len())
		snap, err := a.pool.Snapshot()
		if err != nil {
			t.Fatalf("snapshot: %v", err)
		}
		res := 0
		for _, l := range snap.Lanes {
			res += int(l.Resources)
		}
		// B's two held exchanges are the only units in use.
		used := 0
		for _, k := range snap.Keys {
			used += int(k.InUse + k.Pending + k.Creating)
		}
		busy := used != 2
		bopen := b.node.open.Load() - int64(b.node.spares.len())
		blive := 0
		for i := range b.node.slots {
			if b.node.slots[i].Load() != nil {
				blive++
			}
			if b.node.h2slots[i].Load() != nil {
				blive++
			}
		}
		why = fmt.Sprintf("A open %d live %d; B open %d live %d; table resources %d (lanes %+v); keys %+v; waiters %d/%d",
			open, live, bopen, blive, res, snap.Lanes, snap.Keys, a.node.room.n.Load(), b.node.room.n.Load())
		if open == int64(live) && bopen == int64(blive) && res == live+blive && !busy &&
			a.node.room.n.Load() == 0 && b.node.room.n.Load() == 0 {
			settled = true
			t.Logf("settled in %v", time.Since(settleStart))
			break
		}
		if !logged && time.Since(settleStart) > time.Second {
			logged = true
			t.Logf("not settled after 1s: %s", why)
		}
	}
	if !settled {
		t.Fatalf("counts did not settle after the load stopped: %s", why)
	}
}

func adv71gPost(tr *Transport, url, id string) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/p", strings.NewReader(id))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}
