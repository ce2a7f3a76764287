package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/orbitproxy/orbit/orbitpool"
)

// peers keeps persistent unix streams to sibling processes: an idle list per
// owner lane, most recently used first. An exchange takes a stream from the
// list and puts it back when the response is over; a 101 takes it for good.
type peers struct {
	dir     string
	maxIdle int // per lane
	log     *zap.Logger

	mu     sync.Mutex
	idle   map[int][]*conn
	closed bool
}

const defaultMaxIdlePeerConns = 64

// peerIdleTimeout is how long a stream to a sibling may sit idle before the
// client stops using it. The owner closes streams idle twice as long, so a
// client never picks a stream its owner is closing.
const peerIdleTimeout = time.Minute

func newPeers(dir string, maxIdle int) *peers {
	if maxIdle <= 0 {
		maxIdle = defaultMaxIdlePeerConns
	}
	return &peers{dir: dir, maxIdle: maxIdle, idle: make(map[int][]*conn)}
}

// get returns an idle stream to lane's owner, the process of incarnation
// owner, or dials one. A stream dialed for another incarnation of the lane
// is closed instead: its process has left the lane, and what it may have
// said before it went (a refusal as closing, unasked) is not the word of
// the owner the lease names.
func (p *peers) get(ctx context.Context, lane int, owner orbitpool.Incarnation) (*conn, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	for list := p.idle[lane]; len(list) > 0; list = p.idle[lane] {
		c := list[len(list)-1]
		p.idle[lane] = list[:len(list)-1]
		p.mu.Unlock()
		// Whatever came on the stream while it sat idle would be read as
		// the next exchange's answer: it is looked for (one non-blocking
		// peek), as before reusing an upstream connection. Usually it is
		// the refusal an owner leaves as it closes, and the stream goes
		// before the request is sent rather than after.
		if c.peerOwner == owner && time.Since(c.idleAt) < peerIdleTimeout && !c.closed.Load() {
			sample, err := c.idleCheck()
			if err == nil {
				return c, nil
			}
			if errors.Is(err, errUnsolicited) && !isRefusalFrame(sample) && p.log != nil {
				p.log.Warn("closing stream to sibling: it sent bytes nobody asked for",
					zap.Int("lane", lane), zap.ByteString("starting_with", sample))
			}
		}
		c.close()
		p.mu.Lock()
	}
	p.mu.Unlock()
	uc, err := dialUnix(ctx, SocketPath(p.dir, lane))
	if err != nil {
		return nil, &Error{Op: "dial owner", RetrySafe: true, ownerDown: true, Err: fmt.Errorf("%w: %w", ErrOwnerGone, err)}
	}
	c := newConn(uc, uc)
	c.peerOwner = owner
	return c, nil
}

// isRefusalFrame reports whether b begins with a refusal frame, what an owner
// leaves on a stream it closes (see server.close).
func isRefusalFrame(b []byte) bool {
	return len(b) >= 4 && b[0] == frameMagic0 && b[1] == frameMagic1 && b[2] == frameVersion && frameType(b[3]) == frameReject
}

func (p *peers) put(lane int, c *conn, o outcome) {
	if o != outcomeReusable {
		if o == outcomeBroken {
			c.close()
		}
		return
	}
	if c.br.Buffered() != 0 {
		// The owner sent more than the answer to this exchange: never
		// read as the next one's (net/http closes a connection with an
		// unsolicited response on it). A refusal the owner leaves as it
		// closes the stream ends up here too, and it is closing anyway.
		c.close()
		return
	}
	c.idleAt = time.Now()
	p.mu.Lock()
	if p.closed || len(p.idle[lane]) >= p.maxIdle {
		p.mu.Unlock()
		c.close()
		return
	}
	p.idle[lane] = append(p.idle[lane], c)
	p.mu.Unlock()
}

// dropLane closes the idle streams to a lane whose owner is gone.
func (p *peers) dropLane(lane int) {
	p.mu.Lock()
	list := p.idle[lane]
	delete(p.idle, lane)
	p.mu.Unlock()
	for _, c := range list {
		c.close()
	}
}

