package proxy

import (
	"context"
	"time"
)

// A WaitWatcher is told when a request's wait for a connection ends and
// when it begins again. The Caddy module's wait timeout bounds the wait and
// not the exchange that follows, so it needs both.
type WaitWatcher interface {
	// WroteHeaders is called once the request's head is written: onto its
	// upstream connection, or onto the stream to the sibling that relays
	// it. It does what a trace's WroteHeaders does, without a second
	// trace: httptrace.WithClientTrace joins a trace to one the context
	// already carries (reverse_proxy puts one on every request) by
	// reflection, which cost the workers about as much CPU as the pool's
	// Acquire.
	WroteHeaders()
	// Retrying is called before the transport sends the request again
	// after an attempt failed (a sibling that refused it, a reused
	// connection that closed before answering, a failed dial): the request
	// waits for a connection again, though WroteHeaders may have been
	// called for the attempt that failed. refused reports that the
	// attempt was refused before any work upstream, by the sibling owning
	// its connection (busy, leaving, its connection gone) or by an HTTP/2
	// connection going away: the time since WroteHeaders was spent
	// waiting for a connection too.
	Retrying(refused bool)
	// WaitLeft is how much longer the request may wait for a connection,
	// or 0 for no bound. It is asked when the request goes to a sibling
	// that owns the connection, which waits for a worker of its own no
	// longer (see App.Workers in the Caddy module).
	WaitLeft() time.Duration
	// OwnerWaited is called when the sibling that owns the request's
	// connection accepts the request after it waited d for a worker of
	// its own: the request had its connection only then, d after the
	// sibling read its head, which WroteHeaders told. It is called on the
	// goroutine reading the response, perhaps before WroteHeaders returns.
	OwnerWaited(d time.Duration)
}

// waitWatcherKey is the context key of WithWaitWatcher's watcher.
type waitWatcherKey struct{}

// WithWaitWatcher returns a copy of ctx under which the transport tells w
// of the request's waits.
func WithWaitWatcher(ctx context.Context, w WaitWatcher) context.Context {
	return context.WithValue(ctx, waitWatcherKey{}, w)
}

// waitWatcher is the watcher WithWaitWatcher set on ctx, if any.
func waitWatcher(ctx context.Context) WaitWatcher {
	w, _ := ctx.Value(waitWatcherKey{}).(WaitWatcher)
	return w
}
