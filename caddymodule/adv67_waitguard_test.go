package caddymodule

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"
)

// adv67Waits counts observations, safely: end observes outside the lock.
type adv67Waits struct {
	mu  sync.Mutex
	n   int
	sum float64
}

func (c *adv67Waits) Observe(v float64) { c.mu.Lock(); c.n++; c.sum += v; c.mu.Unlock() }

// TestAdv67WaitGuardRandomRaces drives a guard with a 2ms wait timeout
// through random sequences of what the proxy tells it (WroteHeaders,
// Retrying refused or not, WaitLeft), with sleeps around the timeout so
// that its timer fires before, between and during them, then ends it as
// RoundTrip does, and checks what must hold whatever the timing:
//   - the context ended by the wait timeout (cause errWaitTimeout) if and
//     only if expired() says so: classify's answer depends on it;
//   - nothing ends the context after end that had not timed out by then;
//   - a request whose wait timed out is not observed as served; one that
//     was served and not timed out is observed once;
//   - a Retrying(true) that finds more than the wait timeout spent since
//     the guard was last armed leaves it expired;
//   - WaitLeft is never more than the wait timeout, and is 0 only while
//     disarmed.
func TestAdv67WaitGuardRandomRaces(t *testing.T) {
	const d = 2 * time.Millisecond
	r := rand.New(rand.NewPCG(67, 67))
	sleep := func() {
		if r.IntN(3) > 0 {
			time.Sleep(time.Duration(r.IntN(int(2 * d))))
		}
	}
	for i := range 300 {
		var waited adv67Waits
		g := newWaitGuard(context.Background(), d, &waited, time.Now())
		armedAt := time.Now()
		steps := r.IntN(5)
		for range steps {
			sleep()
			if l := g.WaitLeft(); l > d {
				t.Fatalf("iteration %d: WaitLeft %v past the wait timeout %v", i, l, d)
			}
			g.WroteHeaders()
			sleep()
			refused := r.IntN(2) == 0
			spent := time.Since(armedAt) > d
			g.Retrying(refused)
			if refused && spent && !g.expired() {
				t.Fatalf("iteration %d: Retrying(true) after more than the wait timeout since the guard was armed left it unexpired", i)
			}
			// (That the context has ended by then too is
			// TestAdv67RetryingAfterAFireCommittedEndsTheWait's.)
			if g.expired() {
				break
			}
			if !refused {
				armedAt = time.Now()
			}
		}
		sleep()
		served := r.IntN(2) == 0 && !g.expired()
		if served {
			g.WroteHeaders()
		}
		g.end(served)
		errAtEnd, expAtEnd := g.ctx.Err(), g.expired()
		time.Sleep(3 * d) // a timer that was to fire has
		// A fire that decided before end cancels after it: that is a
		// fire before end, and expired() said so at end.
		if errAtEnd == nil && !expAtEnd && g.ctx.Err() != nil {
			t.Fatalf("iteration %d: the context ended (%v) after end", i, context.Cause(g.ctx))
		}
		timedOut := errors.Is(context.Cause(g.ctx), errWaitTimeout)
		if exp := g.expired(); exp != timedOut {
			t.Fatalf("iteration %d: expired() %v, but the context's cause is %v", i, exp, context.Cause(g.ctx))
		}
		waited.mu.Lock()
		n := waited.n
		waited.mu.Unlock()
		switch {
		case timedOut && n != 0:
			t.Fatalf("iteration %d: a timed-out wait observed %d times", i, n)
		case !timedOut && served && n != 1:
			t.Fatalf("iteration %d: a served request observed %d times", i, n)
		case n > 1:
			t.Fatalf("iteration %d: observed %d times", i, n)
		}
		g.cancel()
	}
}

// TestAdv67RetryingAfterAFireCommittedEndsTheWait: the proxy decides
// whether a refusal spent the request's wait by reading ctx.Err() right
// after Retrying returns (proxy/transport.go): a guard that has timed out
// must have ended its context by then. fire decides under the lock
// (timedOut = true) but cancels after releasing it, so a Retrying that
// runs in between and finds timedOut must end the context itself. Else
// the proxy sends a retry that could only find the context done, and the
// request fails with that retry's error (a pool wait's, say) rather than
// the owner's refusal (classify: busy or wait_timeout, not owner_busy).
//
// With one P, the mutex's starvation mode hands the lock from fire's
// Unlock straight to the waiting caller and parks fire before its
// cancelCause: the caller writes the head (WroteHeaders, a no-op on the
// fired guard) and is told of the refusal (Retrying(true)) in that gap.
func TestAdv67RetryingAfterAFireCommittedEndsTheWait(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const d = 10 * time.Millisecond
	var failures int
	const tries = 5
	for range tries {
		g := newWaitGuard(context.Background(), d, nil, time.Now())
		g.mu.Lock()
		time.Sleep(d + 20*time.Millisecond) // the timer fires; fire waits for the lock
		type result struct {
			expired bool
			err     error
		}
		got := make(chan result, 1)
		go func() {
			g.WroteHeaders()   // the head reached the sibling
			g.Retrying(true)   // which refused it
			err := g.ctx.Err() // what the proxy reads next
			got <- result{g.expired(), err}
		}()
		time.Sleep(5 * time.Millisecond) // the caller waits for the lock behind fire
		g.mu.Unlock()
		g.mu.Lock() // barge: fire, woken, finds it held past 1ms and starves the mutex
		time.Sleep(2 * time.Millisecond)
		g.mu.Unlock() // handed to fire, which hands it to the caller as it unlocks
		r := <-got
		if r.expired && r.err == nil {
			failures++
		}
		g.cancel()
	}
	if failures > 0 {
		t.Errorf("%d of %d times Retrying(true) returned with the guard expired and its context live: the proxy sends a retry", failures, tries)
	}
}
