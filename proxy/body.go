package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/textproto"
	"sync"
	"sync/atomic"

	"golang.org/x/net/http2"
)

var errReadOnClosedBody = errors.New("http: read on closed response body")

// body is a response body that gives its connection back when it has been
// read to the end, and tears it down when it is closed early: draining an
// unknown remainder (an endless stream) could take forever, so net/http closes
// the connection too.
type body struct {
	rc   io.ReadCloser // net/http's framing reader: length, chunks, trailers
	x    *exchange
	keep bool // the connection may be reused after this body
	// relayed is the response, if a sibling relayed it: its trailers may
	// carry fields the relay wrapped (see paddedField) and, if h2 (from an
	// HTTP/2 upstream), the upstream's reset of the stream.
	relayed *http.Response
	h2      bool

	mu      sync.Mutex
	closed  bool
	rerr    error
	reading int // Reads under way: a Close meanwhile leaves end to the last
	ended   atomic.Bool
}

func (b *body) Read(p []byte) (int, error) {
	b.mu.Lock()
	closed, rerr := b.closed, b.rerr
	if !closed && rerr == nil {
		b.reading++
	}
	b.mu.Unlock()
	if closed {
		return 0, errReadOnClosedBody
	}
	if rerr != nil {
		return 0, rerr
	}
	n, err := b.rc.Read(p)
	b.mu.Lock()
	b.reading--
	closedMeanwhile := b.closed && b.reading == 0
	b.mu.Unlock()
	if closedMeanwhile && err == nil {
		b.end(false)
	}
	if err == nil {
		return n, nil
	}
	eof := err == io.EOF
	if !eof {
		err = b.mapErr(err)
	} else if b.relayed != nil {
		eof, err = b.relayedTrailers()
	}
	b.stop(err, eof)
	return n, err
}

// stop records how the body ended, err for every later Read, and releases
// the read side: for reuse if eof.
func (b *body) stop(err error, eof bool) {
	b.mu.Lock()
	if b.rerr == nil {
		b.rerr = err
	}
	b.mu.Unlock()
	b.end(eof)
}

// streamResetTrailer ends the relayed body of an HTTP/2 response whose
// stream the upstream reset: "<stream ID> <error code>", in decimal.
const streamResetTrailer = "Orbit-Stream-Reset"

// relayedTrailers restores the trailers of a relayed response whose body
// has ended, and returns whether the unix stream is still in step (not
// after trailers it could not read, of which some may be left) and the
// error its reader gets: io.EOF, or the stream error of an upstream's reset.
func (b *body) relayedTrailers() (inStep bool, err error) {
	if b.h2 {
		if err := takeStreamReset(b.relayed); err != nil {
			return true, err
		}
		if err := b.readTrailerBlock(); err != nil {
			return false, err
		}
	}
	if err := unwrapPadded(b.relayed.Trailer); err != nil {
		return false, &Error{Op: "read body", Err: fmt.Errorf("%w: %w", ErrBadResponse, err)}
	}
	return true, io.EOF
}

// readTrailerBlock reads the trailers of a relayed HTTP/2 response, which
// the relay sends after the chunked body's end as a block of their own,
// bounded as a head is. In the chunked body's own trailer section net/http's
// reader would take no more than its read buffer holds (4 KiB, "suspiciously
// long trailer"), where x/net/http2 takes them up to the header limit: a
// gRPC status with rich details would fail through a sibling alone.
func (b *body) readTrailerBlock() error {
	c := b.x.c
	h, over, err := readFieldBlock(c.br, &c.lr, b.x.headLimit())
	switch {
	case over:
		return &Error{Op: "read body", Err: fmt.Errorf("%w: trailers over the header limit", ErrBadResponse)}
	case err != nil:
		return &Error{Op: "read body", Err: fmt.Errorf("%w: trailers: %w", ErrBadResponse, err)}
	}
	setFields(&b.relayed.Trailer, h)
	return nil
}

// readFieldBlock reads a block of header fields, up to its empty line, from
// br, which lr feeds: over says it did not end within limit bytes read.
func readFieldBlock(br *bufio.Reader, lr *limitReader, limit int64) (h http.Header, over bool, err error) {
	lr.n = limit
	mh, err := textproto.NewReader(br).ReadMIMEHeader()
	over = lr.n <= 0
	lr.n = math.MaxInt64
	return http.Header(mh), over, err
}

// setFields sets the fields of h in *dst, making it if it is nil and h is
// not empty.
func setFields(dst *http.Header, h http.Header) {
	if len(h) > 0 && *dst == nil {
		*dst = make(http.Header, len(h))
	}
	for k, v := range h {
		(*dst)[k] = v
	}
}

// errResetFromPeer is the cause of a stream error the upstream sent, as
// x/net/http2 words it.
var errResetFromPeer = errors.New("received from peer")

