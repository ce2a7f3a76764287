package backpressure

import "sync/atomic"

// Permit is the right to run one unit of work under a [Limiter]'s cap.
type Permit struct {
	p        *pool
	released atomic.Bool
}

// Release gives the permit back, handing it to the longest waiter if there is
// one. Only the first call has an effect, so a deferred Release is safe
// alongside an early one. Release on a nil Permit does nothing.
func (pm *Permit) Release() {
	if pm == nil || !pm.released.CompareAndSwap(false, true) {
		return
	}
	pm.p.release()
}
