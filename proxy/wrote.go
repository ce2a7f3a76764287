package proxy

import "context"

// wroteHeadersKey is the context key of the function WithWroteHeaders sets.
type wroteHeadersKey struct{}

// WithWroteHeaders returns a copy of ctx under which the transport calls fn
// once a request's head is written: onto its upstream connection, or onto
// the stream to the sibling that relays it. It does what a trace's
// WroteHeaders does, without a second trace: httptrace.WithClientTrace joins
// a trace to one the context already carries (reverse_proxy puts one on
// every request) by reflection, which cost the workers about as much CPU as
// the pool's Acquire.
func WithWroteHeaders(ctx context.Context, fn func()) context.Context {
	return context.WithValue(ctx, wroteHeadersKey{}, fn)
}

// wroteHeaders is the function WithWroteHeaders set on ctx, if any.
func wroteHeaders(ctx context.Context) func() {
	fn, _ := ctx.Value(wroteHeadersKey{}).(func())
	return fn
}