func (p *peers) close() {
	p.mu.Lock()
	p.closed = true
	all := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, list := range all {
		for _, c := range list {
			c.close()
		}
	}
}

// remoteOpts are the client-side limits of a remote exchange.
type remoteOpts struct {
	maxHeaderBytes        int64
	expectContinueTimeout time.Duration
	responseHeaderTimeout time.Duration
}

// roundTrip sends req to the owner of lane under lease and returns its
// response, whose Body streams from the owner. A refused lease or an owner
// that reports failure before answering comes back as an *Error wrapping
// ErrLeaseRefused or ErrOwnerFailed.
func (p *peers) roundTrip(req *http.Request, lane int, lease orbitpool.Lease, o *remoteOpts, bufs int, onDone func()) (*http.Response, error) {
	hopMark(hopStart)
	ctx := req.Context()
	ect := o.expectContinueTimeout
	if ect == 0 && req.Body != nil && req.Body != http.NoBody && expectsContinue(req) {
		// With no wait for the upstream's 100, a local exchange starts
		// reading the body at once, as net/http's does, and a server
		// reading that body tells its client to continue at once. Here
		// the body waits for the owner's accept; an empty read now still
		// tells the client, whatever the upstream answers. Transport
		// gives every body as a trackBody.
		if tb, ok := req.Body.(*trackBody); ok {
			tb.nudge()
		}
	}
	orig := req
	req, withHead := withBodyAhead(req)
	c, err := p.get(ctx, lane, lease.Owner)
	if err != nil {
		return nil, err
	}
	dl, _ := ctx.Deadline()
	flags := flagBodyOnAccept
	if withHead {
		flags = 0
	}
	if _, ok := req.Header["User-Agent"]; !ok {
		flags |= flagNoUserAgent
	}
	if tr := httptrace.ContextClientTrace(ctx); tr == nil || tr.Got1xxResponse == nil {
		flags |= flagNoInterim
	}
	rx := &remoteExchange{leg: remoteLeg{lease: lease, deadline: dl, reqLength: -1, flags: flags}}
	lg := &rx.leg
	if len(req.Trailer) > 0 && req.ContentLength > 0 {
		// HTTP/1.1 carries trailers only in a chunked body: send it so,
		// and the length in the frame. The copy shares the Trailer map,
		// whose values the caller may set until the body ends.
		r2 := *req
		r2.ContentLength = -1
		r2.Body = &lengthBody{ReadCloser: req.Body, want: req.ContentLength}
		lg.reqLength = req.ContentLength
		req = &r2
	}
	rx.opts = exchangeOpts{
		bufs:                  bufs,
		maxHeaderBytes:        o.maxHeaderBytes,
		expectContinueTimeout: ect,
		responseHeaderTimeout: o.responseHeaderTimeout,
		leg:                   lg,
		log:                   p.log,
		bodyWithHead:          withHead,
		done: func(c *conn, oc outcome) {
			p.put(lane, c, oc)
		},
		release: onDone,
	}
	if orig.Body != nil {
		// Over HTTP/2 (as the accept says), a failed exchange closes the
		// caller's body, as x/net's client closes it when a stream
		// fails, so that a writer waiting in it returns: a caller that
		// sends the rest only once it has the response (a bidirectional
		// stream) would hold the exchange past its own deadline. On a
		// goroutine of its own, as x/net's: Close waits for a pending
		// Read on some bodies.
		if tb, ok := orig.Body.(*trackBody); ok {
			// Late, it must not close the body under a retry.
			n := tb.attemptNo()
			rx.opts.stopBody = func() { go tb.closeFor(n) }
		} else {
			rx.opts.stopBody = func() { go orig.Body.Close() }
		}
	}
	fresh := c.requests == 0
	hopMark(hopCallerPrep)
	resp, err := c.roundTrip(req, &rx.opts)
	hopMark(hopToCaller)
	if resp != nil {
		resp.Request = orig
	}
	if pe, ok := err.(*Error); ok && fresh && errors.Is(err, ErrOwnerGone) {
		e := *pe
		e.ownerDown = true
		err = &e
	}
	return resp, err
}

