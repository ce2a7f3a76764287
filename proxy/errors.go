package proxy

import "errors"

// Sentinel errors. Match them with errors.Is; the concrete error a round trip
// returns is usually an [*Error] that wraps one of them.
var (
	// ErrLeaseRefused means the owner process refused a lease (stale,
	// aged out, or the owner is draining). Nothing reached the upstream.
	ErrLeaseRefused = errors.New("proxy: lease refused by owner")
	// ErrOwnerFailed means the owner accepted the lease but could not
	// complete the exchange with the upstream and said so.
	ErrOwnerFailed = errors.New("proxy: owner failed the request")
	// ErrOwnerGone means the stream to the owner process broke: it exited,
	// was killed, or closed the stream.
	ErrOwnerGone = errors.New("proxy: owner process gone")
	// ErrBadResponse means the upstream (or an owner relaying it) sent
	// something that is not a valid HTTP/1.1 response. A gateway answers 502.
	ErrBadResponse = errors.New("proxy: malformed upstream response")
	// ErrHeaderTooLarge means the response header exceeded the configured
	// limit.
	ErrHeaderTooLarge = errors.New("proxy: response header too large")
	// ErrRequestHeaderTooLarge means an owner refused a sibling's request
	// head over its header limit (see peerHeadLimit) before sending any of
	// it upstream.
	ErrRequestHeaderTooLarge = errors.New("proxy: request header too large")
	// ErrConnBroken means the upstream connection failed while the request
	// was being written or the response read.
	ErrConnBroken = errors.New("proxy: upstream connection broken")
	// ErrResponseHeaderTimeout means the upstream sent no response header in
	// time.
	ErrResponseHeaderTimeout = errors.New("proxy: timeout awaiting response headers")
	// ErrBadFrame means a peer sent a frame that does not decode.
	ErrBadFrame = errors.New("proxy: malformed frame")
	// ErrNoCapacity means no connection could be had before the deadline.
	ErrNoCapacity = errors.New("proxy: no upstream connection available before deadline")
	// ErrNotAdmitted means the admission backstop ([governor.Admission])
	// refused to start more work in this process, or in the owner process
	// for a lease: too many connections or forwarded exchanges at once.
	// Nothing reached the upstream.
	ErrNotAdmitted = errors.New("proxy: admission refused: too much work in flight")
	// ErrOwnerBusy means the owner process had no worker of its budget free
	// before the request's deadline (or its lease's hold time) came near,
	// and rejected the lease rather than let it age out. Nothing reached the
	// upstream.
	ErrOwnerBusy = errors.New("proxy: owner had no room before the deadline")
	// ErrClosed means the transport or server was closed.
	ErrClosed = errors.New("proxy: closed")
)

// errOwnerLeaving is an owner's refusal of a lease because it is leaving the
// fleet, as it sends it and as its sibling reads it back: the request's later
// attempts keep off its connections.
var errOwnerLeaving = errors.New("the owner is leaving the fleet")

// errLeaseGone is an owner's refusal of a lease because the connection it
// names is gone (closed, or draining: a GOAWAY, its idle timeout), as its
// sibling reads it back.
var errLeaseGone = errors.New("the connection is gone")

// errMalformedRequestHead is an owner's refusal of a sibling's request head
// that does not parse (see refuseHead), as it sends it and as its sibling
// reads it back: the sibling then knows the stream ends with the refusal.
var errMalformedRequestHead = errors.New("proxy: malformed request head")

// headRefused reports whether err is an owner's refusal of the request
// head (refuseHead), after which the owner closes the stream: the refusal
// does not leave it in step, as other refusals before the accept do.
func headRefused(err error) bool {
	return errors.Is(err, ErrRequestHeaderTooLarge) || errors.Is(err, errMalformedRequestHead)
}

// Error describes a failed round trip.
//
// RetrySafe reports that nothing of the request could have reached the
// upstream (the dial failed, a lease was refused, or a reused connection
// failed before a byte was written), so the caller may send the request again,
// to this upstream or another, whatever its method. A gateway maps such an
// error to a dial error; anything else is a 502 for this request. Unlike
// net/http's, RoundTrip may have read a short request body (at most 4 KiB)
// before it failed, even a dial: a caller that sends the request again
// sends what it read (as the Caddy module does) or a body from GetBody.
type Error struct {
	Op        string // "dial", "write", "read", "lease", "owner", ...
	RetrySafe bool
	Err       error

	// idleClosed marks a reused connection that closed before sending any
	// response byte: the upstream probably timed it out as we sent. net/http
	// sends a replayable request again in that case, and so does Transport;
	// also after a new connection dialed where a sibling's could have
	// served the request (conn.relayPaid).
	idleClosed bool
	// counted marks a RetrySafe decided by the count of bytes written
	// while the request writer may still have been writing: a write under
	// way counts as written until it returns, so the exchange settles it
	// again once its writer has stopped (see exchange.recount).
	counted bool
	// responseBegan marks an owner's error frame sent after some of the
	// upstream's response had come (flagResponseBegan).
	responseBegan bool
	// beforeAccept marks an owner's reject or error frame that came before
	// it accepted the request's body: neither end read or sent any of the
	// body, and both keep the stream.
	beforeAccept bool
	// ownerDown marks an owner this attempt could not reach: the dial to
	// it failed, or a stream dialed for the attempt broke before it
	// answered. It is dying or gone (a dying process's listener still
	// takes dials, and resets them), while its connections may still be
	// in the table: the request's later attempts keep off them.
	ownerDown bool
	// freeRetry marks a refusal whose retry costs none of MaxRetries: the
	// first lease on a connection that its owner refused as gone
	// (errLeaseGone), or the first stream a connection refused as it went
	// away (connGone). Either connection is leaving the pool, and the
	// request's later attempts keep off it (see avoided.goneConns), so no
	// one connection refuses the request twice for free, as net/http
	// sends a request again past every dead connection of its pool; and since
	// new connections keep coming, RoundTrip allows no more free retries
	// than the fleet had connections to the upstream at the first, and one
	// (see Transport.freeRetries).
	freeRetry bool
	// connGone marks a stream an HTTP/2 connection refused, retry-safe,
	// for good: its upstream's GOAWAY left the stream out, or the
	// connection could take no stream. An owner that relayed the stream
	// says so (flagConnGone). The connection takes none again, so it can
	// refuse a request so once: the first time, the retry costs none of
	// MaxRetries (see freeRetry), as a graceful restart of the upstream
	// GOAWAYs every pooled connection at once.
	connGone bool
}

func (e *Error) Error() string {
	if e.Op == "" {
		return e.Err.Error()
	}
	return "proxy: " + e.Op + ": " + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// IsRetrySafe reports whether err says that nothing of the request could have
// reached the upstream.
func IsRetrySafe(err error) bool {
	var pe *Error
	return errors.As(err, &pe) && pe.RetrySafe
}
