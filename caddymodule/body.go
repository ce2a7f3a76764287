package caddymodule

import (
	"io"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// varKeptBody is the request variable that holds a request's keptBody
// across reverse_proxy's attempts.
const varKeptBody = "orbit_pool_kept_body"

// maxKeptBody is the most of a request body kept for another attempt: the
// proxy transport reads a body up to this long before it takes a
// connection (see proxy.Transport), and so may fail retry-safe, a dial
// error, after reading it.
const maxKeptBody = 4 << 10

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
}

// keptBodyFor returns the body the transport should send req with, which
// reads what an earlier attempt took of req.Body, then the rest.
func keptBodyFor(req *http.Request) io.ReadCloser {
	if req.ContentLength <= 0 || req.ContentLength > maxKeptBody {
		return req.Body
	}
	ctx := req.Context()
	k, _ := caddyhttp.GetVar(ctx, varKeptBody).(*keptBody)
	if k == nil || k.src != req.Body {
		k = &keptBody{src: req.Body}
		caddyhttp.SetVar(ctx, varKeptBody, k)
	}
	if k.over {
		return req.Body
	}
	return &attemptBody{k: k}
}

// attemptBody is one attempt's reading of a keptBody.
type attemptBody struct {
	k   *keptBody
	off int
}

func (b *attemptBody) Read(p []byte) (int, error) {
	k := b.k
	if b.off < len(k.kept) {
		n := copy(p, k.kept[b.off:])
		b.off += n
		return n, nil
	}
	if k.eof {
		return 0, io.EOF
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

// Close leaves a body read to its end alone, for another attempt to send
// from what was kept.
func (b *attemptBody) Close() error {
	if b.k.eof {
		return nil
	}
	return b.k.src.Close()
}