// remoteExchange is a remote exchange's leg and options, allocated together.
type remoteExchange struct {
	leg  remoteLeg
	opts exchangeOpts
}

// remoteLeg frames an exchange on a unix stream to an owner.
type remoteLeg struct {
	lease    orbitpool.Lease
	deadline time.Time
	flags    uint16 // the request frame's flags, but flagLength
	length   int64  // the head's declared length (headLength), or -1
	status   int    // the head's status (headStatus), or 0
	// reqLength is the request's Content-Length when it is sent chunked
	// for its trailers (flagLength), or -1.
	reqLength int64
	scratch   [reqHeaderLen + maxLeaseLen + 16]byte
}

// writePreamble writes the request frame, with what is left of the wait
// of w (the caller's WaitWatcher, if any) as the frame goes out.
func (l *remoteLeg) writePreamble(bw *bufio.Writer, w WaitWatcher) error {
	var waitLeft time.Duration
	if w != nil {
		waitLeft = w.WaitLeft()
	}
	var lb [orbitpool.LeaseSize]byte
	frame, err := l.lease.AppendBinary(lb[:0])
	if err == nil {
		frame, err = appendRequestFrameWait(l.scratch[:0], frame, l.deadline, l.flags, l.reqLength, waitLeft)
	}
	if err != nil {
		return &Error{Op: "lease", RetrySafe: true, Err: err}
	}
	_, err = bw.Write(frame)
	return err
}

// ownerAccept is what an owner's accept frame tells: whether it runs the
// exchange on HTTP/2, and how long the request waited there for a worker.
type ownerAccept struct {
	h2     bool
	waited time.Duration
}

func (l *remoteLeg) readPreamble(br *bufio.Reader) (ownerAccept, error) {
	f, err := readFrame(br, respHeaderLen, decodeResponseFrame)
	if err != nil {
		return ownerAccept{}, err
	}
	switch f.typ {
	case frameAccept:
		return ownerAccept{h2: f.flags&flagAcceptH2 != 0, waited: f.waited}, nil
	case frameReject:
		err := fmt.Errorf("%w: %s", ErrLeaseRefused, f.msg)
		switch f.code {
		case rejectOverload:
			err = fmt.Errorf("%w: %w: %s", ErrLeaseRefused, ErrOwnerBusy, f.msg)
		case rejectClosing:
			err = fmt.Errorf("%w: %w", ErrLeaseRefused, errOwnerLeaving)
		case rejectGone:
			err = fmt.Errorf("%w: %w: %s", ErrLeaseRefused, errLeaseGone, f.msg)
		}
		return ownerAccept{}, &Error{Op: "lease", RetrySafe: true, beforeAccept: true, Err: err}
	default:
		return ownerAccept{}, f.ownerError(true)
	}
}

// ownerError is the error an owner's error frame reports, before its accept
// or after it (in place of a head).
func (f responseFrame) ownerError(beforeAccept bool) *Error {
	err := fmt.Errorf("%w: %s", ErrOwnerFailed, f.msg)
	if s := errCodeSentinels[f.code]; s != nil {
		// The owner's message begins with the sentinel's own words
		// when its error wrapped it, as it usually did, after the
		// operation's ("proxy: read: "): said once.
		msg := f.msg
		if before, after, ok := strings.Cut(msg, s.Error()); ok && isOpPrefix(before) {
			msg = strings.TrimPrefix(after, ": ")
		}
		err = fmt.Errorf("%w: %w: %s", ErrOwnerFailed, s, msg)
	}
	return &Error{Op: "owner", RetrySafe: f.flags&flagNothingSent != 0, idleClosed: f.flags&flagIdleClosed != 0,
		connGone: f.flags&flagConnGone != 0, responseBegan: f.flags&flagResponseBegan != 0, beforeAccept: beforeAccept, Err: err}
}

