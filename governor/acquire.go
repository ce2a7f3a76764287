package governor

import "context"

const (
	usedMask  = 1<<32 - 1 // workers in use, in the low half of Governor.state
	oneWaiter = 1 << 32   // one queued waiter, in the high half
)

// AcquireMany acquires up to want workers, and the memory they need, in one
// call.
//
// It grants min(want, free workers, free memory / perWorkerBytes), blocking
// only while no worker is free at all, and never grants fewer than one: a
// single over-budget worker beats no progress. A want below 1 is treated as 1.
//
// Granting that floor worker can push [Governor.ReservedBytes] past the
// memory limit, by less than one worker's demand per grant, but the bound
// does not sum across grants: eight concurrent callers each asking for one
// worker each see a free worker, each floor to one and each charge
// perWorkerBytes, so the reserved total can reach workers × perWorkerBytes
// whatever the limit. The memory budget therefore bounds voluntary
// parallelism, not reserved bytes; the hard ceiling is the worker count. That
// over-commitment is the price of the progress guarantee: a caller that would
// otherwise wait forever runs over budget instead of never running.
//
// Acquire once. A unit takes its whole allocation in one call and does not
// acquire again while holding: four units each holding one worker and each
// blocking for a second would never progress. Getting fewer workers than
// asked is fine, the work runs slower. Code that must ask again while holding
// uses [Governor.AcquireManyContext] with [WithLease], which never waits.
//
// Waiters are served in arrival order.
func (g *Governor) AcquireMany(want int, perWorkerBytes uint64) *LeaseSet {
	k, b, _ := g.acquire(nil, want, perWorkerBytes)
	return g.newLease(k, b, false)
}

// AcquireManyContext is [Governor.AcquireMany] with a wait that ends with ctx.
//
// If ctx is done before a worker is granted it returns ctx.Err() and holds
// nothing; a grant that races with the cancellation is passed on to the next
// waiter rather than lost.
//
// If ctx carries an unreleased lease of this governor (see [WithLease]), the
// caller is already running on one of that lease's workers, so the call never
// waits: it counts that worker as the first of the grant (charging nothing
// for it again) and adds only extra workers that are free right now.
func (g *Governor) AcquireManyContext(ctx context.Context, want int, perWorkerBytes uint64) (*LeaseSet, error) {
	k, b, borrowed, err := g.acquireContext(ctx, want, perWorkerBytes)
	if err != nil {
		return nil, err
	}
	return g.newLease(k, b, borrowed), nil
}

// Acquire blocks until one worker is free and takes it, charging no memory.
func (g *Governor) Acquire() *LeaseSet {
	k, _, _ := g.acquire(nil, 1, 0)
	return g.newLease(k, 0, false)
}

// TryAcquire takes one worker if one is free now, and never blocks.
func (g *Governor) TryAcquire() (*LeaseSet, bool) {
	k, b := g.try(1, 0, 1)
	if k == 0 {
		return nil, false
	}
	return g.newLease(k, b, false), true
}

// TryAcquireMany is [Governor.AcquireMany] without the wait: when no worker is
// free, or others are already queued for one, it reports false at once.
func (g *Governor) TryAcquireMany(want int, perWorkerBytes uint64) (*LeaseSet, bool) {
	k, b := g.try(uint64(max(want, 1)), clampPerWorker(perWorkerBytes), 1)
	if k == 0 {
		return nil, false
	}
	return g.newLease(k, b, false), true
}

func (g *Governor) acquireContext(ctx context.Context, want int, per uint64) (k, b uint64, borrowed bool, err error) {
	if err := ctx.Err(); err != nil {
		return 0, 0, false, err
	}
	if parent, ok := ctx.Value(leaseKey{}).(*LeaseSet); ok && parent != nil && parent.gov() == g && !parent.released() {
		extra := uint64(max(want, 1)) - 1
		if extra != 0 {
			k, b = g.try(extra, clampPerWorker(per), 0)
		}
		return k, b, true, nil
	}
	k, b, err = g.acquire(ctx, want, per)
	return k, b, false, err
}

// try grants without waiting: at least floor workers if any worker is free and
// nobody is queued, otherwise nothing.
func (g *Governor) try(want, per, floor uint64) (k, b uint64) {
	for {
		s := g.state.Load()
		if k, b, ok := g.claim(s, want, per, floor); ok {
			return k, b
		} else if k == 0 {
			return 0, 0
		}
	}
}

