package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/net/http/httpguts"
)

// outcome is how an exchange left its connection.
type outcome uint8

const (
	outcomeReusable outcome = iota // idle, ready for the next exchange
	outcomeBroken                  // closed, unless it lingers; it must leave any pool
	outcomeHijacked                // a 101 body owns it now; it must leave any pool, not be closed
)

// exchangeOpts configures one exchange on a conn.
type exchangeOpts struct {
	maxHeaderBytes        int64
	expectContinueTimeout time.Duration
	responseHeaderTimeout time.Duration
	// leg is nil on the upstream leg; the unix leg supplies framing.
	leg leg
	// done is called exactly once, when both the request has been written and
	// the response consumed, or the exchange failed. A write given up
	// after the response (see finishRead) counts as written.
	done func(c *conn, o outcome)
	// release, if set, runs once after done, when the writer has returned
	// too: what the exchange holds of the governor (a worker, its
	// buffers' memory) is in use until then.
	release func()
	// stopBody, if set, makes a pending read of the request body return: it
	// is called when the exchange fails while the body is still being sent,
	// before roundTrip waits for the writer. The owner sets it to a read
	// deadline on the peer stream its request body is a window on; a
	// sibling, to closing its caller's body, which it calls only when the
	// owner's accept said HTTP/2, as x/net's client closes it when a stream
	// fails. Otherwise the caller's body is waited for, as net/http's
	// HTTP/1 transport does.
	stopBody func()
	// log receives the stacks of panics recovered in the exchange.
	log *zap.Logger
	// bufs is how many exchange buffers the exchange's budget granted: the
	// size of its request body copy buffer. 0 counts as 1.
	bufs int
	// bodyWithHead: the request body is short and in memory, and goes out
	// in the head's write, before the response is read. On the unix leg it
	// does not wait for the owner's accept; an owner that refuses the
	// request reads it past, as it does the head.
	bodyWithHead bool
}

// leg is what the unix leg adds around the HTTP/1.1 messages.
type leg interface {
	// writePreamble writes what precedes the request; w is the caller's
	// WaitWatcher, if any.
	writePreamble(bw *bufio.Writer, w WaitWatcher) error
	// readPreamble reads what precedes the first response head: the
	// owner's accept.
	readPreamble(br *bufio.Reader) (ownerAccept, error)
	// readHead reads what precedes each response head.
	readHead(br *bufio.Reader) (headFlags, error)
	// fixResponse restores what the relay changed about the final head.
	fixResponse(resp *http.Response, f headFlags)
}

// exchange is one request and its response on a conn.
type exchange struct {
	c     *conn
	req   *http.Request
	o     *exchangeOpts
	trace *httptrace.ClientTrace
	// waits is the caller's WithWaitWatcher watcher, if any.
	waits WaitWatcher
	// ownerH2: the owner's accept said its connection is HTTP/2. Set and
	// read by the reader.
	ownerH2 bool

	pending   atomic.Int32 // parts still running: writing and reading
	keepAlive atomic.Bool  // cleared by any part that leaves the conn unusable
	hijacked  atomic.Bool
	headDone  atomic.Bool
	stopCtx   func() bool
	ctxDone   atomic.Bool // stopCtx was called
	headTimer atomic.Pointer[time.Timer]
	// writeState is 0 while the request is being written, writeOver once
	// it is out (or never will be), writeAborted once finishRead gave up
	// waiting; one CAS decides between the last two.
	writeState atomic.Uint32
	writeTimer atomic.Pointer[time.Timer]

	written0 int64 // conn's written byte count when the exchange began
	reused   bool

	// continueCh carries the 100-continue decision to the body writer: true
	// to send the body, false to skip it. Nil when not expecting 100.
	continueCh chan bool
	contRecv   <-chan bool // the same channel, read only by the body writer

	// acceptCh carries the owner's answer on the unix leg to the body
	// writer: true once the owner accepted (send the body), false if it
	// refused or failed first. Nil without a body or on the upstream leg.
	acceptCh   chan bool
	acceptRecv <-chan bool // the same channel, read only by the body writer
	// refused is set when the owner answered before accepting the body:
	// the writer drops what it holds, and the stream stays in step.
	refused atomic.Bool
	// skipped is set when a gate (acceptBody, continueBody) gave the body
	// up: Request.Write's error then says only that the body failed (it
	// does not wrap the gate's error in a way errors.Is sees).
	skipped atomic.Bool
	// declined is set when continueBody gave the body up for a final
	// response that closes the connection: the request was written as
	// net/http writes it then, with no error.
	declined atomic.Bool

	// writeDone is closed when the request writer has stopped: until then
	// it reads the request body and writes the conn, and nothing else may.
	// A 101 body waits for it before writing, and roundTrip before it
	// returns an error, so the caller may close or reuse the body at once.
	writeDone chan struct{}
}

