package proxy

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// adv70Idle reports how many of m's slots hold an idle connection.
func adv70Idle(m *member) int {
	k := 0
	for i := range m.node.slots {
		if oc := m.node.slots[i].Load(); oc != nil && oc.state.Load() == stIdle {
			k++
		}
	}
	return k
}

// TestAdv70RoomWakeBeforeQueued: the room a request pauses for is made
// (both of the process's connections go idle, evictable) after the pool
// told it the table was full but before it queued itself as a waiter. Its
// process made the room: the wake must not be lost. Every pause is longer
// than the deadline (fullPauseBase), as in TestFullPauseWokenByRoom, so only
// a wake serves it. The window between the pool's ErrFull and room.add is
// held open by the table-full warning, logged in it.
func TestAdv70RoomWakeBeforeQueued(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}
	release := make(chan struct{})
	other := closingStreamUpstream(t, release, false)
	url := closingStreamUpstream(t, nil, false)
	entered, unblock := make(chan struct{}), make(chan struct{})
	var once sync.Once
	core, _ := observer.New(zapcore.WarnLevel)
	hooked := zapcore.RegisterHooks(core, func(e zapcore.Entry) error {
		if strings.Contains(e.Message, "wait for room") {
			once.Do(func() {
				close(entered)
				<-unblock
			})
		}
		return nil
	})
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond, Logger: zap.New(hooked)}, func(tr *Transport) {
		tr.MaxConnsPerKey = 8
		tr.fullPauseBase = time.Minute
	})
	held := holdStreams(t, m, other, 2)
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, body, err := roundTripWithin(m.tr, url+"/", 4*time.Second)
		if err == nil && body != "ok" {
			err = errors.New("body " + body)
		}
		done <- err
	}()
	select {
	case <-entered:
	case <-time.After(3 * time.Second):
		close(release)
		close(unblock)
		t.Fatal("the request never found the table full")
	}
	close(release)
	for _, r := range held {
		drain(r)
	}
	if !func() bool {
		deadline := time.Now().Add(2 * time.Second)
		for adv70Idle(m) != 2 {
			if time.Now().After(deadline) {
				return false
			}
			time.Sleep(5 * time.Millisecond)
		}
		return true
	}() {
		close(unblock)
		t.Fatal("the held connections did not go idle")
	}
	close(unblock)
	err := <-done
	if err != nil {
		t.Fatalf("request paused after its process made room (2 idle connections, evictable): %v after %v; want it served (the wake made between the pool's ErrFull and room.add was lost)", err, time.Since(start))
	}
	if n := m.node.room.n.Load(); n != 0 {
		t.Fatalf("%d room waiters left; want 0", n)
	}
}

// TestAdv70PauseToDeadlineKeepsTableError: a capped key's request whose
// table stays full to its deadline fails with the table's error
// (orbitpool.ErrFull wrapped, which the Caddy module reads), once, not retried, and leaves no waiter queued. The
// last pause is now cut to end at the deadline: whatever ends first (the
// pause's timer, the context, the pool's own wait) the error must be the
// same.
func TestAdv70PauseToDeadlineKeepsTableError(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}
	for _, tc := range []struct {
		name string
		base time.Duration
	}{{"production pauses", 0}, {"one long pause", time.Minute}} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			defer close(release)
			other := closingStreamUpstream(t, release, false)
			url := closingStreamUpstream(t, nil, false)
			m := newMember(t, spec, func(tr *Transport) {
				tr.MaxConnsPerKey = 8
				tr.fullPauseBase = tc.base
			})
			holdStreams(t, m, other, 2)
			var bad []string
			for i := range 40 {
				d := time.Duration(10+i%7*7) * time.Millisecond
				ctx, cancel := context.WithTimeout(context.Background(), d)
				req, _ := http.NewRequestWithContext(ctx, "GET", url+"/", nil)
				start := time.Now()
				resp, err := m.tr.RoundTrip(req)
				took := time.Since(start)
				cancel()
				if resp != nil {
					drain(resp)
				}
				if err == nil || !errors.Is(err, orbitpool.ErrFull) || took > d+500*time.Millisecond {
					bad = append(bad, d.String()+": "+adv70Err(err)+" after "+took.String())
				}
			}
			if s := m.node.Stats(); s.Retries != 0 || s.Created != 2 {
				bad = append(bad, "stats: retries or dials")
			}
			if n := m.node.room.n.Load(); n != 0 {
				bad = append(bad, "waiters left queued")
			}
			if len(bad) > 0 {
				t.Fatalf("%d of 40 requests to a full table did not fail with the table's error (orbitpool.ErrFull) in time: %s", len(bad), strings.Join(bad[:min(len(bad), 4)], "; "))
			}
		})
	}
}

func adv70Err(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
