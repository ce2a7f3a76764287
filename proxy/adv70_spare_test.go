package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// adv70Counted reports whether the node's own count of its connections
// (n.open, what admission reads) matches what it holds: the table's slots
// and the spares.
func adv70Counted(m *member) (open int64, held int) {
	return m.node.open.Load(), m.node.Stats().OpenConns
}

// adv70Spares fills m's table (of 4 slots) with 4 held streams to a, whose
// connections close (and leave the table) once release is closed, and
// leaves k (at most 4) spares for b outside the table: k concurrent streams
// to b, released by relB.
func adv70Spares(t *testing.T, m *member, a, b string, k int, relB chan struct{}) []*http.Response {
	t.Helper()
	held := holdStreams(t, m, a, 4)
	outside := holdStreams(t, m, b, k)
	close(relB)
	for _, r := range outside {
		drain(r)
	}
	waitFor(t, 3*time.Second, "the spares", func() bool { return m.node.spares.len() == k })
	return held
}

// TestAdv70SpareAdoptionCounts: spares adopted into the table, and then
// CloseIdleConnections and Close, keep n.open exact: it equals the
// connections held at every quiet point, and is 0 at the end.
func TestAdv70SpareAdoptionCounts(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 4}
	relA, relB := make(chan struct{}), make(chan struct{})
	a := closingStreamUpstream(t, relA, true)
	b := unpooledUpstream(t, relB, make(chan bool, 16))
	m := newMember(t, spec, nil)
	held := adv70Spares(t, m, a, b, 4, relB)
	if o, h := adv70Counted(m); o != 8 || h != 8 {
		close(relA)
		t.Fatalf("n.open %d, %d held; want 8 (4 in the table, 4 spares)", o, h)
	}
	close(relA)
	for _, r := range held {
		drain(r)
	}
	waitFor(t, 3*time.Second, "the held connections to leave", func() bool { return m.node.Stats().Retired == 4 })
	var wg sync.WaitGroup
	bodies := make([]string, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, bodies[i], errs[i] = adv10Do(t, m.tr, "GET", b+"/conn", nil)
		}()
	}
	wg.Wait()
	for i := range 2 {
		if errs[i] != nil || bodies[i] == "" {
			t.Fatalf("request %d with room in the table: %q, %v", i, bodies[i], errs[i])
		}
	}
	s := m.node.Stats()
	if o, h := adv70Counted(m); o != 4 || h != 4 || s.Created != 4 || m.node.spares.len() != 2+int(s.ReusedLocal) {
		t.Fatalf("after adoption: n.open %d, %d held, stats %+v, %d spares; want 4 (no dial)", o, h, s, m.node.spares.len())
	}
	m.tr.CloseIdleConnections()
	waitFor(t, 3*time.Second, "the idle connections to close", func() bool { o, h := adv70Counted(m); return o == 0 && h == 0 })
	m.node.Close()
	if o, h := adv70Counted(m); o != 0 || h != 0 {
		t.Fatalf("after Close: n.open %d, %d held", o, h)
	}
}

// TestAdv70SpareAdoptionChurn: adoption racing CloseIdleConnections, the
// sweep, more requests that find the table full, and Close: n.open and the
// held connections agree once all is quiet, and both are 0 after Close; no
// waiter is left queued.
func TestAdv70SpareAdoptionChurn(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 4}
	relA, relB := make(chan struct{}), make(chan struct{})
	a := closingStreamUpstream(t, relA, true)
	b := unpooledUpstream(t, relB, make(chan bool, 256))
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: 5 * time.Millisecond}, func(tr *Transport) {
		tr.IdleConnTimeout = 20 * time.Millisecond
	})
	held := adv70Spares(t, m, a, b, 4, relB)
	close(relA)
	for _, r := range held {
		drain(r)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var failed atomic.Int32
	var firstErr atomic.Pointer[string]
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, body, err := adv10Do(t, m.tr, "GET", b+"/conn", nil); err != nil || body == "" {
					failed.Add(1)
					s := fmt.Sprintf("%q, %v", body, err)
					firstErr.CompareAndSwap(nil, &s)
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(3 * time.Millisecond):
				m.tr.CloseIdleConnections()
			}
		}
	}()
	time.Sleep(600 * time.Millisecond)
	close(stop)
	wg.Wait()
	if f := failed.Load(); f > 0 {
		t.Fatalf("%d requests failed (first: %s)", f, *firstErr.Load())
	}
	m.tr.CloseIdleConnections()
	waitFor(t, 3*time.Second, "every connection to close", func() bool { o, h := adv70Counted(m); return o == 0 && h == 0 })
	if n := m.node.room.n.Load(); n != 0 {
		t.Fatalf("%d room waiters left", n)
	}
	m.node.Close()
	if o, h := adv70Counted(m); o != 0 || h != 0 {
		t.Fatalf("after Close: n.open %d, %d held", o, h)
	}
}

