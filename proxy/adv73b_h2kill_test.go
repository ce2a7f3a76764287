package proxy

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAdv73bH2OwnerKilledUnderSiblingStreams: an h2c upstream, cap 1. A
// child process owns the fleet's one HTTP/2 connection; this process has
// 3 non-replayable POSTs on it as streams (two whole, one still streaming
// its body) that the upstream received and does not answer. The owner is
// SIGKILLed. Properties: a POST the upstream received never fails as
// retry-safe and is never sent again; every id reaches the upstream at most
// once; requests sent after the kill (GETs and non-replayable POSTs) all
// succeed within 5s, over one new connection (the upstream sees at most 2
// in all).
func TestAdv73bH2OwnerKilledUnderSiblingStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	led := &adv73bLedger{seen: map[string]int{}, body: map[string]int64{}}
	up := newH2CServer(t, func(w http.ResponseWriter, r *http.Request) {
		id := r.URL.Query().Get("id")
		led.mu.Lock()
		led.seen[id]++
		led.mu.Unlock()
		buf := make([]byte, 4096)
		for {
			n, err := r.Body.Read(buf)
			led.mu.Lock()
			led.body[id] += int64(n)
			led.mu.Unlock()
			if err != nil {
				break
			}
		}
		if r.URL.Query().Get("block") == "1" {
			<-r.Context().Done()
			return
		}
		io.WriteString(w, "ok")
	})
	seg := filepath.Join(t.TempDir(), "seg")
	owner := startAdv73bChild(t, seg, 1, "ORBIT_H2C=1")
	owner.send(t, "warm 1 "+up.url+"/?id=warm")
	if got := owner.expect(t, "warmed"); got != "1" {
		t.Fatalf("owner made %s connections, want 1", got)
	}
	me := adv73bMember(t, seg, 0, func(tr *Transport) { tr.MaxConnsPerKey = 1; tr.H2C = true })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	send, results := adv73bSender(t, ctx, me.tr, up.url)
	send("POST", "p1", "&block=1", strings.NewReader(strings.Repeat("a", 1024)), 1024)
	send("POST", "p2", "&block=1", strings.NewReader(strings.Repeat("b", 100<<10)), 100<<10)
	pr, pw := io.Pipe()
	t.Cleanup(func() { pw.Close() })
	send("POST", "p3", "&block=1", pr, 1<<20)
	go pw.Write(make([]byte, 16<<10))
	waitFor(t, 5*time.Second, "the upstream to receive the relayed POSTs", func() bool {
		n1, _ := led.count("p1")
		n2, b2 := led.count("p2")
		n3, b3 := led.count("p3")
		return n1 == 1 && n2 == 1 && b2 == 100<<10 && n3 == 1 && b3 > 0
	})
	if s := me.node.Stats(); s.ReusedRemote != 3 || s.Created != 0 {
		t.Fatalf("the POSTs did not all go through the owner: %+v", s)
	}
	killedAt := time.Now()
	owner.kill(t)
	go func() {
		pw.Write(make([]byte, 1<<20-16<<10))
		pw.Close()
	}()
	for range 3 {
		var r adv73bResult
		select {
		case r = <-results:
		case <-time.After(8 * time.Second):
			t.Fatal("a POST hung after the owner was killed")
		}
		seen, _ := led.count(r.id)
		switch {
		case r.err == nil:
			t.Errorf("%s succeeded though the upstream never answered it", r.id)
		case IsRetrySafe(r.err) && seen > 0:
			t.Errorf("%s failed as retry-safe %v after the kill, but the upstream received it: a retry delivers it twice: %v",
				r.id, r.at.Sub(killedAt).Round(time.Millisecond), r.err)
		}
		t.Logf("%s: %v after the kill: %v", r.id, r.at.Sub(killedAt).Round(time.Millisecond), r.err)
	}
	ids := []string{"a1", "a2", "a3", "a4"}
	send("GET", "a1", "", nil, 0)
	send("POST", "a2", "", strings.NewReader("a2"), 2)
	send("GET", "a3", "", nil, 0)
	send("POST", "a4", "", strings.NewReader("a4"), 2)
	for range ids {
		select {
		case r := <-results:
			if r.err != nil {
				t.Errorf("%s, sent after the kill, failed (retry-safe %v): %v", r.id, IsRetrySafe(r.err), r.err)
			} else if d := r.at.Sub(killedAt); d > 5*time.Second {
				t.Errorf("%s took until %v after the kill", r.id, d)
			}
		case <-time.After(8 * time.Second):
			t.Fatal("a request sent after the kill hung")
		}
	}
	for _, id := range append([]string{"p1", "p2", "p3"}, ids...) {
		if n, _ := led.count(id); n > 1 {
			t.Errorf("%s reached the upstream %d times", id, n)
		}
	}
	if n := up.conns.Load(); n > 2 {
		t.Errorf("the upstream saw %d connections: the dead owner's and %d new, want 1 new (cap 1)", n, n-1)
	}
}