// isOpPrefix reports whether s is what Error.Error puts before the error an
// Error wraps: nothing, or "proxy: " and the operation.
func isOpPrefix(s string) bool {
	if s == "" {
		return true
	}
	op, ok := strings.CutPrefix(s, "proxy: ")
	op, ok2 := strings.CutSuffix(op, ": ")
	return ok && ok2 && op != "" && !strings.Contains(op, ":")
}

func (l *remoteLeg) readHead(br *bufio.Reader) (headFlags, error) {
	f, n, status, err := readHead(br)
	l.length, l.status = n, status
	return f, err
}

// fixResponse restores what the owner's relay had to change: the protocol
// version the upstream spoke, its close-delimited framing and its wish to
// close the connection.
func (l *remoteLeg) fixResponse(resp *http.Response, f headFlags) {
	chunked := len(resp.TransferEncoding) > 0
	if f&headProto10 != 0 {
		resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/1.0", 1, 0
	}
	if f&headCloseDelimited != 0 {
		resp.TransferEncoding = nil
		if v, ok := resp.Header[relayedTrailerHeader]; ok && f&headProto2 == 0 {
			delete(resp.Header, relayedTrailerHeader)
			resp.Header["Trailer"] = v
		}
	}
	resp.Close = f&headClose != 0
	if f&headProto2 != 0 {
		// As net/http's HTTP/2 client returns it: no transfer coding,
		// and the declared length, if any, in the field and the header.
		resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/2.0", 2, 0
		resp.TransferEncoding = nil
		resp.Close = false
		if f&headStatus != 0 {
			// As x/net/http2 words it.
			resp.StatusCode = l.status
			resp.Status = strconv.Itoa(l.status) + " " + http.StatusText(l.status)
		}
		if resp.Trailer == nil {
			// x/net/http2 takes the keys a head announces whatever the
			// body; net/http's reader only for a chunked one.
			announceTrailers(resp)
			delete(resp.Header, "Trailer")
		}
		switch {
		case f&headLength != 0:
			resp.ContentLength = l.length
			resp.Header.Set("Content-Length", strconv.FormatInt(l.length, 10))
		case resp.ContentLength < 0 && !chunked &&
			resp.Request != nil && resp.Request.Method != http.MethodHead && bodyAllowedForStatus(resp.StatusCode):
			// The relay frames every HTTP/2 body as chunked, so a head
			// with neither a length nor chunking is a response the
			// upstream ended with its HEADERS (gRPC's trailers-only,
			// an empty 200 without Content-Length): x/net/http2 gives
			// it length 0 and an empty body. Read as HTTP/1.1 it would
			// be a body running to the unix stream's close.
			resp.ContentLength = 0
			resp.Body = http.NoBody
		}
	}
}

// announceTrailers puts in resp.Trailer, without values, the keys its
// Trailer field names, as x/net/http2 does.
func announceTrailers(resp *http.Response) {
	for _, v := range resp.Header["Trailer"] {
		for k := range strings.SplitSeq(v, ",") {
			if k = textproto.TrimString(k); k != "" {
				if resp.Trailer == nil {
					resp.Trailer = make(http.Header)
				}
				resp.Trailer[http.CanonicalHeaderKey(k)] = nil
			}
		}
	}
}

// bodyAllowedForStatus reports whether a response of this status may have
// a body, as net/http judges it.
func bodyAllowedForStatus(code int) bool {
	switch {
	case code >= 100 && code <= 199, code == http.StatusNoContent, code == http.StatusNotModified:
		return false
	}
	return true
}

// lengthBody holds a body sent chunked to the length its request declared,
// as Request.Write holds one it sends with that length: a body that ends at
// another length fails the request, and the owner, which would find it so
// only as the chunked body ended, is not left to close the stream mid-body.
type lengthBody struct {
	io.ReadCloser
	want, n int64
}

func (b *lengthBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n += int64(n)
	if err == io.EOF && b.n != b.want {
		err = fmt.Errorf("http: ContentLength=%d with Body length %d", b.want, b.n)
	}
	return n, err
}
