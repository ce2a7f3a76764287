package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/net/http2"
)

// buffered is implemented by response bodies that know whether a Read would
// be served without waiting on the network.
type buffered interface{ buffered() int }

func (b *body) buffered() int { return b.x.c.br.Buffered() }

// relay writes responses onto the unix leg.
type relay struct {
	bw        *bufio.Writer
	log       *zap.Logger
	stopWatch func()      // ends the background read before a tunnel reads the stream
	reqDone   func() bool // whether the request body has been read whole from the stream
	// keepStream is whether the stream carries another exchange after this
	// response, as its head said (headStreamEnds).
	keepStream bool
	// spliced is whether the body went out by splice(2), whole.
	spliced bool
	err     error
	// bufs is how many exchange buffers the exchange was granted: the
	// size of the body copy buffer.
	bufs int
	// scratch holds a head marker or a chunk header on its way to bw:
	// bw may pass what it is given to the stream, so a buffer on the
	// stack would be moved to the heap on every use.
	scratch [20]byte

	// mu orders the accept frame, which the exchange's writer may send
	// (acceptBody), and the 1xx responses, which an HTTP/2 client's read
	// loop sends (relay1xx), with what the serving goroutine writes: the
	// responses after them, or an error frame instead. Once sentAccept is
	// set the writer never touches bw again; once failed is set (see
	// failBeforeAccept) neither does the read loop.
	mu         sync.Mutex
	sentAccept bool
	failed     bool
	h2         bool // the exchange runs on an HTTP/2 connection: flagAcceptH2
	// waited is how long the request waited here for a worker
	// (flagAcceptWaited), 0 if it had one at once.
	waited time.Duration

	// continueOnly: the caller reads no interim responses (flagNoInterim),
	// and the relay passes on only a 100 Continue, which the caller's
	// writer may wait for. Over HTTP/1.1 the exchange then bounds all heads
	// by one limit and fails, before the accept, as net/http would for
	// such a caller.
	continueOnly bool
	// responseBegan is set when the exchange's first response byte came
	// (GotFirstResponseByte), for the error frame of an exchange that then
	// fails (flagResponseBegan).
	responseBegan atomic.Bool
	// shared is the peer's stream when relay1xx runs on the read loop of
	// an HTTP/2 connection, which every exchange on that connection
	// shares, across the fleet: the relay must not wait there for a
	// sibling to read (its client may be stalled in its 1xx hook). Over
	// HTTP/1.1 the exchange's own goroutine relays, and waits for the peer
	// as net/http's would.
	shared net.Conn
	// pending holds, in order, the interim heads the stream had no room
	// for, which a goroutine of their own writes out (flushing, until
	// flushed is closed); inFlight is what that goroutine has taken of
	// them and not yet written whole, and moved, if set, is closed when it
	// has. The two hold at most pendingLimit bytes (the header limit) of
	// heads (see roomFor).
	pending      []byte
	inFlight     int
	pendingLimit int64
	flushing     bool
	flushed      chan struct{}
	moved        chan struct{}
}

// interimStall is how long the read loop waits for a sibling to read any
// of a full queue of interim heads before it fails that exchange.
const interimStall = 250 * time.Millisecond

// interimPoll is how often the read loop, waiting for room, looks at what
// the sibling has read of the stream's socket: a blocked write returns
// only once the reader has drained most of the socket's buffer, which a
// slow reader takes longer than interimStall to do.
const interimPoll = 10 * time.Millisecond

// flushChunk is the most one write puts of interim heads on a shared read
// loop's stream (flush, writeNoWait). A unix stream socket frees the buffer
// a write took only once the peer has read all of it, so the unsent bytes
// roomFor watches fall only as whole writes are read: one write of the
// whole queue (up to the header limit) showed a reader taking 4 KiB every
// 30 ms no progress for longer than interimStall.
const flushChunk = 4 << 10

// errExchangeFailed is what relay1xx returns for a 1xx that arrives once
// the exchange has failed: the stream carries its error frame, and perhaps
// the next exchange, by then.
var errExchangeFailed = errors.New("proxy: interim response after the exchange failed")

// failBeforeAccept marks the exchange failed and reports whether the
// accept (and perhaps a 1xx) had gone out. An HTTP/2 client's read loop may
// deliver a 1xx for a stream whose RoundTrip has returned (cancelled while
// its writer was still in the head's write, the stream stays in the
// ClientConn's table): after this, relay1xx drops it, and the serving
// goroutine alone writes the stream.
func (r *relay) failBeforeAccept() (accepted bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = true
	return r.sentAccept
}

