package proxy

import (
	"io"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// watchDelay is how long an exchange runs before the owner starts watching
// for its peer going away. Most exchanges end sooner and never pay for the
// watch (a goroutine and two deadline changes); a stalled or streaming one
// is cancelled within about twice this much of its peer leaving.
const watchDelay = 2 * time.Millisecond

// hangUpEvery is how many of the watcher's ticks pass between its looks at
// whether the peer of an exchange in its body phase has hung up.
const hangUpEvery = 10

// watchIdleExit is how long the watcher goroutine lingers with nothing to
// watch before it exits.
const watchIdleExit = 100 * time.Millisecond

// watch runs the background read of one exchange once watchDelay has passed,
// while the peer has nothing to send until the response is over: before the
// exchange wants the request body (the peer waits for the accept to send it;
// an upstream's 100 may be long in coming) and once it has read it whole.
// A read that returns then means the peer has gone: the exchange is
// cancelled and the upstream connection torn down rather than held. It also
// cancels the exchange at its deadline (plus grace): the owner's backstop
// for a caller that can no longer say it has given up. That also ends a
// write to the stream blocked on a peer that stopped reading (nc's write
// deadline), which cancelling the upstream side alone leaves blocked, with
// the exchange's worker and goroutine, for as long as the peer keeps the
// stream open.
type watch struct {
	cr       *bgReader
	nc       net.Conn // the peer stream, nil in tests of the watch alone
	cancel   func()
	start    time.Time
	deadline time.Time // zero: none

	mu                                 sync.Mutex
	quiet, fired, stopped, on, expired bool
}

// expire ends the exchange at its deadline, unless the watch has stopped:
// after stop, the stream's write deadline belongs to the next exchange.
func (w *watch) expire() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	w.expired = true
	w.cancel()
	if w.nc != nil {
		w.nc.SetWriteDeadline(aLongTimeAgo)
	}
}

// hasExpired reports whether expire ended the exchange: its stream's write
// deadline is then in the past, and the stream carries no other.
func (w *watch) hasExpired() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.expired
}

// inBody reports whether the exchange reads the peer's body, when the
// background read cannot run (it would take the body's bytes).
func (w *watch) inBody() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fired && !w.quiet && !w.stopped
}

// hungUp cancels the exchange if its peer has closed the stream while it
// sends the body. The writer that reads the body sees that only when it
// reads again, which a writer blocked on an upstream that reads none of it
// never does: the exchange would hold the upstream connection until its
// deadline, or for good without one, where a local request's cancel closes
// it at once.
func (w *watch) hungUp() {
	if w.nc != nil && w.inBody() && peerHungUp(w.nc) {
		w.cancel()
	}
}

func (w *watch) fire()      { w.set(&w.fired) }
func (w *watch) peerQuiet() { w.set(&w.quiet) }

// bodyWanted stops the read until the body's end (peerQuiet): the peer is
// about to send the body, and the read would take its first byte (which
// the stream keeps for the body; see bgReader).
func (w *watch) bodyWanted() { w.pause(&w.quiet, false, w.deadline) }

func (w *watch) set(flag *bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	*flag = true
	if w.quiet && w.fired && !w.stopped && !w.on {
		w.on = true
		w.cr.startBackgroundRead(w.cancel)
	}
}

// stop ends the watch; none starts after it.
func (w *watch) stop() { w.pause(&w.stopped, true, time.Time{}) }

// pause sets flag to v, which keeps the read from starting again, and ends
// a read under way, giving the stream the read deadline restore.
func (w *watch) pause(flag *bool, v bool, restore time.Time) {
	w.mu.Lock()
	*flag = v
	on := w.on
	w.on = false
	w.mu.Unlock()
	if on {
		w.cr.abortPendingRead(restore)
	}
}

// watcher is the owner's one clock for its exchanges' watches and
// deadlines. A timer per exchange would cost a wake-up of the runtime's
// poller on nearly every request; one ticker that runs only while the owner
// is busy costs one wake-up per watchDelay instead.
type watcher struct {
	mu      sync.Mutex
	live    map[*watch]struct{}
	running bool
	due     []*watch
}

