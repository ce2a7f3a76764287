package proxy

import (
	"net"
	"sync"
	"time"
)

// bgReader is the owner's reader of a peer stream. While a response is being
// produced the peer has nothing to send, so the owner keeps one read pending
// in the background: if it returns, the peer has gone and the exchange is
// cancelled at once instead of holding an upstream connection until its
// deadline. This is the pattern net/http's server uses to notice a client
// that went away. A byte the read does get (a peer that starts its next
// frame the instant a response ends) is kept for the next Read.
type bgReader struct {
	nc net.Conn

	mu      sync.Mutex
	cond    sync.Cond
	inRead  bool
	aborted bool
	hasByte bool
	b       [1]byte
	gone    bool
	halted  bool // see halt
}

var aLongTimeAgo = time.Unix(1, 0)

func (r *bgReader) Read(p []byte) (int, error) {
	r.mu.Lock()
	if r.inRead {
		r.mu.Unlock()
		panic("proxy: concurrent read on a peer stream")
	}
	if r.hasByte && len(p) > 0 {
		p[0] = r.b[0]
		r.hasByte = false
		r.mu.Unlock()
		return 1, nil
	}
	r.mu.Unlock()
	return r.nc.Read(p)
}

// startBackgroundRead starts the watch; onGone runs if the peer goes.
func (r *bgReader) startBackgroundRead(onGone func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.inRead || r.hasByte {
		return
	}
	r.inRead = true
	go func() {
		n, err := r.nc.Read(r.b[:])
		r.mu.Lock()
		if n == 1 {
			r.hasByte = true
		}
		// A read ended by halt is no sign of the peer.
		gone := err != nil && !r.aborted && !r.halted
		if gone {
			r.gone = true
		}
		r.inRead = false
		r.cond.Broadcast()
		r.mu.Unlock()
		if gone {
			onGone()
		}
	}()
}

// abortPendingRead ends the watch, waits for its goroutine, and gives the
// stream back the read deadline restore, unless halt came first.
func (r *bgReader) abortPendingRead(restore time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.inRead {
		return
	}
	r.aborted = true
	r.nc.SetReadDeadline(aLongTimeAgo)
	for r.inRead {
		r.cond.Wait()
	}
	r.aborted = false
	if !r.halted {
		r.nc.SetReadDeadline(restore)
	}
}

// halt ends every read of the stream for the rest of the exchange, a
// pending one included: an exchange that failed may leave its writer
// waiting for more of the body. An abortPendingRead racing with it does not
// undo it. The stream carries another exchange only if none of the body was
// asked for (see serveOne), and that exchange begins with resume.
func (r *bgReader) halt() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.halted = true
	r.nc.SetReadDeadline(aLongTimeAgo)
}

// resume undoes halt for the stream's next exchange, which sets the
// stream's read deadline before it reads.
func (r *bgReader) resume() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.halted = false
}

func (r *bgReader) peerGone() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gone
}