// closedChan is the writeDone of an exchange whose request was written
// before roundTrip returned.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

const defaultMaxHeaderBytes = 10 << 20

// writerStopped, if set, runs in an exchange's writer just after its stop
// (writeDone), before the end of its part if that is still to come. Tests
// use it to hold the writer there.
var writerStopped atomic.Pointer[func()]

// abortOnCancel tears down the connection of an exchange whose context was
// cancelled. Tests delay it to land after the exchange has ended.
var abortOnCancel = (*conn).abort

// roundTrip runs one exchange. On error the connection has been closed and
// o.done called (or it will be, once the body writer notices).
func (c *conn) roundTrip(req *http.Request, o *exchangeOpts) (*http.Response, error) {
	x := &exchange{c: c, req: req, o: o, written0: c.cw.n.Load(), reused: c.requests > 0}
	c.requests++
	c.cw.bufs = o.bufs
	x.pending.Store(2)
	x.keepAlive.Store(true)
	ctx := req.Context()
	x.trace = httptrace.ContextClientTrace(ctx)
	x.waits = waitWatcher(ctx)
	if ctx.Done() != nil {
		abort := abortOnCancel // taken now: a test's hook sees only the exchanges it started
		x.stopCtx = context.AfterFunc(ctx, func() { abort(c, ctx.Err()) })
	}

	hasBody := req.Body != nil && req.Body != http.NoBody
	if !hasBody || o.bodyWithHead {
		x.writeDone = closedChan
		if err := x.writeRequestSafe(req); err != nil {
			werr := x.writeError(err)
			if ferr := x.ownerAnswer(err); ferr != nil {
				werr = ferr
			}
			c.abort(werr)
			x.finish(false)
			x.finish(false)
			return nil, werr
		}
		x.writeState.Store(writeOver)
		x.wrote()
		x.finish(true)
	} else {
		x.writeDone = make(chan struct{})
		r := req
		if o.leg != nil {
			x.acceptCh = make(chan bool, 1)
			x.acceptRecv = x.acceptCh
			r2 := *r
			r2.Body = &acceptBody{ReadCloser: r.Body, x: x}
			r = &r2
		}
		if req.ProtoAtLeast(1, 1) && expectsContinue(req) && o.expectContinueTimeout > 0 {
			x.continueCh = make(chan bool, 1)
			x.contRecv = x.continueCh
			r2 := *r
			r2.Body = &continueBody{ReadCloser: r.Body, x: x}
			r = &r2
		}
		go x.writeLoop(r)
	}

	resp, err := x.readResponseSafe()
	if err != nil {
		var pe *Error
		// A refusal leaves the stream in step, except one as closing,
		// which may be the leaving owner's last word, unasked, and one
		// of the head, after which the owner closes the stream, having
		// read no further than it could (see refuseHead).
		refused := o.leg != nil && errors.As(err, &pe) && pe.beforeAccept && !errors.Is(err, errOwnerLeaving) && !headRefused(err)
		if refused {
			x.refused.Store(true)
		}
		if x.acceptCh != nil {
			x.acceptCh <- false
		}
		if x.continueCh != nil {
			x.continueCh <- false
		}
		if refused {
			// The owner answered before it took any of the body, and
			// skipped the request: once our writer has stopped without
			// sending any of it, the stream is in step for the next
			// exchange. The writer ended its part before it stopped
			// (endWritePartFirst): this finish ends the exchange, and
			// the caller's context, which it may cancel the moment this
			// returns, no longer concerns the stream.
			<-x.writeDone
			x.finish(true)
			return nil, err
		}
		c.abort(err)
		x.finish(false)
		if o.stopBody != nil && (o.leg == nil || x.ownerH2) {
			select {
			case <-x.writeDone:
			default:
				o.stopBody()
			}
		}
		<-x.writeDone
		return nil, x.recount(err)
	}
	return resp, nil
}

// recount settles RetrySafe for a read error now that the writer has
// stopped: the reader decided while a write may have been under way, which
// counts as written, and a write that then went out with nothing taken (to
// a peer gone, or a stream closed under it) leaves nothing written.
func (x *exchange) recount(err error) error {
	pe, ok := err.(*Error)
	if !ok || !pe.counted || pe.RetrySafe || x.c.cw.n.Load() != x.written0 {
		return err
	}
	e := *pe
	e.RetrySafe = true
	return &e
}