// TestAdv70SpareAdoptionDuringClose: requests that adopt spares while the
// node closes fail or are served, and leave n.open at 0 with nothing held.
func TestAdv70SpareAdoptionDuringClose(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 4}
	for round := range 5 {
		relA, relB := make(chan struct{}), make(chan struct{})
		a := closingStreamUpstream(t, relA, true)
		b := unpooledUpstream(t, relB, make(chan bool, 64))
		m := newMember(t, spec, nil)
		held := holdStreams(t, m, a, 4)
		outside := holdStreams(t, m, b, 4)
		close(relB)
		for _, r := range outside {
			drain(r)
		}
		waitFor(t, 3*time.Second, "the spares", func() bool { return m.node.spares.len() == 4 })
		close(relA)
		for _, r := range held {
			drain(r)
		}
		waitFor(t, 3*time.Second, "the held to leave", func() bool { return m.node.Stats().Retired == 4 })
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				adv10Do(t, m.tr, "GET", b+"/conn", nil)
			}()
		}
		time.Sleep(time.Duration(round) * 200 * time.Microsecond)
		m.node.Close()
		wg.Wait()
		if o, h := adv70Counted(m); o != 0 || h != 0 {
			t.Fatalf("round %d: after Close and every request: n.open %d, %d held; want 0", round, o, h)
		}
	}
}

// TestAdv70SpareAdoptedKeepsDialerLimits: a spare dialed by a transport
// with MaxRequestsPerConn 2 and adopted into the table by another
// transport of the node (same key, no such limit) keeps the dialer's
// limit: after its second request it is not reused.
func TestAdv70SpareAdoptedKeepsDialerLimits(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}
	relA := make(chan struct{})
	a := closingStreamUpstream(t, relA, true)
	b := unpooledUpstream(t, nil, make(chan bool, 16))
	m := newMember(t, spec, func(tr *Transport) { tr.MaxRequestsPerConn = 2 })
	other := &Transport{Node: m.node}
	held := holdStreams(t, m, a, 2)
	_, kept, err := adv10Do(t, m.tr, "GET", b+"/conn", nil)
	if err != nil || kept == "" || m.node.spares.len() != 1 {
		close(relA)
		t.Fatalf("a request with the table full: %q, %v, %d spares", kept, err, m.node.spares.len())
	}
	close(relA)
	for _, r := range held {
		drain(r)
	}
	waitFor(t, 3*time.Second, "the held connections to leave", func() bool { return m.node.Stats().Retired == 2 })
	if _, body, err := adv10Do(t, other, "GET", b+"/conn", nil); err != nil || body != kept {
		t.Fatalf("the other transport's request: %q, %v; want it on the spare %q", body, err, kept)
	}
	if _, body, err := adv10Do(t, other, "GET", b+"/conn", nil); err != nil || body == kept {
		t.Fatalf("the third request: %q, %v; want a new connection (the spare's dialer allows 2 requests)", body, err)
	}
}

