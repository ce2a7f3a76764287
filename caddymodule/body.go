package caddymodule

import (
	"errors"
	"io"
	"net/http"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/orbitproxy/orbit/proxy"
)

// varKeptBody is the request variable that holds a request's keptBody
// across reverse_proxy's attempts.
const varKeptBody = "orbit_pool_kept_body"

// maxKeptBody is the most of a request body kept for another attempt: more
// than the proxy transport ever reads of a body before it takes a
// connection (see proxy.ReadsAhead), and so before it may fail retry-safe,
// a dial error.
const maxKeptBody = 8 << 10

// errBodySent fails, before it sends anything, an attempt at a request
// whose body an earlier attempt read and may have sent to an upstream (it
// got a response, a 503 that lb_retry_match retries, say, or failed not
// retry-safe). net/http's transport would send what is left, a broken body,
// and the earlier attempt's writer may still be reading it.
var errBodySent = errors.New("orbit_pool: request body already read by an attempt that may have reached an upstream")

// keptBody keeps what the transport read of one request's body, so that
// reverse_proxy, which retries a dial error on the next upstream with the
// same body (it wraps it so that the transport cannot close it unread),
// sends all of it again: as it would have after net/http's transport,
// which reads nothing of a body before it has dialed.
type keptBody struct {
	src  io.ReadCloser // reverse_proxy's body, the same on every attempt
	kept []byte
	eof  bool // kept is all of it
	over bool // more than maxKeptBody was read: not kept
	// spent is set once an attempt may have reached an upstream (it
	// returned a response, or failed not retry-safe): the body is not
	// sent again (see errBodySent).
	spent bool
}

// keptBodyFor returns the body the transport should send req with, which
// the transport reads ahead (see proxy.ReadsAhead): what an earlier attempt,
// failed retry-safe, read of req.Body, then the rest. On the first attempt
// it reads ahead as the transport would, so that the time a client takes to
// send its body is not counted against the request's wait timeout or
// deadline: that is not a wait for a connection.
func keptBodyFor(req *http.Request) (io.ReadCloser, error) {
	ctx := req.Context()
	k, _ := caddyhttp.GetVar(ctx, varKeptBody).(*keptBody)
	if k == nil || k.src != req.Body {
		ahead, whole, err := proxy.ReadAhead(req.Body, req.ContentLength)
		if err != nil {
			return nil, err
		}
		k = &keptBody{src: req.Body, kept: ahead, eof: whole}
		caddyhttp.SetVar(ctx, varKeptBody, k)
	}
	if k.spent {
		return nil, errBodySent
	}
	if k.over {
		return req.Body, nil
	}
	return &attemptBody{k: k}, nil
}

// ended records how the attempt that read b ended: only one that cannot
// have reached the upstream lets the next send the body again from what
// was kept.
func (b *attemptBody) ended(err error) {
	if err == nil || !proxy.IsRetrySafe(err) {
		b.k.spent = true
	}
}

// attemptBody is one attempt's reading of a keptBody.
type attemptBody struct {
	k   *keptBody
	off int
	// src is whether the attempt reads reverse_proxy's body itself:
	// srcUnread until it first does (srcRead), srcClosed once Close has
	// run. It orders the attempt's first read of that body, on the
	// transport's writer, with Close, on another goroutine.
	src atomic.Int32
}

const (
	srcUnread int32 = iota
	srcRead
	srcClosed
)

func (b *attemptBody) Read(p []byte) (int, error) {
	k := b.k
	if b.src.Load() == srcClosed {
		return 0, http.ErrBodyReadAfterClose
	}
	if b.off < len(k.kept) {
		n := copy(p, k.kept[b.off:])
		b.off += n
		return n, nil
	}
	if k.eof {
		return 0, io.EOF
	}
	if !b.src.CompareAndSwap(srcUnread, srcRead) && b.src.Load() == srcClosed {
		return 0, http.ErrBodyReadAfterClose
	}
	n, err := k.src.Read(p)
	if n > 0 && !k.over {
		if len(k.kept)+n > maxKeptBody {
			k.over, k.kept = true, nil
		} else {
			k.kept = append(k.kept, p[:n]...)
		}
	}
	b.off += n
	if err == io.EOF && !k.over {
		k.eof = true
	}
	return n, err
}

// Close leaves reverse_proxy's body alone for another attempt to send from
// what was kept, if it was read to its end, or if this attempt read none of
// it past what was kept (what was read ahead may be only the start of a
// short body: a retry of a dial error sends it whole). Otherwise it closes
// it, so that a read of it on the transport's writer returns.
func (b *attemptBody) Close() error {
	if b.k.eof || b.src.Swap(srcClosed) != srcRead {
		return nil
	}
	return b.k.src.Close()
}