// readResponseSafe is readResponse with a panic turned into the exchange's
// error, so that the connection is torn down and given back rather than held
// busy forever by an exchange that never ends.
func (x *exchange) readResponseSafe() (resp *http.Response, err error) {
	defer func() {
		if p := recover(); p != nil {
			resp = nil
			err = &Error{Op: "read", Err: recovered(x.o.log, "exchange", p)}
		}
	}()
	return x.readResponse()
}

// maxWriteWait is how long a connection whose response is complete waits
// for its request body to finish going out before it is closed instead of
// reused: an upstream that answered early may never read the rest. net/http
// waits the same 50ms.
const maxWriteWait = 50 * time.Millisecond

// finishRead ends the read part. If the request is still being written, the
// write gets maxWriteWait to finish before the connection is torn down and
// given back: as net/http frees a connection's place under MaxConnsPerHost
// when it closes it, the unit of the key's budget does not wait for a
// writer stalled on the caller's body. That writer then ends on the closed
// connection, or with the body, and does nothing more with the exchange.
func (x *exchange) finishRead(ok bool) {
	// The response is over: from now on the caller's context, which it
	// may cancel the moment it has the response (a server cancels a
	// request's context as its handler returns), no longer concerns this
	// connection. What is left of the request write is bounded below.
	x.unwatchCtx()
	if x.writeState.Load() == 0 {
		c := x.c
		t := time.AfterFunc(maxWriteWait, func() {
			if x.writeState.CompareAndSwap(0, writeAborted) {
				c.abort(errWriteStalled)
				x.finish(false)
			}
		})
		x.writeTimer.Store(t)
	}
	x.finish(ok)
}

// unwatchCtx stops the watch on the caller's context, once. A watch that
// has begun to abort the connection cannot be stopped, and its abort may not
// have been recorded yet: the connection is then not to be reused, for the
// abort would tear down its next exchange.
func (x *exchange) unwatchCtx() {
	if x.stopCtx != nil && x.ctxDone.CompareAndSwap(false, true) && !x.stopCtx() {
		x.keepAlive.Store(false)
	}
}

const (
	writeOver    = 1
	writeAborted = 2
)

var errWriteStalled = errors.New("request body still being sent after the response ended")

// finish ends one part of the exchange; the last one releases the conn.
func (x *exchange) finish(ok bool) {
	if !ok {
		x.keepAlive.Store(false)
	}
	if x.pending.Add(-1) != 0 {
		return
	}
	x.unwatchCtx()
	if t := x.headTimer.Load(); t != nil {
		t.Stop()
	}
	if t := x.writeTimer.Load(); t != nil {
		t.Stop()
	}
	switch {
	case x.hijacked.Load():
		x.o.done(x.c, outcomeHijacked)
	case x.keepAlive.Load() && x.c.aborted() == nil:
		x.o.done(x.c, outcomeReusable)
	default:
		if !x.c.lingers {
			x.c.close()
		}
		x.o.done(x.c, outcomeBroken)
	}
	if rel := x.o.release; rel != nil {
		select {
		case <-x.writeDone:
			rel()
		default:
			// A write finishRead gave up on is still blocked in the
			// body's Read, with the exchange's copy buffer.
			go func() {
				<-x.writeDone
				rel()
			}()
		}
	}
}

func (x *exchange) writeRequest(r *http.Request) error {
	c := x.c
	if x.o.leg != nil {
		if err := x.o.leg.writePreamble(c.bw, x.waits); err != nil {
			return err
		}
		r = wrapRequest(r)
	}
	// A request written whole here (no body, or one that goes with its
	// head) tells the caller's WaitWatcher once written; one whose body
	// streams, from Request.Write's trace, before its body.
	whole := x.writeDone == closedChan
	if !whole && x.waits != nil || x.contRecv != nil && x.trace != nil && x.trace.WroteRequest != nil {
		r = x.traced(r)
	}
	// Request.Write reports WroteRequest itself, as net/http's Transport
	// relies on it to.
	err := r.Write(c.bw)
	if err == nil {
		err = c.bw.Flush()
	}
	if err == nil && whole && x.waits != nil {
		x.waits.WroteHeaders()
	}
	return err
}

