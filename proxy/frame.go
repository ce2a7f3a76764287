package proxy

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// The unix leg's frames. Both directions start with a small fixed header so a
// reader can reject garbage after a few bytes, before it parses any HTTP:
//
//	request  = magic(2) version(1) type(1) flags(2) leaseLen(2) deadline(8) lease(leaseLen)
//	           [length(8) if flags has flagLength] [waitLeft(8) if flags has flagWaitLeft]
//	           followed by one HTTP/1.1 request
//	response = magic(2) version(1) type(1) flags(2) code(2) msgLen(2) msg(msgLen)
//	           [waited(8) if an accept's flags have flagAcceptWaited]
//	           followed, for an accept, by HTTP/1.1 responses, each after a head marker
//	head     = 'H' flags(1) [length(8) if flags has headLength] [status(2) if flags has headStatus]
//	           | an error frame, in place of a head, when the owner's exchange failed after its
//	             accept (or a 1xx) went out; the owner ends the stream after it
//
// Version 2 added the HTTP/2 head flags (headProto2, headLength) and the
// request's flagLength; version 3 the trailer streamResetTrailer, which ends
// the chunked body of an HTTP/2 response whose stream the upstream reset
// (RST_STREAM) mid-body; version 4 the error codes of a request head the
// owner refused (errCodeReqHeaderTooLarge, errCodeReqMalformed), which an
// earlier build would take for a malformed frame, and the error frame's
// flagConnGone; version 5 the field paddedField, in request heads and in
// response heads and trailers, an HTTP/2 response's trailers after its
// chunked body (see body.readTrailerBlock), and flagNoUserAgent; version 6
// the head flag headStatus, for an HTTP/2 answer without a body that may
// end with trailers, and flagNoInterim; version 7 the error frame in place
// of a head, and its flagResponseBegan; version 8 the accept frame's
// flagAcceptH2; version 9 the request's flagWaitLeft; version 10 the
// accept frame's flagAcceptWaited. The processes of one
// fleet must run builds that speak the same unix leg: one of another
// version cannot join the fleet's segment (Protocol), and a frame of
// another version is refused with an error that names both versions.
// Integers are big-endian. Every field is checked strictly: unknown types or
// flag bits, oversized lengths and non-UTF-8 messages are errors, and a peer
// that sends one loses its stream (and only its stream).
const (
	// Protocol is the unix leg's version, for a fleet's pool spec
	// (orbitpool.PoolSpec.Protocol): a process of another build joins no
	// fleet whose owners it could not talk to.
	Protocol = frameVersion

	frameMagic0   = 'O'
	frameMagic1   = 'R'
	frameVersion  = 10
	maxLeaseLen   = 64
	maxMessageLen = 1024

	reqHeaderLen  = 16
	respHeaderLen = 10
)

type frameType uint8

const (
	frameRequest frameType = 1 + iota
	frameAccept
	frameReject
	frameError
)

// Response frame flags.
const (
	// flagNothingSent on an error frame: the owner sent nothing to the
	// upstream, so the request may be retried anywhere.
	flagNothingSent uint16 = 1 << iota
	// flagIdleClosed on an error frame: the owner's reused connection
	// closed before answering, so a replayable request may be sent again.
	flagIdleClosed
	// flagConnGone on an error frame: the owner's HTTP/2 connection
	// refused the stream for good as it went away (see Error.connGone).
	flagConnGone
	// flagResponseBegan on an error frame: some of the upstream's response
	// had come (an interim head not relayed, the start of a bad head), so
	// the caller's trace sees its first response byte, as on its own
	// connection.
	flagResponseBegan

	respFlagsKnown = flagNothingSent | flagIdleClosed | flagConnGone | flagResponseBegan

	// flagAcceptH2 on an accept frame: the owner runs the exchange on an
	// HTTP/2 connection, and a failed exchange closes its body, as x/net's
	// client does (see exchange.ownerH2).
	flagAcceptH2 uint16 = 1
	// flagAcceptWaited on an accept frame: the owner waited (nanoseconds,
	// in the field after the frame's header) for a worker before it took
	// the request up, which the caller counts as its wait for a
	// connection (see WaitWatcher.OwnerWaited).
	flagAcceptWaited uint16 = 2

	acceptFlagsKnown = flagAcceptH2 | flagAcceptWaited
)

