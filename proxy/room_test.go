package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestRoomWaitersOrder: the oldest waiter is woken first, one per event,
// and for an event for one key, that key's oldest; a waiter that leaves
// after it was woken passes the wake on to the next that could use it: not
// to a waiter that has asked since the event, nor, for an idle connection,
// to one that may not evict, nor, for a stream, to another key's; and a
// waiter that an event has passed since it asked is not queued.
func TestRoomWaitersOrder(t *testing.T) {
	var r roomWaiters
	woken := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	k1, k2 := orbitpool.Key{Lo: 1}, orbitpool.Key{Lo: 2}
	wa, wb, wc := roomWait{key: k1}, roomWait{key: k2}, roomWait{key: k2}
	r.asking(&wa)
	r.asking(&wb)
	r.asking(&wc)
	a, b, c := r.add(&wa), r.add(&wb), r.add(&wc)
	r.signal(roomWake{event: roomIdle})
	if !woken(a) || woken(b) || woken(c) {
		t.Fatalf("after one event: woken a=%v b=%v c=%v; want a alone", woken(a), woken(b), woken(c))
	}
	r.remove(&wa) // woken, then left: b has it
	if !woken(b) || woken(c) {
		t.Fatalf("after the woken waiter left: b=%v c=%v; want b alone woken", woken(b), woken(c))
	}
	r.asking(&wb) // b asks again, finds no room, and waits again
	b = r.add(&wb)
	r.passOn(roomWake{event: roomIdle}) // c has not asked since the event: it may use the room
	if !woken(c) || woken(b) {
		t.Fatalf("after b passed the wake on: c=%v b=%v; want c alone woken", woken(c), woken(b))
	}
	r.asking(&wc)
	c = r.add(&wc)
	r.passOn(roomWake{event: roomIdle}) // both asked since the event: nobody to wake
	if woken(b) || woken(c) {
		t.Fatalf("a wake passed on to waiters that asked since the event: b=%v c=%v", woken(b), woken(c))
	}
	r.asking(&wa)
	a = r.add(&wa) // the oldest now: b, c, a
	r.signalKey(k1, 1, false)
	if !woken(a) || woken(b) || woken(c) {
		t.Fatalf("after an event for a's key: woken a=%v b=%v c=%v; want a alone", woken(a), woken(b), woken(c))
	}
	r.signalKey(orbitpool.Key{Lo: 3}, 1, false)
	if woken(b) || woken(c) {
		t.Fatalf("an event for a key nobody waits for woke b=%v c=%v", woken(b), woken(c))
	}
	r.remove(&wa)
	r.remove(&wb)
	r.remove(&wc)
	if n := r.n.Load(); n != 0 || r.all.Len() != 0 || len(r.byKey) != 0 {
		t.Fatalf("%d waiters counted, %d queued, %d keys; want none", n, r.all.Len(), len(r.byKey))
	}
	// A wake passed on skips a waiter that may not evict; an event wakes
	// it all the same.
	wx, ws, wf := roomWait{key: k1}, roomWait{key: k1, stuck: true}, roomWait{key: k1}
	r.asking(&wx)
	r.asking(&ws)
	r.asking(&wf)
	x, s, f := r.add(&wx), r.add(&ws), r.add(&wf)
	r.signal(roomWake{event: roomIdle})
	if !woken(x) {
		t.Fatal("the oldest waiter was not woken")
	}
	r.remove(&wx) // it left without the room
	if woken(s) || !woken(f) {
		t.Fatalf("a wake passed on: stuck woken=%v, free woken=%v; want the free one alone", woken(s), woken(f))
	}
	r.signal(roomWake{event: roomIdle})
	if !woken(s) || ws.w.by.event != roomIdle {
		t.Fatalf("an event for any key: stuck woken=%v (for %v); want it woken", woken(s), ws.w.by.event)
	}
	r.remove(&ws)
	r.remove(&wf)
	// A free slot passed on goes to the oldest waiter, one that may not
	// evict too; a stream's room, to its key's next waiter alone, as a
	// stream's.
	wx, ws, wf = roomWait{key: k1}, roomWait{key: k2, stuck: true}, roomWait{key: k1, stuck: true}
	r.asking(&wx)
	r.asking(&ws)
	r.asking(&wf)
	x, s, f = r.add(&wx), r.add(&ws), r.add(&wf)
	r.signal(roomWake{event: roomFree})
	r.remove(&wx)
	if !woken(s) || ws.w.by.event != roomFree || woken(f) {
		t.Fatalf("a free slot passed on: stuck woken=%v (for %v), next woken=%v; want the stuck one, for a free slot", woken(s), ws.w.by.event, woken(f))
	}
	ws.w = nil // it used the wake
	r.asking(&wx)
	r.asking(&ws)
	x, s = r.add(&wx), r.add(&ws) // f, x, s
	r.signalKey(k1, 1, false)
	r.remove(&wf)
	if !woken(x) || wx.w.by.event != roomStream || woken(s) {
		t.Fatalf("a stream's room passed on: its key's next woken=%v (for %v), another key's woken=%v; want the key's, for a stream", woken(x), wx.w.by.event, woken(s))
	}
	r.remove(&wx)
	r.passOn(roomWake{roomStream, k2})
	if !woken(s) || ws.w.by.event != roomStream {
		t.Fatalf("a stream's room passed on to the key's only waiter: woken=%v (for %v)", woken(s), ws.w.by.event)
	}
	r.remove(&ws)
	r.passOn(roomWake{roomStream, k1})
	if n := r.n.Load(); n != 0 || r.all.Len() != 0 || len(r.byKey) != 0 {
		t.Fatalf("%d waiters counted, %d queued, %d keys; want none", n, r.all.Len(), len(r.byKey))
	}
	var wd roomWait
	r.asking(&wd)
	r.signal(roomWake{event: roomIdle}) // between its ask and its add
	if d := r.add(&wd); d != nil {
		t.Fatal("a waiter that an event passed since it asked was queued; want it to ask again")
	}
	if n := r.n.Load(); n != 0 || r.all.Len() != 0 || len(r.byKey) != 0 {
		t.Fatalf("%d waiters counted, %d queued, %d keys; want none", n, r.all.Len(), len(r.byKey))
	}
}