// The accept frame of a request that had its worker at once, as an owner
// on an HTTP/1.1 and on an HTTP/2 connection sends it.
var (
	acceptFrame   = appendResponseFrame(nil, responseFrame{typ: frameAccept})
	acceptFrameH2 = appendResponseFrame(nil, responseFrame{typ: frameAccept, flags: flagAcceptH2})
)

// acceptWire is the accept frame this exchange sends.
func (r *relay) acceptWire() []byte {
	if r.waited > 0 {
		f := responseFrame{typ: frameAccept, flags: flagAcceptWaited, waited: r.waited}
		if r.h2 {
			f.flags |= flagAcceptH2
		}
		return appendResponseFrame(nil, f)
	}
	if r.h2 {
		return acceptFrameH2
	}
	return acceptFrame
}

// accept writes the accept frame ahead of the first response, unless it has
// gone out already.
func (r *relay) accept() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.sentAccept {
		r.sentAccept = true
		r.bw.Write(r.acceptWire())
	}
}

// acceptBody sends the accept frame at once: the exchange's writer wants the
// request body, which a caller that set flagBodyOnAccept holds back until it
// sees the accept. A failed flush is the peer gone, which the read of the
// body reports.
func (r *relay) acceptBody() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.sentAccept {
		r.sentAccept = true
		r.bw.Write(r.acceptWire())
		r.bw.Flush()
	}
}

// relay100 forwards a 100 Continue that an HTTP/2 client reports without
// its fields (Got100Continue), for a caller that reads no interim responses:
// its writer may wait for one, and its trace counts each, as x/net's does.
// The client bounds such heads itself, to the byte, before they come here.
// A failed write is the peer gone, or not reading (relay1xxNoWait), which
// the exchange finds out.
func (r *relay) relay100() { r.relay1xx(http.StatusContinue, nil) }

// firstByte records that the exchange's first response byte came.
func (r *relay) firstByte() { r.responseBegan.Store(true) }