// traced returns r with the trace Request.Write is to report to: the
// caller's, with WroteHeaders also telling the caller's WaitWatcher, and
// with WroteRequest reporting no error for a body continueBody declined to
// send (net/http's Request.write returns nil when its waitForContinue says
// not to send the body, where Request.Write here sees the gate's error).
// Request.write reads nothing else from the request's context.
func (x *exchange) traced(r *http.Request) *http.Request {
	var t httptrace.ClientTrace
	if x.trace != nil {
		t = *x.trace
	}
	if w, own := x.waits, t.WroteHeaders; w != nil && own == nil {
		t.WroteHeaders = w.WroteHeaders
	} else if w != nil {
		t.WroteHeaders = func() { w.WroteHeaders(); own() }
	}
	if report := t.WroteRequest; report != nil && x.contRecv != nil {
		t.WroteRequest = func(i httptrace.WroteRequestInfo) {
			if x.declined.Load() {
				i.Err = nil
			}
			report(i)
		}
	}
	return r.WithContext(httptrace.WithClientTrace(context.Background(), &t))
}

// writeLoop writes a request that has a body, concurrently with reading the
// response: an upstream may answer before it has read the whole body. The
// writer is done with the connection and its buffers when writeDone closes,
// before its part of the exchange ends.
func (x *exchange) writeLoop(r *http.Request) {
	ok, part := x.writeBody(r)
	if part && x.endWritePartFirst(ok) {
		part = false
	}
	close(x.writeDone)
	if h := writerStopped.Load(); h != nil {
		(*h)()
	}
	if part {
		x.finish(ok)
	}
}

// endWritePartFirst ends the writer's part before writeDone closes if the
// reader's is still running, which then ends the exchange: a reader that
// waits for writeDone before it ends its part (a refused lease's) returns
// with the connection already back in its pool, and not with the writer's
// part left to a goroutine the scheduler may hold back.
// When the reader's part is over, the writer's ends the exchange, after
// writeDone, as finish requires.
func (x *exchange) endWritePartFirst(ok bool) bool {
	if !ok {
		x.keepAlive.Store(false)
	}
	return x.pending.CompareAndSwap(2, 1)
}

// writeBody is writeLoop's write; it reports how the write's part of the
// exchange ends, or part false if finishRead ended it already.
func (x *exchange) writeBody(r *http.Request) (ok, part bool) {
	err := x.writeRequestSafe(r)
	if !x.writeState.CompareAndSwap(0, writeOver) {
		// finishRead gave up on this write, closed the connection and
		// finished the write's part.
		return false, false
	}
	if err != nil {
		if x.skipped.Load() {
			if x.refused.Load() {
				// The owner refused before accepting the body: none of
				// it went out. Drop what bufio holds of it (at most
				// the byte net/http's probe of a body of unknown
				// length read) and keep the stream.
				x.c.bw.Reset(&x.c.cw)
				return true, true
			}
			// Expect: 100-continue was answered with a final status on a
			// connection about to close; the body was never sent.
			return false, true
		}
		switch c, werr := x.c, x.writeError(err); {
		case x.headDone.Load():
		case !c.cw.failed.Load():
			// The request failed, not the peer: its body's read did,
			// or the body was longer than its declared length. What
			// went out is not the caller's request, and the answer to
			// it is not to be taken: the connection goes at once, as
			// net/http closes its own, and the reader reports this.
			c.abort(werr)
		default:
			// A peer that answers without reading the whole body (an
			// upstream refusing it, or an owner relaying that refusal)
			// may close before the body is out. Its answer is then
			// already on the way: give the reader maxWriteWait to take
			// it, as net/http does, before tearing the connection down.
			time.AfterFunc(maxWriteWait, func() {
				if !x.headDone.Load() {
					c.abort(werr)
				}
			})
		}
		return false, true
	}
	x.wrote()
	return true, true
}

// ownerAnswer reads, after a write to an owner failed, the error frame the
// owner may have sent before it closed the stream under the rest of the
// request: its refusal of a head over its limit (see refuseHead), which
// the failed write would otherwise report as an owner gone. It returns that
// failure, or nil if the owner said nothing. The stream is closed on the
// owner's side by then, so the read returns at once; its deadline only
// bounds an owner that shut the stream down without closing it.
func (x *exchange) ownerAnswer(werr error) error {
	if x.o.leg == nil || !isIOError(werr) || isContextErr(werr) || x.c.aborted() != nil {
		return nil
	}
	x.c.nc.SetReadDeadline(time.Now().Add(maxWriteWait))
	_, err := x.o.leg.readPreamble(x.c.br)
	var pe *Error
	if err == nil || !errors.As(err, &pe) || !pe.beforeAccept {
		// An accept (which a refused head never gets) or no frame.
		return nil
	}
	return err
}