// TestFullPauseWokenByRoom: a request paused because the table was full of
// its process's connections asks the pool again as soon as one of them
// goes idle (and may be evicted) or leaves the table, not at the end of its
// pause: here every pause is longer than the request's deadline, so only
// that wake serves it.
func TestFullPauseWokenByRoom(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}
	for _, tc := range []struct {
		name  string
		close bool // the held exchanges' connections leave the table
	}{{"goes idle", false}, {"leaves the table", true}} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			other := closingStreamUpstream(t, release, tc.close)
			url := closingStreamUpstream(t, nil, false)
			m := newMember(t, spec, func(tr *Transport) {
				tr.MaxConnsPerKey = 8 // waits in the table, never outside it
				tr.fullPauseBase = time.Minute
			})
			held := holdStreams(t, m, other, 2)
			done := make(chan error, 1)
			go func() {
				_, body, err := roundTripWithin(m.tr, url+"/", 10*time.Second)
				if err == nil && body != "ok" {
					err = io.ErrUnexpectedEOF
				}
				done <- err
			}()
			waitFor(t, 5*time.Second, "the request to pause for room", func() bool { return m.node.room.n.Load() == 1 })
			start := time.Now()
			close(release)
			for _, r := range held {
				drain(r)
			}
			if err := <-done; err != nil {
				t.Fatalf("the paused request: %v; want it served once room came", err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("served %v after room came; want at once", d)
			}
			want := 1 // the held connections went idle: one evicted
			if tc.close {
				want = 0
			}
			if s := m.node.Stats(); int(s.Evicted) != want || s.Unpooled != 0 || s.Created != 3 {
				t.Fatalf("stats %+v: want the request on a connection of its own in the table, %d evicted", s, want)
			}
		})
	}
}

