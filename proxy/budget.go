package proxy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/orbitproxy/orbit/backpressure"
	"github.com/orbitproxy/orbit/orbitpool"
)

// Exchange memory. An exchange copies a request body to its connection (see
// countWriter.ReadFrom) and an owner relays a response body to its sibling
// (relay.copyBody) through buffers of exchangeBuf bytes each; the number of
// buffers is what it was granted by the process's governor, which charges
// exchangeBuf per buffer to its memory budget. A large body asks for
// maxExchangeBufs and streams in larger writes; when memory is short it gets
// fewer, never fewer than one, and streams in smaller ones.
const (
	// exchangeBuf is one exchange buffer.
	exchangeBuf = 32 << 10
	// maxExchangeBufs is the most buffers one exchange asks for.
	maxExchangeBufs = 8
	// largeBody is the request body length from which an exchange asks for
	// more than one buffer; a body of unknown length counts as large.
	largeBody = 1 << 20
)

// copyBufs[k-1] holds buffers of k exchange buffers.
var copyBufs [maxExchangeBufs]sync.Pool

func getCopyBuf(k int) *[]byte {
	k = min(max(k, 1), maxExchangeBufs)
	if bp, ok := copyBufs[k-1].Get().(*[]byte); ok {
		return bp
	}
	b := make([]byte, k*exchangeBuf)
	return &b
}

func putCopyBuf(bp *[]byte) {
	k := len(*bp) / exchangeBuf
	if k >= 1 && k <= maxExchangeBufs && len(*bp) == k*exchangeBuf {
		copyBufs[k-1].Put(bp)
	}
}

// bufsFor is how many exchange buffers an exchange whose request body has
// length n (-1: unknown) asks for.
func bufsFor(hasBody bool, n int64) int {
	if hasBody && (n < 0 || n >= largeBody) {
		return maxExchangeBufs
	}
	return 1
}

// claimVerdict is seed 001's check at a claim point: ctx done (its deadline
// as backpressure.ErrDeadlineElapsed), at or past the deadline, or within
// window of it, nothing new may start.
func claimVerdict(ctx context.Context, window time.Duration) error {
	if err := ctx.Err(); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return backpressure.ErrDeadlineElapsed
		}
		return err
	}
	dl, _ := ctx.Deadline()
	return backpressure.Verdict(time.Now(), dl, window)
}

// waitContext bounds a wait at a claim point: it ends when ctx does, or when
// ctx's deadline comes within window, whichever is first. waitEnd tells the
// two apart.
func waitContext(ctx context.Context, window time.Duration) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok && window > 0 {
		return context.WithDeadline(ctx, dl.Add(-window))
	}
	return ctx, func() {}
}

// waitEnd is the error of a wait under waitContext(ctx) that ended with err:
// ctx's own end is reported as it is; the wait's earlier end as
// backpressure.ErrDeadlineNear.
func waitEnd(ctx context.Context, err error) error {
	if ctx.Err() != nil || !isContextErr(err) {
		return err
	}
	return fmt.Errorf("%w: %w", backpressure.ErrDeadlineNear, err)
}

// isRefusal reports whether err is a decision not to start the request
// (its deadline, the admission backstop, or a full table it waited on for
// as long as its deadline let it), which sending it again at once would
// only repeat.
func isRefusal(err error) bool {
	return errors.Is(err, backpressure.ErrDeadlineNear) || errors.Is(err, backpressure.ErrDeadlineElapsed) ||
		errors.Is(err, ErrNotAdmitted) || errors.Is(err, orbitpool.ErrFull)
}

// refusedUnserved reports whether err refused its attempt before any work
// upstream, once the request's head was out: a sibling that refused its
// lease (busy, leaving, its connection gone), or an HTTP/2 connection that
// refused its stream as it went away (Error.connGone). The request did not
// have its connection (see WaitWatcher.Retrying).
func refusedUnserved(err error) bool {
	var pe *Error
	return errors.Is(err, ErrLeaseRefused) || errors.As(err, &pe) && pe.connGone
}

// avoided is what one request's attempts keep off: owners that rejected it
// for want of room in time (busy, by lane), owners leaving the fleet or
// gone (by lane and incarnation: a process that takes the lane next is not
// the one that left), and connections leaving the pool.
type avoided struct {
	busy    []int
	leaving []leftOwner
	// goneConns are the connections that refused the request as they left
	// the pool: a lease refused as gone, a stream refused as an HTTP/2
	// connection went away (see Error.connGone), a local HTTP/1.1 one
	// found closed or spent. Until its owner unregisters it, such a
	// connection is still in the pool with room, and a retry that took it
	// again would be refused again, as fast: a few such retries spend the
	// request's allowance in a millisecond, and the request fails where
	// net/http would have dialed. Kept off, the retry waits for the
	// connection's unit instead, or takes another.
	goneConns []orbitpool.ResourceID
	// freeLeft is how many free retries the request has left, once
	// counted (freeCounted) at its first.
	freeLeft    int
	freeCounted bool
}