// Request frame flags.
const (
	// flagBodyOnAccept: the caller sends the request body only once the
	// owner has answered with an accept frame, which the owner sends when
	// its writer first needs the body (or with the first response). A
	// reject or error frame before it leaves the body unsent, so the
	// caller may retry it whatever the method, and the stream in step: the
	// owner skips the request head, and both keep the stream. Without the
	// flag, a caller sent a short body (at most maxBodyWithHead) in full
	// with its head (see withBodyAhead): the owner reads it before it
	// answers, so the stream stays in step whatever the answer, and the
	// caller, which kept the body, may send it again elsewhere. A longer
	// body without the flag ends the stream on a refusal.
	flagBodyOnAccept uint16 = 1 << iota
	// flagLength: the request declared the Content-Length in the frame
	// and trailers; it is sent chunked on the unix leg, which alone can
	// carry its trailers, and the owner restores the length.
	flagLength
	// flagNoUserAgent: the request has no User-Agent field, so the
	// owner's exchange sends its own client's default, HTTP/1.1's or
	// HTTP/2's, as a local exchange does. The head on the unix leg carries
	// HTTP/1.1's (http.Request.Write adds it), which the owner drops.
	// Without the flag a head without the field means the caller chose to
	// send none.
	flagNoUserAgent
	// flagNoInterim: the caller reads no interim responses (its trace has
	// no Got1xxResponse), so they count with the final head against one
	// header limit, as net/http counts them for such a caller: the owner
	// bounds them so (see interimShareLimit), and relays only a 100.
	flagNoInterim
	// flagWaitLeft: the caller waits for a connection at most waitLeft
	// (nanoseconds) longer, from when it writes the frame: the owner waits
	// for a worker no longer than that (see server.budget), so that its
	// refusal comes within the caller's wait timeout.
	flagWaitLeft

	reqFlagsKnown = flagBodyOnAccept | flagLength | flagNoUserAgent | flagNoInterim | flagWaitLeft
)

// maxFrameWait bounds the waits frames carry, a request's waitLeft and an
// accept's waited (about 146 years): a caller's longer wait, a
// wait_timeout of no practical bound, goes as that.
const maxFrameWait = 1 << 62

// Reject reasons.
const (
	rejectUnknown  uint16 = iota // unclassified
	rejectStale                  // the lease names no live reservation
	rejectDeadline               // the deadline had passed on arrival
	rejectGone                   // the connection was closed meanwhile
	rejectClosing                // the owner is shutting down
	rejectOverload               // the owner's budget refused the work
	rejectMax
)

// Error frame codes: the class of the owner's failure, so the caller gets
// the same sentinel it would have got on its own connection.
const (
	errCodeOther uint16 = iota
	errCodeBadResponse
	errCodeHeaderTooLarge
	errCodeConnBroken
	errCodeHeaderTimeout
	errCodeDeadline
	errCodeReqHeaderTooLarge
	errCodeReqMalformed
	errCodeMax
)

var errCodeSentinels = [errCodeMax]error{
	errCodeBadResponse:    ErrBadResponse,
	errCodeHeaderTooLarge: ErrHeaderTooLarge,
	errCodeConnBroken:     ErrConnBroken,
	errCodeHeaderTimeout:  ErrResponseHeaderTimeout,
	errCodeDeadline:       context.DeadlineExceeded,
	// The owner's own refusal of a sibling's head (see refuseHead).
	errCodeReqHeaderTooLarge: ErrRequestHeaderTooLarge,
	errCodeReqMalformed:      errMalformedRequestHead,
}

func errCode(err error) uint16 {
	for c, s := range errCodeSentinels {
		if s != nil && errors.Is(err, s) {
			return uint16(c)
		}
	}
	return errCodeOther
}

// headFlags describe how the owner relayed one response head.
type headFlags uint8