// writeRequestSafe is writeRequest with a panic (in the body's Read, say,
// or a caller's trace hook) turned into the write's error: the write loop
// is a goroutine of its own, and a panic there would end the process; a
// request written whole would leave its exchange unfinished, and its
// connection taken.
func (x *exchange) writeRequestSafe(r *http.Request) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &Error{Op: "write", Err: recovered(x.o.log, "request writer", p)}
		}
	}()
	return x.writeRequest(r)
}

// wrote starts the response header timeout once the request is out.
func (x *exchange) wrote() {
	if d := x.o.responseHeaderTimeout; d > 0 && !x.headDone.Load() {
		c := x.c
		x.headTimer.Store(time.AfterFunc(d, func() {
			if !x.headDone.Load() {
				c.abort(&Error{Op: "read", Err: ErrResponseHeaderTimeout})
			}
		}))
	}
}

// writeError classifies a failure to write the request.
func (x *exchange) writeError(err error) error {
	if aerr := x.c.aborted(); aerr != nil && !errors.Is(aerr, err) {
		err = aerr
	}
	if isContextErr(err) {
		return err
	}
	nothing := x.c.cw.n.Load() == x.written0
	var pe *Error
	if errors.As(err, &pe) {
		return err
	}
	if !x.c.cw.failed.Load() {
		// No write to the peer failed: the request did, its body's Read
		// or Close, or a body longer than it declared, whatever kind of
		// error that body returns. The peer is not to blame, and what
		// went out of the request is not to be sent again.
		return &Error{Op: "write", Err: fmt.Errorf("%w: %w", ErrConnBroken, err)}
	}
	if x.o.leg != nil && isIOError(err) {
		// The owner exited or was killed with part of the request
		// sent (the head, or the final flush: net/http wraps a failure
		// while copying the body in a type of its own, which stays
		// ErrConnBroken): as in readError, a replayable request may go
		// again.
		//
		// A request written whole in this write (no body, or the body
		// with its head: writeDone is closedChan) whose write failed
		// never reached the owner whole, and the owner sends upstream
		// only a head and a body-with-head it read in full: nothing
		// went anywhere, whatever the method.
		return &Error{Op: "write", RetrySafe: nothing || x.writeDone == closedChan, idleClosed: true,
			Err: fmt.Errorf("%w: %w", ErrOwnerGone, err)}
	}
	return &Error{Op: "write", RetrySafe: nothing, Err: fmt.Errorf("%w: %w", ErrConnBroken, err)}
}

