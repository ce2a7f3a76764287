package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// adv73bLedger is an upstream that counts each request id's arrivals (at
// its head) and, for block=1, reads the body and then never answers, until
// its connection goes.
type adv73bLedger struct {
	mu   sync.Mutex
	seen map[string]int
	body map[string]int64
	// hijackedClosed counts a hijacked connection closed.
	hijackedClosed func()
}

func (l *adv73bLedger) serve(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	l.mu.Lock()
	l.seen[id]++
	l.mu.Unlock()
	if r.URL.Query().Get("block") == "1" {
		// Never answers; reads the connection to its end and closes it
		// at once (an upstream prompt to let a dead peer go).
		c, br, err := w.(http.Hijacker).Hijack()
		if err != nil {
			panic(err)
		}
		buf := make([]byte, 4096)
		for {
			n, err := br.Read(buf)
			l.mu.Lock()
			l.body[id] += int64(n)
			l.mu.Unlock()
			if err != nil {
				break
			}
		}
		c.Close()
		l.hijackedClosed()
		return
	}
	io.Copy(io.Discard, r.Body)
	ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
	time.Sleep(time.Duration(ms) * time.Millisecond)
	io.WriteString(w, "ok")
}

func (l *adv73bLedger) count(id string) (int, int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seen[id], l.body[id]
}

// TestAdv73bOwnerKilledUnderRelayedPosts: a child process owns all 3
// connections of a capped key; this process relays 3 non-replayable POSTs
// through it (two whole bodies, one still streaming), which the upstream
// has received and does not answer (p3's client sends the rest of its body
// only after the kill), and has 4 more requests (2 GETs, 2
// non-replayable POSTs) waiting for a connection. The owner is SIGKILLed.
// Properties: a request the upstream received never fails as retry-safe
// (a retry would deliver the POST twice) and is never sent again by the
// transport; every request id reaches the upstream at most once; the
// waiting requests, which never reached the dead owner, succeed within 5s;
// later POSTs succeed.
func TestAdv73bOwnerKilledUnderRelayedPosts(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	const C = 3
	led := &adv73bLedger{seen: map[string]int{}, body: map[string]int64{}}
	var sopen, speak, stotal atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(led.serve))
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			stotal.Add(1)
			adv73bMax(&speak, sopen.Add(1))
		case http.StateClosed:
			sopen.Add(-1)
		}
	}
	led.hijackedClosed = func() { sopen.Add(-1) }
	srv.Start()
	t.Cleanup(srv.Close)
	counts := func() (int64, int64, int64) { return sopen.Load(), speak.Load(), stotal.Load() }
	seg := filepath.Join(t.TempDir(), "seg")
	owner := startAdv73bChild(t, seg, C)
	owner.send(t, "warm "+strconv.Itoa(C)+" "+srv.URL+"/?id=warm&ms=100")
	if got := owner.expect(t, "warmed"); got != strconv.Itoa(C) {
		t.Fatalf("owner made %s connections, want %d", got, C)
	}
	me := adv73bMember(t, seg, 0, func(tr *Transport) { tr.MaxConnsPerKey = C })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	send, results := adv73bSender(t, ctx, me.tr, srv.URL)
	send("POST", "p1", "&block=1", strings.NewReader(strings.Repeat("a", 1024)), 1024)
	send("POST", "p2", "&block=1", strings.NewReader(strings.Repeat("b", 100<<10)), 100<<10)
	pr, pw := io.Pipe()
	t.Cleanup(func() { pw.Close() })
	send("POST", "p3", "&block=1", pr, 1<<20)
	go pw.Write(make([]byte, 64<<10)) // a quarter of its body, then nothing
	waitFor(t, 5*time.Second, "the upstream to receive the relayed POSTs", func() bool {
		n1, _ := led.count("p1")
		n2, b2 := led.count("p2")
		n3, b3 := led.count("p3")
		return n1 == 1 && n2 == 1 && b2 >= 100<<10 && n3 == 1 && b3 > 0
	})
	if s := me.node.Stats(); s.ReusedRemote != C || s.Created != 0 {
		t.Fatalf("the POSTs did not all go through the owner: %+v", s)
	}
	send("GET", "w1", "", nil, 0)
	send("POST", "w2", "", strings.NewReader("w2"), 2)
	send("GET", "w3", "", nil, 0)
	send("POST", "w4", "", strings.NewReader("w4"), 2)
	time.Sleep(100 * time.Millisecond)
	for _, id := range []string{"w1", "w2", "w3", "w4"} {
		if n, _ := led.count(id); n != 0 {
			t.Fatalf("%s reached the upstream while the cap's %d connections were busy", id, C)
		}
	}
	killedAt := time.Now()
	owner.kill(t)
	// The uploading client sends the rest of p3's body, as one does: a
	// sibling's HTTP/1.1 exchange waits for its caller's body, as
	// net/http's does (exchangeOpts.stopBody), so a body that never
	// returns from Read would hold p3 forever by design.
	go func() {
		pw.Write(make([]byte, 1<<20-64<<10))
		pw.Close()
	}()

	for range 7 {
		var r adv73bResult
		select {
		case r = <-results:
		case <-time.After(8 * time.Second):
			t.Fatal("a request hung after the owner was killed")
		}
		seen, _ := led.count(r.id)
		d := r.at.Sub(killedAt).Round(time.Millisecond)
		switch {
		case r.err == nil:
			if r.id[0] == 'p' {
				t.Errorf("%s succeeded though the upstream never answered it", r.id)
			}
		case IsRetrySafe(r.err) && seen > 0:
			t.Errorf("%s failed as retry-safe %v after the kill, but the upstream received it (%d times): a retry delivers it twice: %v", r.id, d, seen, r.err)
		case r.id[0] == 'w':
			t.Errorf("%s, waiting for a connection when the owner died, failed %v after the kill (retry-safe %v): %v", r.id, d, IsRetrySafe(r.err), r.err)
		}
		if r.id[0] == 'w' && d > 5*time.Second {
			t.Errorf("%s took %v after the kill", r.id, d)
		}
		t.Logf("%s: %v after the kill, err %v", r.id, d, r.err)
	}
	for _, id := range []string{"p1", "p2", "p3", "w1", "w2", "w3", "w4"} {
		if n, _ := led.count(id); n > 1 {
			t.Errorf("%s reached the upstream %d times", id, n)
		}
	}
	for i := range 3 {
		id := fmt.Sprintf("after%d", i)
		send("POST", id, "", strings.NewReader(id), int64(len(id)))
		if r := <-results; r.err != nil {
			t.Errorf("%s after the owner died: %v", id, r.err)
		}
	}
	if _, peak, _ := counts(); peak > C {
		t.Errorf("the upstream held %d connections at once, cap %d", peak, C)
	}
}