// any reports whether the request has anything to keep off.
func (a *avoided) any() bool { return len(a.busy)+len(a.leaving)+len(a.goneConns) > 0 }

// keepOff records that connection id refused the request as it left the
// pool, and reports whether it had not before.
func (a *avoided) keepOff(id orbitpool.ResourceID) bool {
	if slices.Contains(a.goneConns, id) {
		return false
	}
	a.goneConns = append(a.goneConns, id)
	return true
}

// freeRetry reports whether err's retry costs none of MaxRetries
// (Error.freeRetry) and is within the request's allowance of such
// retries, which allowance counts at the first; it spends one.
func (a *avoided) freeRetry(err error, allowance func() int) bool {
	var pe *Error
	if !errors.As(err, &pe) || !pe.freeRetry {
		return false
	}
	if !a.freeCounted {
		a.freeLeft, a.freeCounted = allowance(), true
	}
	if a.freeLeft == 0 {
		return false
	}
	a.freeLeft--
	return true
}

// goneOnce records connection id as gone if err says it refused the
// request as it left the pool (a lease refused as gone, or a stream refused
// as an HTTP/2 connection went away), and makes err's retry free
// (Error.freeRetry) if it is the first time it refused the request so.
func (a *avoided) goneOnce(err error, id orbitpool.ResourceID) {
	var pe *Error
	if errors.As(err, &pe) && (pe.connGone || errors.Is(err, errLeaseGone)) && a.keepOff(id) {
		pe.freeRetry = true
	}
}

// leftOwner is an owner that left, or is leaving, lane.
type leftOwner struct {
	lane  int
	owner orbitpool.Incarnation
}

// avoidPolicy is a policy that reuses no connection a request's earlier
// attempts found leaving the pool, and none of the lanes they were
// rejected by. A retry then dials or uses another connection, as the inner
// policy decides over what is left; when what is left would only make it
// wait, the inner policy decides over everything but the leaving owners and
// connections, since a busy owner may have room again sooner than anything
// else, and a leaving one never will.
type avoidPolicy struct {
	inner orbitpool.Policy
	avoid *avoided
	pool  *orbitpool.Pool // whose lanes' incarnations tell a leaving owner's successor
	left  []int           // lanes still held by an owner that is leaving
	keep  []orbitpool.Candidate
	index []int // of keep's candidates in the full view
}

// Decide implements orbitpool.Policy.
func (p *avoidPolicy) Decide(v *orbitpool.View) orbitpool.Decision {
	// A lane that changed hands since its owner refused as leaving (or was
	// found gone) is a new process's, whose connections serve like any
	// other: under a cap they may be all the key has, and a request that
	// kept off them would wait out its deadline. Looked at on every
	// decision, for a request may wait on the pool for that long.
	p.left = p.left[:0]
	for _, o := range p.avoid.leaving {
		if p.pool.LaneIncarnation(o.lane) == o.owner {
			p.left = append(p.left, o.lane)
		}
	}
	d, filtered := p.decideWithout(v, p.avoid.busy, p.left)
	if filtered && d.Action == orbitpool.ActionWait && len(p.avoid.busy) > 0 {
		d, _ = p.decideWithout(v, p.left)
	}
	return d
}

// decideWithout is the inner policy's decision over v's candidates outside
// the lanes named and the connections gone, and whether any were left out.
func (p *avoidPolicy) decideWithout(v *orbitpool.View, lanes ...[]int) (orbitpool.Decision, bool) {
	p.keep, p.index = p.keep[:0], p.index[:0]
	for i, c := range v.Candidates {
		if !slices.ContainsFunc(lanes, func(ls []int) bool { return slices.Contains(ls, c.Lane) }) &&
			!slices.Contains(p.avoid.goneConns, c.ID) {
			p.keep = append(p.keep, c)
			p.index = append(p.index, i)
		}
	}
	if len(p.keep) == len(v.Candidates) {
		return p.inner.Decide(v), false
	}
	w := *v
	w.Candidates = p.keep
	d := p.inner.Decide(&w)
	if d.Action == orbitpool.ActionReuse && d.Candidate >= 0 && d.Candidate < len(p.index) {
		d.Candidate = p.index[d.Candidate]
	}
	return d, true
}