func (x *exchange) readResponse() (*http.Response, error) {
	c, req := x.c, x.req
	maxHeader := x.headLimit()
	c.lr.n = maxHeader
	if x.o.leg != nil {
		a, err := x.o.leg.readPreamble(c.br)
		if err != nil {
			x.firstByteOfFailure(err)
			return nil, x.unread(x.readError(err, false), err)
		}
		if x.acceptCh != nil {
			x.acceptCh <- true
			x.acceptCh = nil
		}
		x.ownerH2 = a.h2
		if a.waited > 0 && x.waits != nil {
			x.waits.OwnerWaited(a.waited)
		}
	}
	first, perr := c.br.Peek(1)
	if perr != nil {
		return nil, x.readError(perr, false)
	}
	// An owner's error frame in place of the first head is no byte of a
	// response, unless it says some came (see firstByteOfFailure).
	gotByte := x.o.leg == nil || first[0] != frameMagic0
	if gotByte && x.trace != nil && x.trace.GotFirstResponseByte != nil {
		x.trace.GotFirstResponseByte()
	}
	var (
		resp *http.Response
		hf   headFlags
		err  error
	)
	for {
		if x.o.leg != nil {
			if hf, err = x.o.leg.readHead(c.br); err != nil {
				if !gotByte {
					x.firstByteOfFailure(err)
				}
				return nil, x.readError(err, true)
			}
		}
		resp, err = http.ReadResponse(c.br, req)
		if err != nil {
			return nil, x.readError(err, true)
		}
		if x.o.leg != nil {
			if err := unwrapPadded(resp.Header); err != nil {
				return nil, x.readError(err, true)
			}
		}
		code := resp.StatusCode
		if code < 100 || code > 199 || code == http.StatusSwitchingProtocols {
			break
		}
		// net/http reports a 100 the request waits for before the 1xx
		// hook; x/net's HTTP/2 client, whose heads a relay marks,
		// reports every 100 after it.
		h2 := hf&headProto2 != 0
		if code == http.StatusContinue && !h2 {
			x.got100(false)
		}
		if x.trace != nil && x.trace.Got1xxResponse != nil {
			if err := x.trace.Got1xxResponse(code, textproto.MIMEHeader(resp.Header)); err != nil {
				return nil, err
			}
			// The caller saw this 1xx and limits their number itself, as
			// in net/http; otherwise all heads share one limit.
			if req.Context().Value(interimShareLimit{}) == nil {
				c.lr.n = maxHeader
			}
		}
		if code == http.StatusContinue && h2 {
			x.got100(true)
		}
	}
	x.headDone.Store(true)
	if t := x.headTimer.Load(); t != nil {
		t.Stop()
	}
	c.lr.n = math.MaxInt64
	if x.o.leg != nil {
		x.o.leg.fixResponse(resp, hf)
	}
	if x.continueCh != nil {
		// A final status instead of 100: send the body only if the
		// connection stays open, exactly as net/http decides. Over
		// HTTP/2, an answer that ended the upstream's stream with its
		// head (a 417) takes no body: the owner's stream sends none, as
		// x/net's does not once the peer has closed its side, and the
		// owner, which read none of it, ends the unix stream
		// (headStreamEnds). While the stream is open, the owner's
		// stream sends the body on a 100 or at its own expect timeout.
		const h2Unread = headProto2 | headStreamEnds
		ended := hf&h2Unread == h2Unread && (resp.ContentLength == 0 || resp.Body == http.NoBody)
		x.continueCh <- !(resp.Close || req.Close || ended)
		x.continueCh = nil
	}
	resp.TLS = c.tls

	keep := true
	if x.o.leg == nil {
		// As net/http: no connection is kept after a final status under
		// 200 (a 101 is hijacked below; one under 100 is no HTTP).
		keep = !resp.Close && !req.Close && resp.StatusCode >= 200
	} else if hf&headStreamEnds != 0 {
		keep = false
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		if isProtocolSwitch(resp.Header) {
			x.hijacked.Store(true)
			resp.Body = newUpgradeBody(c, x.writeDone)
			x.finish(true)
			return resp, nil
		}
		// A 101 that names no protocol switches to none, as net/http
		// has it: a final answer without a body, after which the
		// connection is not used again, whatever follows on it.
		keep = false
	}
	if req.Method == http.MethodHead || resp.ContentLength == 0 || resp.Body == http.NoBody {
		x.finishRead(keep)
		return resp, nil
	}
	h2 := x.o.leg != nil && hf&headProto2 != 0
	if n := resp.ContentLength; n > 0 && n <= maxEarlyBody && !h2 && int64(c.br.Buffered()) >= n {
		eb, err := takeEarly(resp, n)
		if err != nil { // the bytes were buffered: cannot happen
			return nil, &Error{Op: "read body", Err: fmt.Errorf("%w: %w", ErrConnBroken, err)}
		}
		resp.Body = eb
		x.finishRead(keep)
		return resp, nil
	}
	b := &body{rc: resp.Body, x: x, keep: keep, h2: h2}
	if x.o.leg != nil {
		b.relayed = resp
	}
	resp.Body = b
	return resp, nil
}

// interimShareLimit marks the context of an owner's exchange for a sibling
// whose caller reads no interim responses (flagNoInterim): the relay watches
// them, yet they share one header limit with the final head.
type interimShareLimit struct{}

// isProtocolSwitch reports whether a 101's header switches protocols, as
// net/http judges it: an Upgrade field, and Connection naming it.
func isProtocolSwitch(h http.Header) bool {
	return h.Get("Upgrade") != "" && httpguts.HeaderValuesContainsToken(h["Connection"], "Upgrade")
}

// firstByteOfFailure tells the trace of the first response byte that an
// owner's error frame says came before its exchange failed: an interim head
// it did not relay, or the start of a bad head.
func (x *exchange) firstByteOfFailure(err error) {
	var pe *Error
	if x.trace != nil && x.trace.GotFirstResponseByte != nil && errors.As(err, &pe) && pe.responseBegan {
		x.trace.GotFirstResponseByte()
	}
}

// headLimit bounds the bytes x reads of each response head.
func (x *exchange) headLimit() int64 {
	limit := x.o.maxHeaderBytes
	if limit <= 0 {
		limit = defaultMaxHeaderBytes
	}
	if x.o.leg != nil {
		limit = relayedHeadLimit(limit)
	}
	return limit
}

// relayedHeadLimit bounds what a sibling reads of the heads an owner
// relays, given the header limit. The owner has bounded the upstream's own
// bytes by that limit already, each head as it came, and relays every head
// anew and canonical, with its frame and a marker before each: a header
// line "a:\n" becomes "A: \r\n", an interim response "HTTP/1.1 103\n\n"
// gets its reason phrase, so that a head net/http takes grows on the unix
// leg, to at most 2.2 times its size. Bounding the relayed bytes by the
// limit itself would refuse through a sibling what the local path takes.
// The bound left is three times the limit, against a runaway owner.
func relayedHeadLimit(limit int64) int64 {
	if limit > (math.MaxInt64-readBufSize)/3 {
		return math.MaxInt64
	}
	return 3*limit + readBufSize
}

