package proxy

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestAdv2RefusedCloseGivesHeldUnitsToSiblings: two members of a fleet
// with a cap of 2 on one upstream. Member A gave up two requests the
// upstream is still busy with, and closed their connections early; its
// GETs to a path the upstream drops at once are then refusals, and A holds
// both units. A sibling B waits. When A closes (at several instants, also
// while the refusals are still under way), Close returns at once and B is
// served: the held executions complete, once.
func TestAdv2RefusedCloseGivesHeldUnitsToSiblings(t *testing.T) {
	for _, after := range []time.Duration{0, 2 * time.Millisecond, 10 * time.Millisecond, 300 * time.Millisecond} {
		t.Run(after.String(), func(t *testing.T) {
			up := startAdv2Upstream(t, 20*time.Second)
			spec := testSpec
			spec.Path = filepath.Join(t.TempDir(), "seg")
			conf := func(tr *Transport) { tr.MaxConnsPerKey = 2 }
			a := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond}, conf)
			b := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond}, conf)

			var wg sync.WaitGroup
			for range 2 {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
					defer cancel()
					getBody(ctx, a.tr, up.url+"/hold")
				})
			}
			wg.Wait()
			adv2WaitOrphans(t, up, 2)
			for range 4 {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
					defer cancel()
					getBody(ctx, a.tr, up.url+"/drop")
				})
			}
			time.Sleep(after)
			closed := make(chan time.Duration, 1)
			go func() {
				s := time.Now()
				a.node.Close()
				closed <- time.Since(s)
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			s := time.Now()
			err := getBody(ctx, b.tr, up.url+"/ok")
			took := time.Since(s)
			var ct time.Duration
			select {
			case ct = <-closed:
			case <-time.After(5 * time.Second):
				t.Fatal("A's Close did not return in 5s")
			}
			wg.Wait()
			t.Logf("A refused %d, closed in %v; B's GET: %v after %v", a.node.Stats().UpstreamRefused, ct.Round(time.Millisecond), err, took.Round(time.Millisecond))
			if err != nil {
				t.Errorf("B's GET after A closed: %v", err)
			}
			if after >= 300*time.Millisecond && a.node.Stats().UpstreamRefused == 0 {
				t.Errorf("A saw no refusal in %v", after)
			}
			if ct > time.Second {
				t.Errorf("A's Close took %v", ct)
			}
			if live := b.pool.Live(b.tr.last.Load().key); live > 2 {
				t.Errorf("live %d > cap", live)
			}
		})
	}
}