const (
	// headProto10: the upstream spoke HTTP/1.0.
	headProto10 headFlags = 1 << iota
	// headCloseDelimited: the upstream body ran to connection close; the
	// relay re-framed it as chunked.
	headCloseDelimited
	// headClose: the upstream response asked for the connection to close
	// (Response.Close), which says nothing about the unix stream.
	headClose
	// headStreamEnds: the owner ends the unix stream after this response,
	// for it did not read the whole request body (an upstream that
	// answered without it): the caller must not send another request on
	// it, even if, on its side, the body went out whole.
	headStreamEnds
	// headProto2: the upstream spoke HTTP/2; the relay framed its body as
	// chunked (with its trailers), which the caller undoes.
	headProto2
	// headLength: the upstream's response declared this Content-Length,
	// carried in the 8 bytes after the head flags because the relay framed
	// the body as chunked (an HTTP/2 body may end with trailers whatever
	// its length).
	headLength
	// headStatus: the upstream's HTTP/2 answer has a status that allows
	// no body (204, 304) and a stream that may still end with trailers:
	// the relay sent its head as a 200 with a chunked body, which
	// net/http's HTTP/1.1 reader would not read for the real status, and
	// that status follows the head flags (and the length) in 2 bytes.
	headStatus

	headFlagsKnown = headProto10 | headCloseDelimited | headClose | headStreamEnds | headProto2 | headLength | headStatus
	headMarker     = 'H'
)

// requestFrame precedes a request on the unix leg.
type requestFrame struct {
	flags    uint16
	deadline int64 // unix nanoseconds; 0 means none
	length   int64 // with flagLength
	waitLeft int64 // with flagWaitLeft; 0 means none
	leaseLen uint8
	lease    [maxLeaseLen]byte
}

func (f *requestFrame) leaseBytes() []byte { return f.lease[:f.leaseLen] }

func (f *requestFrame) deadlineTime() (time.Time, bool) {
	if f.deadline == 0 {
		return time.Time{}, false
	}
	return time.Unix(0, f.deadline), true
}

// appendRequestFrameWait encodes a request frame, with flagLength and
// length when length >= 0, and flagWaitLeft and waitLeft when waitLeft > 0.
func appendRequestFrameWait(b []byte, lease []byte, deadline time.Time, flags uint16, length int64, waitLeft time.Duration) ([]byte, error) {
	flags &^= flagLength | flagWaitLeft
	if length >= 0 {
		flags |= flagLength
	}
	if waitLeft > 0 {
		flags |= flagWaitLeft
		waitLeft = min(waitLeft, maxFrameWait)
	}
	if len(lease) == 0 || len(lease) > maxLeaseLen {
		return b, fmt.Errorf("%w: lease of %d bytes", ErrBadFrame, len(lease))
	}
	var dl int64
	if !deadline.IsZero() {
		dl = max(deadline.UnixNano(), 1)
	}
	b = append(b, frameMagic0, frameMagic1, frameVersion, byte(frameRequest))
	b = binary.BigEndian.AppendUint16(b, flags)
	b = binary.BigEndian.AppendUint16(b, uint16(len(lease)))
	b = binary.BigEndian.AppendUint64(b, uint64(dl))
	b = append(b, lease...)
	if length >= 0 {
		b = binary.BigEndian.AppendUint64(b, uint64(length))
	}
	if waitLeft > 0 {
		b = binary.BigEndian.AppendUint64(b, uint64(waitLeft))
	}
	return b, nil
}

// decodeRequestFrame decodes one request frame from the start of b and
// returns its length. errShort means b holds only a prefix of a valid frame;
// then n is the full length when b holds enough to know it.
func decodeRequestFrame(b []byte) (f requestFrame, n int, err error) {
	if err := checkPrefix(b, frameRequest); err != nil {
		return f, 0, err
	}
	if len(b) < reqHeaderLen {
		return f, 0, errShort
	}
	f.flags = binary.BigEndian.Uint16(b[4:])
	if f.flags&^reqFlagsKnown != 0 {
		return f, 0, fmt.Errorf("%w: unknown request flags %#x", ErrBadFrame, f.flags)
	}
	ll := int(binary.BigEndian.Uint16(b[6:]))
	if ll == 0 || ll > maxLeaseLen {
		return f, 0, fmt.Errorf("%w: lease length %d", ErrBadFrame, ll)
	}
	dl := binary.BigEndian.Uint64(b[8:])
	if dl > 1<<63-1 {
		return f, 0, fmt.Errorf("%w: negative deadline", ErrBadFrame)
	}
	f.deadline = int64(dl)
	n = reqHeaderLen + ll
	if f.flags&flagLength != 0 {
		n += 8
	}
	if f.flags&flagWaitLeft != 0 {
		n += 8
	}
	if len(b) < n {
		return f, n, errShort
	}
	f.leaseLen = uint8(ll)
	copy(f.lease[:], b[reqHeaderLen:reqHeaderLen+ll])
	f.length = -1
	off := reqHeaderLen + ll
	if f.flags&flagLength != 0 {
		l := binary.BigEndian.Uint64(b[off:])
		if l > 1<<62 {
			return f, 0, fmt.Errorf("%w: request length %d", ErrBadFrame, l)
		}
		f.length = int64(l)
		off += 8
	}
	if f.flags&flagWaitLeft != 0 {
		w := binary.BigEndian.Uint64(b[off:])
		if w == 0 || w > maxFrameWait {
			return f, 0, fmt.Errorf("%w: wait left %d", ErrBadFrame, w)
		}
		f.waitLeft = int64(w)
	}
	return f, n, nil
}