// relay1xx forwards an interim response as it arrives (only a 100 with
// continueOnly). A 101 is not forwarded: only an HTTP/2 client hands one
// over as interim (HTTP/2 has no upgrade, and x/net goes on to the final
// response), and on the unix leg, which is HTTP/1.1, a 101 is final: the
// sibling would take it for an upgrade and the real response's framing for
// the tunnel's bytes.
func (r *relay) relay1xx(code int, h textproto.MIMEHeader) error {
	if code == http.StatusSwitchingProtocols || r.continueOnly && code != http.StatusContinue {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failed {
		return errExchangeFailed
	}
	if r.err != nil {
		return r.err
	}
	if r.shared != nil {
		return r.relay1xxNoWait(code, h)
	}
	if !r.sentAccept {
		r.sentAccept = true
		r.bw.Write(r.acceptWire())
	}
	writeInterim(r.bw, 0, code, h)
	r.err = r.bw.Flush()
	return r.err
}

// writeInterim writes an interim response as the unix leg carries it.
func writeInterim(w io.Writer, hf headFlags, code int, h textproto.MIMEHeader) {
	w.Write(appendHead(nil, hf))
	fmt.Fprintf(w, "HTTP/1.1 %03d %s\r\n", code, http.StatusText(code))
	wrapPadded(http.Header(h), responseMoves).Write(w)
	io.WriteString(w, "\r\n")
}

// errPeerNotReading is a 1xx that found the relay's queue full, and the
// peer reading none of it.
var errPeerNotReading = errors.New("proxy: sibling not reading its interim responses")

// relay1xxNoWait is relay1xx on a shared HTTP/2 read loop (r.mu held). The
// head goes in one write that takes what the socket has room for, and
// never waits: the rest, and the heads after it, are queued for flush, up
// to the limit (roomFor). A failed exchange is reset upstream by the HTTP/2
// client, and the read loop goes on; whole heads are queued or none, so
// the stream stays in step for the error frame.
func (r *relay) relay1xxNoWait(code int, h textproto.MIMEHeader) error {
	if r.bw.Buffered() > 0 {
		// Nothing is left in bw between two holders of mu (acceptBody
		// flushes); written first if it ever were.
		if err := r.bw.Flush(); err != nil {
			return r.fail(err)
		}
	}
	var b bytes.Buffer
	if !r.sentAccept {
		b.Write(r.acceptWire())
	}
	// The head says HTTP/2, so the caller reports it in x/net's order.
	writeInterim(&b, headProto2, code, h)
	if r.flushing {
		if err := r.roomFor(b.Len()); err != nil {
			return err
		}
		if r.flushing { // else it went out whole meanwhile
			// The queue began with a head, and the accept before it.
			r.pending = append(r.pending, b.Bytes()...)
			return nil
		}
	}
	r.sentAccept = true
	n, err := writeNoWait(r.shared, b.Bytes())
	switch {
	case errors.Is(err, errWouldBlock):
		r.pending = b.Bytes()[n:]
		r.flushing = true
		r.flushed = make(chan struct{})
		go r.flush()
	case err != nil:
		return r.fail(err)
	}
	return nil
}

// roomFor waits (r.mu held) until the queue has room for n more bytes, or
// has gone out whole. A sibling that reads slower than the upstream sends
// holds the read loop back, as its hook would on the local path; one that
// reads nothing for interimStall fails the exchange, whole heads queued
// before it, and the read loop goes on.
func (r *relay) roomFor(n int) error {
	var tick *time.Ticker
	stalled := time.Now() // since when the sibling read nothing
	last, _ := unsent(r.shared)
	for r.flushing && int64(r.inFlight+len(r.pending)+n) > r.pendingLimit {
		if tick == nil {
			tick = time.NewTicker(interimPoll)
			defer tick.Stop()
		}
		if r.moved == nil {
			r.moved = make(chan struct{})
		}
		moved := r.moved
		r.mu.Unlock()
		select {
		case <-moved:
			stalled = time.Now()
			last, _ = unsent(r.shared)
		case <-tick.C:
			if q, ok := unsent(r.shared); ok {
				if q < last {
					stalled = time.Now()
				}
				last = q
			}
		}
		r.mu.Lock()
		switch {
		case r.failed:
			return errExchangeFailed
		case r.err != nil:
			return r.err
		case time.Since(stalled) >= interimStall:
			return errPeerNotReading
		}
	}
	return nil
}

// flush writes the queued heads out, waiting for the peer as long as the
// exchange's watch allows: its expiry ends the write. What it has taken
// counts against the limit until it is all written, as its array lives
// until then. It writes flushChunk bytes at a time, each a progress the
// read loop sees (roomFor).
func (r *relay) flush() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.pending) > 0 && r.err == nil {
		b := r.pending
		r.pending, r.inFlight = nil, len(b)
		for len(b) > 0 && r.err == nil {
			c := b[:min(len(b), flushChunk)]
			b = b[len(c):]
			r.mu.Unlock()
			_, err := r.shared.Write(c)
			r.mu.Lock()
			if err != nil {
				r.fail(err)
			}
			r.wake()
		}
		r.inFlight = 0
	}
	r.pending, r.flushing = nil, false
	r.wake()
	close(r.flushed)
}

// wake tells a read loop waiting for room that the queue moved.
func (r *relay) wake() {
	if r.moved != nil {
		close(r.moved)
		r.moved = nil
	}
}

// settle waits until the queued heads are out, or failed to go, before the
// serving goroutine writes what follows them.
func (r *relay) settle() {
	r.mu.Lock()
	flushed := r.flushed
	r.mu.Unlock()
	if flushed != nil {
		<-flushed
	}
}

// errPeerWrite marks a failure to write to the peer stream.
var errPeerWrite = errors.New("proxy: writing to peer failed")

func (r *relay) fail(err error) error {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %w", errPeerWrite, err)
	}
	return r.err
}