// unread settles RetrySafe for a unix stream that broke before the owner's
// first answer to a request written whole before it was read for (no body,
// or the body with its head): a unix stream fails with ECONNRESET only when
// its peer closed it (exited, was killed, or closed the stream) with bytes
// we wrote still unread, and we wrote nothing after the request, so the
// owner never had all of it and cannot have sent it upstream. Nothing can
// have reached the upstream then, whatever the method. A stream that ends
// with EOF instead (the owner read all we wrote) keeps readError's verdict.
func (x *exchange) unread(err, cause error) error {
	pe, ok := err.(*Error)
	if !ok || pe.RetrySafe || x.writeDone != closedChan || !errors.Is(pe, ErrOwnerGone) ||
		!errors.Is(cause, syscall.ECONNRESET) {
		return err
	}
	e := *pe
	e.RetrySafe = true
	return &e
}

// got100 reports a 100 Continue to the trace and lets the body writer go:
// one the request waits for, or, with every, any (as x/net's HTTP/2 client
// reports them).
func (x *exchange) got100(every bool) {
	if x.continueCh == nil && !every {
		return
	}
	if x.trace != nil && x.trace.Got100Continue != nil {
		x.trace.Got100Continue()
	}
	if x.continueCh != nil {
		x.continueCh <- true
		x.continueCh = nil
	}
}

// readError classifies a failure to read a response head.
func (x *exchange) readError(err error, gotByte bool) error {
	c := x.c
	if aerr := c.aborted(); aerr != nil {
		if pe, ok := aerr.(*Error); ok && pe.idleClosed && gotByte {
			// The writer's failure, which took no answer into account:
			// some of the answer (a 1xx the caller passed on) came.
			e := *pe
			e.idleClosed = false
			return &e
		}
		return aerr
	}
	if cerr := ctxErr(x.req.Context()); cerr != nil {
		return cerr
	}
	if errors.Is(err, errHeaderLimit) || c.lr.n <= 0 {
		// The limit is used up: whatever parsing the head cut short
		// made of it (a status line cut after "HTTP" is malformed, as
		// bufio returns a last partial line without the error), the
		// head was too large, as net/http reports it.
		return &Error{Op: "read", Err: ErrHeaderTooLarge}
	}
	var pe *Error
	if errors.As(err, &pe) {
		return err
	}
	nothing := c.cw.n.Load() == x.written0
	if x.o.leg != nil && isIOError(err) {
		// The stream broke: the owner exited or was killed. Whether
		// the stream itself was new or reused, the upstream connection
		// behind it is a reused one (a lease only ever names a
		// connection its owner has registered and used), so this is
		// the case in which net/http sends a replayable request again:
		// a reused connection lost before any byte of the answer.
		return &Error{Op: "read", RetrySafe: nothing, counted: true, idleClosed: !gotByte,
			Err: fmt.Errorf("%w: %w", ErrOwnerGone, err)}
	}
	if errors.Is(err, ErrBadFrame) {
		return &Error{Op: "read", Err: err}
	}
	if !gotByte && isConnClosed(err) {
		// A new connection to a capped upstream that closed it at once,
		// while it still holds connections closed here, was refused: a
		// replayable request goes again once there is room (see
		// refused.go), as after a reused connection's close. So does
		// one on a connection a sibling's could have spared
		// (relayPaid). One closed later, or with nothing of ours held
		// there, is any failed request, sent once, as net/http does.
		refused := !x.reused && x.o.leg == nil && c.full != nil &&
			time.Since(c.created) < refusedWithin && c.full()
		if refused {
			c.refused.Store(true)
		}
		return &Error{Op: "read", RetrySafe: nothing, counted: true, idleClosed: x.reused || refused || c.relayPaid,
			Err: fmt.Errorf("%w: closed before any response byte: %w", ErrConnBroken, err)}
	}
	if isIOError(err) {
		return &Error{Op: "read", RetrySafe: nothing, counted: true, Err: fmt.Errorf("%w: %w", ErrConnBroken, err)}
	}
	return &Error{Op: "read", Err: fmt.Errorf("%w: %w", ErrBadResponse, err)}
}

func isConnClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, net.ErrClosed)
}

func isIOError(err error) bool {
	if isConnClosed(err) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	var errno syscall.Errno
	return errors.As(err, &errno)
}