// responseFrame answers a request frame.
type responseFrame struct {
	typ    frameType
	flags  uint16
	code   uint16
	msg    string
	waited time.Duration // an accept's, with flagAcceptWaited
}

// waits reports whether the frame is an accept that carries the owner's
// wait: the flag's bit means another thing on an error frame.
func (f responseFrame) waits() bool {
	return f.typ == frameAccept && f.flags&flagAcceptWaited != 0
}

func appendResponseFrame(b []byte, f responseFrame) []byte {
	msg := f.msg
	if len(msg) > maxMessageLen {
		msg = msg[:maxMessageLen]
	}
	msg = strictUTF8(msg)
	b = append(b, frameMagic0, frameMagic1, frameVersion, byte(f.typ))
	b = binary.BigEndian.AppendUint16(b, f.flags)
	b = binary.BigEndian.AppendUint16(b, f.code)
	b = binary.BigEndian.AppendUint16(b, uint16(len(msg)))
	b = append(b, msg...)
	if f.waits() {
		b = binary.BigEndian.AppendUint64(b, uint64(min(max(f.waited, 1), maxFrameWait)))
	}
	return b
}

// strictUTF8 trims a truncated rune so the message still decodes.
func strictUTF8(s string) string {
	for !utf8.ValidString(s) && len(s) > 0 {
		s = s[:len(s)-1]
	}
	return s
}

// decodeResponseFrame decodes one response frame from the start of b and
// returns its length. On errShort, n is the full length when b holds enough
// to know it.
func decodeResponseFrame(b []byte) (f responseFrame, n int, err error) {
	if len(b) < 4 {
		return f, 0, checkPrefix(b, 0)
	}
	f.typ = frameType(b[3])
	if err := checkPrefix(b, f.typ); err != nil {
		return f, 0, err
	}
	switch f.typ {
	case frameAccept, frameReject, frameError:
	default:
		return f, 0, fmt.Errorf("%w: response frame type %d", ErrBadFrame, f.typ)
	}
	if len(b) < respHeaderLen {
		return f, 0, errShort
	}
	f.flags = binary.BigEndian.Uint16(b[4:])
	f.code = binary.BigEndian.Uint16(b[6:])
	ml := int(binary.BigEndian.Uint16(b[8:]))
	known := respFlagsKnown
	if f.typ == frameAccept {
		known = acceptFlagsKnown
	}
	if f.flags&^known != 0 {
		return f, 0, fmt.Errorf("%w: unknown response flags %#x", ErrBadFrame, f.flags)
	}
	switch f.typ {
	case frameAccept:
		if f.code != 0 || ml != 0 {
			return f, 0, fmt.Errorf("%w: accept frame with payload", ErrBadFrame)
		}
	case frameReject:
		if f.flags != 0 || f.code >= rejectMax {
			return f, 0, fmt.Errorf("%w: reject frame flags %#x code %d", ErrBadFrame, f.flags, f.code)
		}
	case frameError:
		if f.code >= errCodeMax {
			return f, 0, fmt.Errorf("%w: error frame code %d", ErrBadFrame, f.code)
		}
	}
	if ml > maxMessageLen {
		return f, 0, fmt.Errorf("%w: message length %d", ErrBadFrame, ml)
	}
	n = respHeaderLen + ml
	if f.waits() {
		n += 8
	}
	if len(b) < n {
		return f, n, errShort
	}
	msg := b[respHeaderLen : respHeaderLen+ml]
	if !utf8.Valid(msg) {
		return f, 0, fmt.Errorf("%w: message is not UTF-8", ErrBadFrame)
	}
	f.msg = string(msg)
	if f.waits() {
		w := binary.BigEndian.Uint64(b[respHeaderLen+ml:])
		if w == 0 || w > maxFrameWait {
			return f, 0, fmt.Errorf("%w: accept's wait %d", ErrBadFrame, w)
		}
		f.waited = time.Duration(w)
	}
	return f, n, nil
}