// TestFullPauseWokenBySiblingsRoom: a process whose table is full of busy
// connections waits for its sibling's connection of its upstream, and is
// woken when that connection goes idle in the sibling (orbitpool.RoomWatch),
// not when its pause ends. Each pause is a minute here: without the wake the
// request would be served only once its pause was cut short at its deadline.
func TestFullPauseWokenBySiblingsRoom(t *testing.T) {
	a, b := fullTablePair(t, 4)
	step := make(chan struct{}) // ends one stream of url's
	defer close(step)
	url := rawUpstream(t, func(c net.Conn, _ *bufio.Reader, req *http.Request) bool {
		if req.URL.Path != "/stream" {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			return true
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
		<-step
		io.WriteString(c, "0\r\n\r\n")
		return true
	})
	for round := range 3 {
		// a's connection of url, busy.
		held := holdStreams(t, a, url, 1)[0]
		done := make(chan error, 1)
		go func() {
			_, body, err := roundTripWithin(b.tr, url+"/", 10*time.Second)
			if err == nil && body != "ok" {
				err = fmt.Errorf("body %q", body)
			}
			done <- err
		}()
		waitFor(t, 5*time.Second, "b's request to pause for room", func() bool { return b.node.room.n.Load() == 1 })
		start := time.Now()
		step <- struct{}{}
		drain(held)
		if err := <-done; err != nil {
			t.Fatalf("round %d: b's paused request: %v; want it served through a's connection", round, err)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("round %d: b's request served %v after a's connection went idle; want at once", round, d)
		}
	}
	if s := b.node.Stats(); s.Created != 1 || s.ReusedRemote < 3 {
		t.Fatalf("b's stats %+v: want every request through a's connection", s)
	}
}

// fullTablePair opens two members of a fleet with the given number of key
// entries, one connection slot each, whose requests wait in the table for
// room (never outside it) and pause a minute at a time: only a wake serves
// them in time. b's one slot is held busy until the test ends.
func fullTablePair(t *testing.T, keys int) (a, b *member) {
	spec := orbitpool.PoolSpec{Lanes: 2, Keys: keys, ResourcesPerLane: 1, Path: filepath.Join(t.TempDir(), "seg")}
	conf := func(tr *Transport) {
		tr.MaxConnsPerKey = 8
		tr.fullPauseBase = time.Minute
	}
	a, b = newMember(t, spec, conf), newMember(t, spec, conf)
	release := make(chan struct{})
	u := closingStreamUpstream(t, release, false)
	t.Cleanup(func() { close(release) }) // before the upstream's cleanup
	holdStreams(t, b, u, 1)
	return a, b
}

// closingStreamUpstream answers /stream with a chunked body that ends once
// release is closed, on a connection it then closes if closeAfter (saying
// so in the head), and anything else with "ok".
func closingStreamUpstream(t *testing.T, release chan struct{}, closeAfter bool) string {
	return rawUpstream(t, func(c net.Conn, _ *bufio.Reader, req *http.Request) bool {
		if req.URL.Path != "/stream" {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			return true
		}
		head := "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
		if closeAfter {
			head += "Connection: close\r\n"
		}
		io.WriteString(c, head+"\r\n5\r\nfirst\r\n")
		<-release
		io.WriteString(c, "0\r\n\r\n")
		return !closeAfter
	})
}

// roundTripWithin sends a GET to url through tr with a deadline of d, and
// returns the response's status, body and error.
func roundTripWithin(tr *Transport, url string, d time.Duration) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// TestSpareOnceTheStreamsEnd: a process kept a connection outside its full
// table for an upstream (see spares). If the table is then full of idle
// connections, the upstream's next request takes the kept connection
// before it makes room by closing another upstream's idle one. If the table
// has room again, a request that would dial takes the kept connection into
// the table instead: no dial, and siblings share it from then on.
func TestSpareOnceTheStreamsEnd(t *testing.T) {
	for _, tc := range []struct {
		name  string
		leave bool // the held exchanges' connections leave the table
	}{{"the table is full of idle connections", false}, {"the table has room", true}} {
		t.Run(tc.name, func(t *testing.T) {
			spec := orbitpool.PoolSpec{Lanes: 2, Keys: 4, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
			release := make(chan struct{})
			a := closingStreamUpstream(t, release, tc.leave)
			b := unpooledUpstream(t, nil, make(chan bool, 8))
			m := newMember(t, spec, nil)
			sib := newMember(t, spec, nil)
			held := holdStreams(t, m, a, 2)
			_, kept, err := adv10Do(t, m.tr, "GET", b+"/conn", nil)
			if err != nil || kept == "" {
				t.Fatalf("a request with the table full: %q, %v", kept, err)
			}
			close(release)
			for _, r := range held {
				drain(r)
			}
			if tc.leave {
				waitFor(t, 5*time.Second, "the held connections to leave", func() bool { return m.node.Stats().OpenConns == 1 })
			}
			if _, body, err := adv10Do(t, m.tr, "GET", b+"/conn", nil); err != nil || body != kept {
				t.Fatalf("the next request: %q, %v; want it on the kept connection, %q", body, err, kept)
			}
			s := m.node.Stats()
			if !tc.leave {
				if s.Evicted != 0 || s.Unpooled != 2 || s.OpenConns != 3 {
					t.Fatalf("stats %+v: want both requests on the kept connection, and nothing evicted", s)
				}
				return
			}
			if s.Unpooled != 1 || s.Created != 2 || s.OpenConns != 1 || m.node.spares.len() != 0 {
				t.Fatalf("stats %+v, %d kept outside the table: want the kept connection in the table, not a new one", s, m.node.spares.len())
			}
			if _, body, err := adv10Do(t, sib.tr, "GET", b+"/conn", nil); err != nil || body != kept {
				t.Fatalf("the sibling's request: %q, %v; want it on the same connection, %q", body, err, kept)
			}
			if s := sib.node.Stats(); s.ReusedRemote != 1 || s.Created != 0 {
				t.Fatalf("sibling's stats %+v: want its request on the other process's connection", s)
			}
		})
	}
}

// BenchmarkRoomWaitersChurn times paused requests ending their pause
// (remove) and pausing again (add), in random order, as requests whose
// pauses run out do while a table stays full: the cost per operation must
// not grow with the number of paused requests.
func BenchmarkRoomWaitersChurn(b *testing.B) {
	for _, n := range []int{1000, 16000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			var r roomWaiters
			ws := make([]roomWait, n)
			for i := range ws {
				r.asking(&ws[i])
				r.add(&ws[i])
			}
			order := rand.Perm(n)
			b.ResetTimer()
			for i := range b.N {
				w := &ws[order[i%n]]
				r.remove(w)
				r.add(w)
			}
		})
	}
}