// response relays the final response onto the unix leg and reports whether
// the stream is still in step for another exchange. The head keeps the
// upstream's headers; the body keeps its framing (Content-Length or chunked
// with trailers), except that a body delimited by the upstream closing is
// re-framed as chunked so the stream can persist; a head flag tells the
// client to restore what the upstream actually sent.
func (r *relay) response(resp *http.Response, req *http.Request, nc net.Conn, br *bufio.Reader) bool {
	defer resp.Body.Close()
	r.settle()
	if r.err != nil {
		return false
	}
	r.accept()
	code := resp.StatusCode
	var hf headFlags
	if !resp.ProtoAtLeast(1, 1) {
		hf |= headProto10
	}
	if resp.Close {
		hf |= headClose
	}
	// Decided now, and told: a body still unread when the head goes out
	// means the stream ends with this exchange, whatever happens to the
	// rest of the body meanwhile.
	r.keepStream = r.reqDone == nil || r.reqDone()
	if !r.keepStream {
		hf |= headStreamEnds
	}
	chunked := len(resp.TransferEncoding) > 0
	h2 := resp.ProtoMajor == 2
	hasBody := req.Method != http.MethodHead && resp.ContentLength != 0 && resp.Body != http.NoBody &&
		code != http.StatusSwitchingProtocols && code != http.StatusNoContent && code != http.StatusNotModified
	switch {
	case h2:
		// The name is the unix leg's own (streamReset): never the
		// upstream's.
		resp.Trailer.Del(streamResetTrailer)
		// An HTTP/2 body of any length may end with trailers: chunked
		// carries them, and the head carries the declared length.
		hf |= headProto2
		if (code == http.StatusNoContent || code == http.StatusNotModified) && req.Method != http.MethodHead &&
			resp.ContentLength != 0 && resp.Body != http.NoBody {
			// A status that allows no body (a 204, a 304) whose HEADERS
			// did not end the stream (x/net/http2 gives one that did
			// length 0): it may still end with trailers, which only a
			// chunked body carries. net/http's HTTP/1.1 reader reads no
			// body for such a status, chunked or not: the head crosses
			// as a 200 and tells the real status (headStatus). A
			// declared length of 0 is left as it is: x/net/http2 gives
			// it the same body whether the HEADERS ended the stream (the
			// commonest empty answer, which a caller closes unread) or
			// trailers follow, and only the first may keep the unix
			// stream when closed unread.
			hf |= headStatus
			hasBody = true
		}
		if hasBody && resp.ContentLength < 0 {
			hf |= headCloseDelimited
		}
		chunked = hasBody
	case hasBody && resp.ContentLength < 0 && !chunked:
		hf |= headCloseDelimited
		chunked = true
		// Chunked, the sibling's reader would take the upstream's
		// Trailer header as announcing trailers (and refuse the response
		// for a key such as Content-Length), where net/http leaves it in
		// the header of a body read to the close. It crosses under the
		// leg's own name, never the upstream's, and fixResponse puts it
		// back.
		resp.Header.Del(relayedTrailerHeader)
		if v, ok := resp.Header["Trailer"]; ok {
			resp.Header[relayedTrailerHeader] = v
			delete(resp.Header, "Trailer")
		}
	}
	bw := r.bw
	if h2 && resp.ContentLength >= 0 && hasBody {
		hf |= headLength
		resp.Header.Del("Content-Length")
	}
	bw.Write(appendHeadFields(r.scratch[:0], hf, resp.ContentLength, code))
	if hf&headStatus != 0 {
		bw.WriteString("HTTP/1.1 200 OK\r\n")
	} else {
		writeStatusLine(bw, resp)
	}
	wrapPadded(resp.Header, responseMoves).Write(bw)
	if chunked {
		bw.WriteString("Transfer-Encoding: chunked\r\n")
	}
	// x/net/http2 takes an HTTP/2 answer's announced trailer keys out of
	// its header, whatever its body: they cross announced, and without a
	// body the sibling takes them out again (remoteLeg.fixResponse).
	if len(resp.Trailer) > 0 && (chunked || h2) {
		keys := make([]string, 0, len(resp.Trailer))
		for k := range resp.Trailer {
			switch k {
			case "Content-Length", "Transfer-Encoding", "Trailer":
				if chunked {
					// An HTTP/2 upstream may announce these, and
					// x/net/http2 takes them; net/http's HTTP/1.1
					// reader refuses the whole response for them
					// ("bad trailer key"). Not announced, a value
					// sent still arrives.
					continue
				}
			}
			keys = append(keys, k)
		}
		if len(keys) > 0 {
			bw.WriteString("Trailer: " + strings.Join(keys, ", ") + "\r\n")
		}
	}
	bw.WriteString("\r\n")
	if code == http.StatusSwitchingProtocols {
		if err := bw.Flush(); err != nil {
			return false
		}
		if r.stopWatch != nil {
			r.stopWatch()
		}
		if up, ok := resp.Body.(*upgradeBody); ok {
			tunnel(up, nc, br, r.reqDone, r.log)
		}
		return false
	}
	if !hasBody {
		if err := bw.Flush(); err != nil {
			r.fail(err)
		}
		return r.err == nil
	}
	if b, ok := resp.Body.(*body); ok && !chunked {
		if handled, err := b.spliceTo(nc, bw, resp.ContentLength); handled {
			if err != nil {
				if errors.Is(err, errPeerWrite) {
					r.err = err
				}
				r.log.Debug("relay ended early", zap.Error(err))
				return false
			}
			r.spliced = true
			return true
		}
	}
	if err := r.copyBody(resp, chunked); err != nil {
		r.log.Debug("relay ended early", zap.Error(err))
		return false
	}
	return true
}