func checkPrefix(b []byte, typ frameType) error {
	for i, want := range [...]byte{frameMagic0, frameMagic1, frameVersion, byte(typ)} {
		if i >= len(b) {
			return errShort
		}
		if b[i] != want {
			if i == 2 {
				return fmt.Errorf("%w: unix-leg frame version %d, this process speaks version %d (the sibling runs another orbit build)", ErrBadFrame, b[i], frameVersion)
			}
			if i < 2 {
				return fmt.Errorf("%w: bad magic", ErrBadFrame)
			}
			return fmt.Errorf("%w: frame type %d, want %d", ErrBadFrame, b[i], typ)
		}
	}
	return nil
}

var errShort = fmt.Errorf("%w: truncated", ErrBadFrame)

// readFrame reads one frame from br: the fixed header first, then the rest
// once the header says how long it is. Frames are far smaller than br's
// buffer, so Peek never needs to grow it.
func readFrame[F any](br *bufio.Reader, headerLen int, decode func([]byte) (F, int, error)) (F, error) {
	need := headerLen
	for {
		b, err := br.Peek(need)
		f, n, derr := decode(b)
		if derr == nil {
			br.Discard(n)
			return f, nil
		}
		if derr != errShort {
			return f, derr
		}
		if err != nil {
			return f, err
		}
		if n <= need || n > br.Size() {
			return f, fmt.Errorf("%w: bad length", ErrBadFrame)
		}
		need = n
	}
}

func appendHead(b []byte, f headFlags) []byte { return append(b, headMarker, byte(f)) }

// appendHeadFields is appendHead followed by the fields f's flags announce:
// length with headLength, status with headStatus.
func appendHeadFields(b []byte, f headFlags, length int64, status int) []byte {
	b = appendHead(b, f)
	if f&headLength != 0 {
		b = binary.BigEndian.AppendUint64(b, uint64(length))
	}
	if f&headStatus != 0 {
		b = binary.BigEndian.AppendUint16(b, uint16(status))
	}
	return b
}

// readHead reads a head marker and the fields its flags announce: the
// length (-1 without headLength) and the status (0 without headStatus). An
// error frame in the head's place is returned as the owner's error.
func readHead(br *bufio.Reader) (f headFlags, length int64, status int, err error) {
	b, err := br.Peek(2)
	if err != nil {
		return 0, 0, 0, err
	}
	if b[0] == frameMagic0 {
		rf, err := readFrame(br, respHeaderLen, decodeResponseFrame)
		if err != nil {
			return 0, 0, 0, err
		}
		if rf.typ != frameError {
			return 0, 0, 0, fmt.Errorf("%w: response frame type %d in place of a head", ErrBadFrame, rf.typ)
		}
		return 0, 0, 0, rf.ownerError(false)
	}
	if b[0] != headMarker || headFlags(b[1])&^headFlagsKnown != 0 {
		return 0, 0, 0, fmt.Errorf("%w: bad head marker %q", ErrBadFrame, b)
	}
	f = headFlags(b[1])
	size := 2
	if f&headLength != 0 {
		size += 8
	}
	if f&headStatus != 0 {
		size += 2
	}
	if b, err = br.Peek(size); err != nil {
		return 0, 0, 0, err
	}
	length, b = -1, b[2:]
	if f&headLength != 0 {
		n := binary.BigEndian.Uint64(b)
		if n > 1<<62 {
			return 0, 0, 0, fmt.Errorf("%w: head length %d", ErrBadFrame, n)
		}
		length, b = int64(n), b[8:]
	}
	if f&headStatus != 0 {
		// Only a status that allows no body needs carrying (see
		// headStatus).
		if status = int(binary.BigEndian.Uint16(b)); bodyAllowedForStatus(status) || status < 200 {
			return 0, 0, 0, fmt.Errorf("%w: head status %d", ErrBadFrame, status)
		}
	}
	br.Discard(size)
	return f, length, status, nil
}