func (l *watcher) add(w *watch) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.live == nil {
		l.live = make(map[*watch]struct{})
	}
	l.live[w] = struct{}{}
	if !l.running {
		l.running = true
		go l.loop()
	}
}

func (l *watcher) remove(w *watch) {
	l.mu.Lock()
	delete(l.live, w)
	l.mu.Unlock()
	w.stop()
}

// cancelAll ends every exchange under watch: the server is closing, and
// closing their streams does not end one whose writer is blocked upstream.
func (l *watcher) cancelAll() {
	l.mu.Lock()
	live := make([]*watch, 0, len(l.live))
	for w := range l.live {
		live = append(live, w)
	}
	l.mu.Unlock()
	for _, w := range live {
		w.cancel()
	}
}

func (l *watcher) loop() {
	t := time.NewTicker(watchDelay)
	defer t.Stop()
	var idle time.Time
	tick := 0
	for now := range t.C {
		tick++
		l.mu.Lock()
		if len(l.live) == 0 {
			if idle.IsZero() {
				idle = now
			} else if now.Sub(idle) >= watchIdleExit {
				l.running = false
				l.mu.Unlock()
				return
			}
		} else {
			idle = time.Time{}
		}
		due := l.due[:0]
		for w := range l.live {
			if now.Sub(w.start) >= watchDelay {
				due = append(due, w)
			}
		}
		l.due = due
		l.mu.Unlock()
		for _, w := range due {
			w.fire()
			switch {
			case !w.deadline.IsZero() && now.After(w.deadline):
				w.expire()
			case tick%hangUpEvery == 0:
				w.hungUp()
			}
		}
	}
}

// bodyDone tells when a relayed request body is first wanted and when it has
// been read to the end. Only the exchange's writer reads it.
type bodyDone struct {
	io.ReadCloser
	onFirstRead func() // run before the first Read, then cleared

	mu     sync.Mutex
	done   bool
	closed bool
	onEOF  func()
	over   chan struct{} // if set, closed once done or closed
}

func (b *bodyDone) Read(p []byte) (int, error) {
	if fn := b.onFirstRead; fn != nil {
		b.onFirstRead = nil
		fn()
	}
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.mu.Lock()
		first := !b.done
		b.done = true
		b.ended()
		fn := b.onEOF
		b.mu.Unlock()
		if first && fn != nil {
			fn()
		}
	}
	return n, err
}

// ended wakes a settle (b.mu held).
func (b *bodyDone) ended() {
	if b.over != nil {
		close(b.over)
		b.over = nil
	}
}

// settle waits up to d for the writer to be done with the body: at its end,
// or when it closes it (Request.Write always does).
func (b *bodyDone) settle(d time.Duration) {
	b.mu.Lock()
	if b.done || b.closed {
		b.mu.Unlock()
		return
	}
	if b.over == nil {
		b.over = make(chan struct{})
	}
	over := b.over
	b.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-over:
	case <-t.C:
	}
}

func (b *bodyDone) isDone() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.done
}

// Close does not close the peer stream: the request body is a window on it.
func (b *bodyDone) Close() error {
	b.mu.Lock()
	b.closed = true
	b.ended()
	b.mu.Unlock()
	return nil
}

// peerHungUp reports, without reading it, whether the peer has closed stream
// nc: one non-blocking poll. A peer that only half-closed it (a tunnel's
// end, after a 101) has not.
func peerHungUp(nc net.Conn) bool {
	rc := socketOf(nc)
	if rc == nil {
		return false
	}
	hup := false
	rc.Control(func(fd uintptr) {
		fds := [1]unix.PollFd{{Fd: int32(fd)}} // POLLHUP and POLLERR come unasked
		n, err := unix.Poll(fds[:], 0)
		hup = err == nil && n > 0 && fds[0].Revents&(unix.POLLHUP|unix.POLLERR) != 0
	})
	return hup
}