// relayedTrailerHeader carries the Trailer header of a response whose body
// runs to the upstream's close (headCloseDelimited) across the unix leg.
const relayedTrailerHeader = "Orbit-Trailer"

// writeStatusLine writes the upstream's status verbatim: net/http's reader
// keeps everything after the version (left-trimmed) as Status, so writing it
// back gives the caller the same Status, reason phrase or none.
func writeStatusLine(bw *bufio.Writer, resp *http.Response) {
	bw.WriteString("HTTP/1.1 ")
	bw.WriteString(resp.Status)
	bw.WriteString("\r\n")
}

// copyBody streams the body: everything received is flushed to the peer
// before the relay waits on the upstream again, so a stream's chunks arrive
// as they are produced, while a body that is already buffered goes out in
// full writes.
func (r *relay) copyBody(resp *http.Response, chunked bool) error {
	bp := getCopyBuf(r.bufs)
	defer putCopyBuf(bp)
	buf := *bp
	bw := r.bw
	src, _ := resp.Body.(buffered)
	for {
		if bw.Buffered() > 0 && (src == nil || src.buffered() == 0) {
			if err := bw.Flush(); err != nil {
				return r.fail(err)
			}
		}
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if chunked {
				h := strconv.AppendInt(r.scratch[:0], int64(n), 16)
				h = append(h, '\r', '\n')
				bw.Write(h)
			}
			bw.Write(buf[:n])
			if chunked {
				bw.WriteString("\r\n")
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			var se http2.StreamError
			if resp.ProtoMajor == 2 && chunked && errors.As(rerr, &se) {
				// The upstream reset the stream: the body ends with the
				// reset in its trailer, and the caller reads the same
				// stream error as from a local exchange.
				r.log.Debug("upstream reset the stream mid-body", zap.Error(rerr))
				fmt.Fprintf(bw, "0\r\n%s: %d %d\r\n\r\n", streamResetTrailer, se.StreamID, uint32(se.Code))
				if err := bw.Flush(); err != nil {
					return r.fail(err)
				}
				return nil
			}
			// The peer sees the stream end mid-body: an error there too,
			// after the bytes read with it, as a local caller reads them.
			bw.Flush()
			return rerr
		}
	}
	if chunked {
		bw.WriteString("0\r\n")
		if resp.ProtoMajor == 2 {
			// The trailers follow the chunked body's end, as a block of
			// their own (see body.readTrailerBlock).
			resp.Trailer.Del(streamResetTrailer)
			bw.WriteString("\r\n")
		}
		wrapPadded(resp.Trailer, responseMoves).Write(bw)
		bw.WriteString("\r\n")
	}
	if err := bw.Flush(); err != nil {
		return r.fail(err)
	}
	return nil
}

// tunnel joins an upgraded upstream connection and the peer stream until
// both directions end, passing each half-close on. The upstream may have
// switched protocols before the request body was all sent, and the body
// comes from the same stream as the tunnel's bytes after it: the stream has
// one reader at a time, so the tunnel reads it only once the exchange's
// writer has stopped, and only if that writer read the body to its end
// (otherwise what follows on the stream is the rest of a body, not tunnel).
func tunnel(up *upgradeBody, nc net.Conn, br *bufio.Reader, reqDone func() bool, log *zap.Logger) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			if p := recover(); p != nil {
				recovered(log, "tunnel", p)
				up.Close()
				nc.Close()
			}
		}()
		if _, err := io.Copy(nc, up); err != nil && !errors.Is(err, net.ErrClosed) {
			log.Debug("tunnel upstream->peer", zap.Error(err))
			nc.Close()
		}
		closeWrite(nc)
	}()
	<-up.requestWritten()
	// The exchange's deadline bounded the request; the tunnel lives on.
	nc.SetReadDeadline(time.Time{})
	if reqDone != nil && !reqDone() {
		log.Debug("tunnel: request body not sent whole; closing")
		up.Close()
		nc.Close()
	} else if _, err := io.Copy(up, br); err != nil {
		log.Debug("tunnel peer->upstream", zap.Error(err))
		up.Close()
	} else {
		closeWrite(up)
	}
	<-done
	up.Close()
	nc.Close()
}

// closeWrite half-closes c's write side, if it has one.
func closeWrite(c any) error {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.New("proxy: connection does not support CloseWrite")
}
