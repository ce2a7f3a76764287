package proxy

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv73bJoinFullTableAfterKillMidChurn: a table of 3 lanes, all taken
// (this process and two children churning a cap-3 key). One child is
// SIGKILLed mid-churn and a new process joins at once: it must take the
// dead lane within 5s. Then both children are killed mid-churn.
// Properties: the key's counts settle (nothing creating, in use, pending
// or held; live within the cap) within 5s; the upstream never held more
// than 3 connections; this process then gets the whole cap (3 requests run
// at once at the upstream).
func TestAdv73bJoinFullTableAfterKillMidChurn(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	const C = 3
	var inSlow, peakSlow atomic.Int64
	srv, counts := countingUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		if ms == 400 {
			adv73bMax(&peakSlow, inSlow.Add(1))
			defer inSlow.Add(-1)
		}
		time.Sleep(time.Duration(ms) * time.Millisecond)
		io.WriteString(w, "ok")
	}))
	seg := filepath.Join(t.TempDir(), "seg")
	me := adv73bMember(t, seg, 3, func(tr *Transport) { tr.MaxConnsPerKey = C })
	env := []string{"ORBIT_LANES=3", "ORBIT_HOLD=200ms"}
	url := srv.URL + "/?ms=4"
	c1 := startAdv73bChild(t, seg, C, env...)
	c2 := startAdv73bChild(t, seg, C, env...)
	c1.send(t, "loop 4 "+url)
	c1.expect(t, "looping")
	c2.send(t, "loop 4 "+url)
	c2.expect(t, "looping")
	time.Sleep(200 * time.Millisecond)
	c1.kill(t)
	joinStart := time.Now()
	c3 := startAdv73bChild(t, seg, C, env...)
	if d := time.Since(joinStart); d > 5*time.Second {
		t.Errorf("joining the full table took %v after a member's death", d)
	}
	c3.send(t, "loop 4 "+url)
	c3.expect(t, "looping")
	time.Sleep(200 * time.Millisecond)
	c2.kill(t)
	c3.kill(t)
	key := mustKey(t, me.tr, url)
	var last orbitpool.KeyStats
	settled := false
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		snap, err := me.pool.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		last = orbitpool.KeyStats{}
		for _, k := range snap.Keys {
			if k.Key == key {
				last = k
			}
		}
		if last.Creating == 0 && last.InUse == 0 && last.Pending == 0 && last.Held == 0 && last.Live <= C && len(snap.Lanes) == 1 {
			settled = true
			break
		}
	}
	if !settled {
		t.Fatalf("the key's counts did not settle within 5s of the kills: %+v", last)
	}
	done := make(chan error, C)
	for range C {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/?ms=400", nil)
			resp, err := me.tr.RoundTrip(req)
			if err == nil {
				drain(resp)
			}
			done <- err
		}()
	}
	for range C {
		if err := <-done; err != nil {
			t.Errorf("after the kills: %v", err)
		}
	}
	if p := peakSlow.Load(); p != C {
		t.Errorf("%d requests sent at once ran %d at a time: the cap is not all back", C, p)
	}
	if _, peak, _ := counts(); peak > C {
		t.Errorf("the upstream held %d connections at once, cap %d", peak, C)
	}
}