// ctxErr is ctx's error, or DeadlineExceeded once its deadline has passed
// even if its timer has not fired yet: a failure that races the deadline is
// reported as the deadline.
func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// expectsContinue reports whether the request asks for 100-continue.
func expectsContinue(r *http.Request) bool {
	for _, v := range r.Header["Expect"] {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), "100-continue") {
				return true
			}
		}
	}
	return false
}

var errSkipBody = errors.New("request body not sent: final response before 100-continue")

var errRefusedBody = errors.New("request body not sent: the owner refused the request")

// acceptBody holds the request body back on the unix leg until the owner
// accepts it (flagBodyOnAccept): an owner that refuses the lease, or fails
// before its writer needs the body, answers first, and the body is then
// untouched and can be sent again on another plan whatever the method.
// Request.Write flushes the head before the first Read of a body it does not
// know to be in memory, so blocking here is "write head, flush, wait", as
// for 100-continue.
//
// The one Read that comes before the head is net/http's probe of a body of
// unknown length in a GET-like request, which Request.Write would send, as
// a first chunk flushed with the head, before it reads on: the probe gets
// what it asks for (EOF for an empty body, which then goes without one), but
// a byte it finds is held here, the probe told there is more to come, and
// the byte sent with the rest once the owner accepts. An owner that refuses
// the request then keeps the stream in step (it reads the head past, and
// nothing else), and the byte goes back to the body for the next attempt.
type acceptBody struct {
	io.ReadCloser
	x      *exchange
	waited bool
	// held is what the probe read, and heldErr the error it came with;
	// wasUsed is whether the body had been read before the probe.
	held    []byte
	heldErr error
	wasUsed bool
}

func (b *acceptBody) Read(p []byte) (int, error) {
	if !b.waited {
		x := b.x
		if x.c.cw.n.Load() == x.written0 {
			return b.probe(p)
		}
		b.waited = true
		if !<-x.acceptRecv {
			x.skipped.Store(true)
			b.giveBack()
			return 0, errRefusedBody
		}
	}
	if len(b.held) > 0 {
		n := copy(p, b.held)
		b.held = b.held[n:]
		if len(b.held) == 0 && b.heldErr != nil {
			return n, b.heldErr
		}
		return n, nil
	}
	if b.heldErr != nil {
		return 0, b.heldErr
	}
	return b.ReadCloser.Read(p)
}

// probe serves net/http's probe of the body before the head: see acceptBody.
func (b *acceptBody) probe(p []byte) (int, error) {
	if tb, ok := b.ReadCloser.(*trackBody); ok {
		b.wasUsed = tb.used.Load()
	}
	n, err := b.ReadCloser.Read(p)
	if n == 0 {
		return 0, err
	}
	b.held = append(b.held, p[:n]...)
	b.heldErr = err
	// Neither a byte nor EOF: Request.Write goes on with the body as it
	// is, chunked, as it does with a byte, and reads it after the head.
	return 0, nil
}

// giveBack returns what the probe read to the body, when the body is not to
// be sent on this stream: nothing of it went anywhere. A body that ended
// with those bytes (EOF) ends again after them; one that failed is not
// given back.
func (b *acceptBody) giveBack() {
	if tb, ok := b.ReadCloser.(*trackBody); ok && len(b.held) > 0 && (b.heldErr == nil || b.heldErr == io.EOF) {
		tb.unread(b.held, b.wasUsed)
		b.held, b.heldErr = nil, nil
	}
}

// continueBody holds the request body back until the upstream answers
// Expect: 100-continue. Request.Write flushes the head before the first Read
// of a body it does not know to be in memory, so blocking here is exactly
// "write head, flush, wait". The one Read before the head is net/http's
// probe of a body of unknown length (see acceptBody), which net/http makes
// whatever the request expects, and which goes through.
type continueBody struct {
	io.ReadCloser
	x      *exchange
	waited bool
}

func (b *continueBody) Read(p []byte) (int, error) {
	if !b.waited {
		x := b.x
		if x.c.cw.n.Load() == x.written0 {
			return b.ReadCloser.Read(p)
		}
		b.waited = true
		if x.trace != nil && x.trace.Wait100Continue != nil {
			x.trace.Wait100Continue()
		}
		t := time.NewTimer(x.o.expectContinueTimeout)
		defer t.Stop()
		select {
		case send := <-x.contRecv:
			if !send {
				x.skipped.Store(true)
				x.declined.Store(true)
				return 0, errSkipBody
			}
		case <-t.C:
		}
	}
	return b.ReadCloser.Read(p)
}
