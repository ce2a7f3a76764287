package proxy

import "context"

// wroteHeadersKey is the context key of the function WithWroteHeaders sets.
type wroteHeadersKey struct{}

// WithWroteHeaders returns a copy of ctx under which the transport calls fn
// once a request's head is written: onto its upstream connection, or onto
// the stream to the sibling that relays it. It is httptrace's WroteHeaders
// for a caller whose context already carries a trace, as reverse_proxy's
// does (for 1xx responses): httptrace.WithClientTrace joins two traces by
// reflection, a cost of the same order as the rest of this transport's
// bookkeeping for a request, where the transport adds fn to the trace it
// writes the request with.
func WithWroteHeaders(ctx context.Context, fn func()) context.Context {
	return context.WithValue(ctx, wroteHeadersKey{}, fn)
}

// wroteHeaders is the function WithWroteHeaders set on ctx, if any.
func wroteHeaders(ctx context.Context) func() {
	fn, _ := ctx.Value(wroteHeadersKey{}).(func())
	return fn
}