// claim makes one attempt to take workers from state s: up to want of them,
// at least floor, within the memory free, and none if a waiter is queued
// (queued waiters have priority, which is what keeps service in arrival
// order). k == 0 means there is nothing to take; !ok with k != 0 means s went
// stale and the caller should retry with a fresh one.
//
// Memory is charged first, by a compare-and-swap on the reserved total, so a
// grant's size is decided against an exact total; the worker count is then
// claimed against s, and the charge undone if s moved. No lock is needed, and
// two grants cannot both fit into the same free memory.
func (g *Governor) claim(s, want, per, floor uint64) (k, b uint64, ok bool) {
	used := s & usedMask
	if s>>32 != 0 || used >= g.workers || want == 0 {
		return 0, 0, false
	}
	free := g.workers - used
	if per == 0 {
		k = min(want, free)
		return k, 0, g.state.CompareAndSwap(s, s+k)
	}
	r := g.reserved.Load()
	k = max(g.fit(want, free, per, r), floor)
	if k == 0 {
		return 0, 0, false
	}
	b = k * per
	if !g.reserved.CompareAndSwap(r, r+b) {
		return k, b, false
	}
	if !g.state.CompareAndSwap(s, s+k) {
		g.reserved.Add(-b)
		return k, b, false
	}
	return k, b, true
}

// acquire grants at least one worker, waiting while none is free. A nil ctx
// waits forever.
func (g *Governor) acquire(ctx context.Context, want int, per uint64) (k, b uint64, err error) {
	w := uint64(max(want, 1))
	per = clampPerWorker(per)
	if k, b := g.try(w, per, 1); k != 0 {
		return k, b, nil
	}
	return g.acquireSlow(ctx, w, per)
}

func (g *Governor) acquireSlow(ctx context.Context, want, per uint64) (k, b uint64, err error) {
	g.mu.Lock()
	for {
		s := g.state.Load()
		if s>>32 == 0 && s&usedMask < g.workers {
			if k, b, ok := g.claim(s, want, per, 1); ok {
				g.mu.Unlock()
				return k, b, nil
			}
			continue
		}
		// Registering in the same word a releaser checks means a release
		// either happened before this CAS (and the retry sees the free
		// worker) or sees the waiter and serves the queue.
		if g.state.CompareAndSwap(s, s+oneWaiter) {
			break
		}
	}
	wt := &waiter{want: want, per: per, ready: make(chan struct{})}
	wt.elem = g.queue.PushBack(wt)
	g.mu.Unlock()

	var done <-chan struct{}
	if ctx != nil {
		done = ctx.Done()
	}
	select {
	case <-wt.ready:
		return wt.granted, wt.granted * per, nil
	case <-done:
	}
	g.mu.Lock()
	if wt.granted != 0 {
		// Granted as the context ended: hand it on rather than lose it.
		g.mu.Unlock()
		g.release(wt.granted, wt.granted*per)
		return 0, 0, ctx.Err()
	}
	g.queue.Remove(wt.elem)
	g.state.Add(^uint64(oneWaiter - 1))
	g.mu.Unlock()
	return 0, 0, ctx.Err()
}

// release returns k workers and b bytes, and serves queued waiters in order.
func (g *Governor) release(k, b uint64) {
	if b != 0 {
		g.reserved.Add(-b)
	}
	for {
		s := g.state.Load()
		if s>>32 != 0 {
			break
		}
		if g.state.CompareAndSwap(s, s-k) {
			return
		}
	}
	g.mu.Lock()
	g.state.Add(-k)
	g.serveLocked()
	g.mu.Unlock()
}

// serveLocked grants free workers to queued waiters in arrival order. Each
// waiter gets at least one worker, so memory never holds the queue up; on
// return either the queue is empty or every worker is in use, which is why a
// waiter that gives up never has to wake the next one.
func (g *Governor) serveLocked() {
	for e := g.queue.Front(); e != nil; e = g.queue.Front() {
		wt := e.Value.(*waiter)
		s := g.state.Load()
		used := s & usedMask
		if used >= g.workers {
			return
		}
		// While a waiter is queued no lock-free claim can succeed, so only
		// the memory charge can race (with a claim about to be undone).
		r := g.reserved.Load()
		k := max(g.fit(wt.want, g.workers-used, wt.per, r), 1)
		if !g.reserved.CompareAndSwap(r, r+k*wt.per) {
			continue
		}
		if !g.state.CompareAndSwap(s, s+k-oneWaiter) {
			g.reserved.Add(-(k * wt.per))
			continue
		}
		g.queue.Remove(wt.elem)
		wt.granted = k
		close(wt.ready)
	}
}