// TestAdv70SpareAdoptedIdleTimeout: a spare dialed by a transport with a
// short IdleConnTimeout, adopted by one with the default (90s), is closed by
// the sweep after the dialer's timeout.
func TestAdv70SpareAdoptedIdleTimeout(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}
	relA := make(chan struct{})
	a := closingStreamUpstream(t, relA, true)
	b := unpooledUpstream(t, nil, make(chan bool, 16))
	m := newMember(t, spec, func(tr *Transport) { tr.IdleConnTimeout = 300 * time.Millisecond })
	other := &Transport{Node: m.node}
	held := holdStreams(t, m, a, 2)
	_, kept, err := adv10Do(t, m.tr, "GET", b+"/conn", nil)
	close(relA)
	for _, r := range held {
		drain(r)
	}
	if err != nil || kept == "" {
		t.Fatalf("a request with the table full: %q, %v", kept, err)
	}
	waitFor(t, 3*time.Second, "the held connections to leave", func() bool { return m.node.Stats().Retired == 2 })
	if _, body, err := adv10Do(t, other, "GET", b+"/conn", nil); err != nil || body != kept {
		t.Fatalf("the other transport's request: %q, %v; want it on the spare %q", body, err, kept)
	}
	waitFor(t, 3*time.Second, "the adopted spare to be closed idle", func() bool { return m.node.Stats().OpenConns == 0 })
}

// adv70StrayUpstream answers /conn with the client's address and, when
// asked /stray, a moment after its response, writes a stray response on the
// idle connection. It counts the requests it reads per path.
func adv70StrayUpstream(t *testing.T, relHold chan struct{}, seen *sync.Map) string {
	return rawUpstream(t, func(c net.Conn, _ *bufio.Reader, req *http.Request) bool {
		v, _ := seen.LoadOrStore(req.URL.Path, new(atomic.Int32))
		v.(*atomic.Int32).Add(1)
		switch req.URL.Path {
		case "/stream":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
			<-relHold
			io.WriteString(c, "0\r\n\r\n")
			return true
		case "/stray":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			time.Sleep(30 * time.Millisecond)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray")
			return true
		case "/close":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			time.Sleep(30 * time.Millisecond)
			c.Close()
			return false
		}
		a := c.RemoteAddr().String()
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(a), a)
		return true
	})
}

// TestAdv70SpareUnfitNotAdopted: a spare whose upstream wrote stray bytes
// on it, or closed it, while it was idle is not adopted when the table has
// room: the request goes on a new connection, is sent once, and gets its
// own answer; the unfit spare is closed and counted out.
func TestAdv70SpareUnfitNotAdopted(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}
	for _, path := range []string{"/stray", "/close"} {
		t.Run(path, func(t *testing.T) {
			relA := make(chan struct{})
			a := closingStreamUpstream(t, relA, true)
			var seen sync.Map
			b := adv70StrayUpstream(t, nil, &seen)
			m := newMember(t, spec, nil)
			held := holdStreams(t, m, a, 2)
			_, body, err := adv10Do(t, m.tr, "GET", b+path, nil)
			if err != nil || body != "ok" || m.node.spares.len() != 1 {
				close(relA)
				t.Fatalf("a request with the table full: %q, %v, %d spares", body, err, m.node.spares.len())
			}
			time.Sleep(100 * time.Millisecond) // the stray bytes, or the close, are out
			close(relA)
			for _, r := range held {
				drain(r)
			}
			waitFor(t, 3*time.Second, "the held connections to leave", func() bool { return m.node.Stats().Retired == 2 })
			_, body, err = adv10Do(t, m.tr, "GET", b+"/conn", nil)
			if err != nil || len(body) < 5 || body == "stray" {
				t.Fatalf("a request with room in the table: %q, %v; want its own answer on a new connection", body, err)
			}
			v, _ := seen.Load("/conn")
			if n := v.(*atomic.Int32).Load(); n != 1 {
				t.Fatalf("the upstream read the request %d times; want once", n)
			}
			if o, h := adv70Counted(m); o != 1 || h != 1 || m.node.Stats().Retries != 0 {
				t.Fatalf("n.open %d, %d held, stats %+v; want the new connection alone, nothing retried", o, h, m.node.Stats())
			}
		})
	}
}