// takeStreamReset removes the reset trailer from resp and returns the
// stream error it names, as x/net/http2 returns it to a local reader of the
// body; nil if there is none.
func takeStreamReset(resp *http.Response) error {
	v := resp.Trailer.Values(streamResetTrailer)
	if v == nil {
		return nil
	}
	resp.Trailer.Del(streamResetTrailer)
	if len(resp.Trailer) == 0 {
		// net/http's reader made the map for the reset alone; x/net's
		// client leaves none where no trailer was announced.
		resp.Trailer = nil
	}
	var id, code uint32
	if len(v) != 1 {
		return &Error{Op: "read body", Err: fmt.Errorf("%w: %d stream reset trailers", ErrBadResponse, len(v))}
	}
	if _, err := fmt.Sscanf(v[0], "%d %d", &id, &code); err != nil {
		return &Error{Op: "read body", Err: fmt.Errorf("%w: stream reset trailer %q: %w", ErrBadResponse, v[0], err)}
	}
	return http2.StreamError{StreamID: id, Code: http2.ErrCode(code), Cause: errResetFromPeer}
}

func (b *body) mapErr(err error) error {
	if aerr := b.x.c.aborted(); aerr != nil {
		return aerr
	}
	if cerr := ctxErr(b.x.req.Context()); cerr != nil {
		b.x.c.abort(cerr)
		return cerr
	}
	b.x.c.abort(err)
	var pe *Error
	if errors.As(err, &pe) {
		return err
	}
	return &Error{Op: "read body", Err: fmt.Errorf("%w: %w", ErrConnBroken, err)}
}

// end releases the read side of the exchange, once.
func (b *body) end(eof bool) {
	if b.ended.CompareAndSwap(false, true) {
		b.x.finishRead(eof && b.keep)
	}
}

// Close tears the connection down unless the body was read to its end. A
// Read still under way returns, and it, not Close, releases the connection:
// its owner may hand the connection on, or read what is left of it (see
// conn.lingers), only once nothing else reads it.
func (b *body) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	rerr, reading := b.rerr, b.reading > 0
	b.mu.Unlock()
	if rerr == nil && !b.ended.Load() {
		b.x.c.abort(errBodyClosed)
	}
	if !reading {
		b.end(rerr == io.EOF)
	}
	return nil
}

var errBodyClosed = errors.New("response body closed before the end")

// upgradeBody is the Body of a 101 Switching Protocols response: the
// connection itself, read-write, with CloseWrite for half-close. Bytes the
// head reader buffered past the 101 are read first. An upstream may switch
// protocols before it has read the request body; the body is still the
// first thing on the connection, so writes wait until it is out.
type upgradeBody struct {
	c       *conn
	written <-chan struct{} // closed once the request writer has stopped
	once    sync.Once
}

func newUpgradeBody(c *conn, written <-chan struct{}) *upgradeBody {
	return &upgradeBody{c: c, written: written}
}

// requestWritten is closed once the request, body included, has been
// written or its writer has given up.
func (u *upgradeBody) requestWritten() <-chan struct{} { return u.written }

func (u *upgradeBody) Read(p []byte) (int, error) {
	if u.c.br.Buffered() > 0 {
		return u.c.br.Read(p)
	}
	return u.c.nc.Read(p)
}

func (u *upgradeBody) Write(p []byte) (int, error) {
	<-u.written
	return u.c.nc.Write(p)
}

// CloseWrite half-closes the connection once the request is out: the peer
// reads EOF, and this side can still read what it sends.
func (u *upgradeBody) CloseWrite() error {
	<-u.written
	return u.c.closeWrite()
}

func (u *upgradeBody) Close() error {
	u.once.Do(u.c.close)
	return nil
}

// maxEarlyBody is the largest response body taken off its connection before
// the response is returned, when it came with the head: the connection then
// goes back to the pool at once, not after the caller has written the head
// to its client and read on to the end. Under a cap that is the time a
// waiting request loses on every turn of a connection.
const maxEarlyBody = readBufSize

// earlyBody is a response body read in full, from the connection's buffer,
// before its response was returned. It reads as body does: the bytes, with
// io.EOF on the read that returns the last of them, and errReadOnClosedBody
// once closed.
type earlyBody struct {
	mu     sync.Mutex
	r      bytes.Reader
	closed bool
}

// takeEarly reads resp's body of n bytes, all of it in br already, into an
// earlyBody.
func takeEarly(resp *http.Response, n int64) (*earlyBody, error) {
	p := make([]byte, n)
	if _, err := io.ReadFull(resp.Body, p); err != nil {
		return nil, err
	}
	b := new(earlyBody)
	b.r.Reset(p)
	return b, nil
}

func (b *earlyBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, errReadOnClosedBody
	}
	n, err := b.r.Read(p)
	if n > 0 && b.r.Len() == 0 {
		err = io.EOF // with the last bytes, as net/http's body does
	}
	return n, err
}

func (b *earlyBody) Close() error {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	return nil
}

// buffered lets a relay write the head and the body in one write.
func (b *earlyBody) buffered() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.r.Len()
}
