package proxy

import (
	"testing"
	"time"
)

// TestIdleTimeIsMonotonic: an HTTP/1.1 connection's idle time is kept as
// sinceStart, the clock of HTTP/2 connections' idleAt, which evictIdle
// compares it with to choose the connection idle longest, and one that a
// step of the wall clock does not move (an idle timeout that a step back
// put off, or a step forward brought on for every connection at once).
func TestIdleTimeIsMonotonic(t *testing.T) {
	m := newMember(t, testSpecLocal, nil)
	up := discardUpstream(t)
	before := sinceStart(time.Now())
	if _, _, err := adv10Do(t, m.tr, "GET", up.URL, nil); err != nil {
		t.Fatal(err)
	}
	after := sinceStart(time.Now())
	var idle []int64
	for i := range m.node.slots {
		if oc := m.node.slots[i].Load(); oc != nil && oc.state.Load() == stIdle {
			idle = append(idle, oc.idle.Load())
		}
	}
	if len(idle) != 1 || idle[0] < before || idle[0] > after {
		t.Fatalf("idle connections went idle at %v, as sinceStart; want one, in [%d, %d]", idle, before, after)
	}
}
