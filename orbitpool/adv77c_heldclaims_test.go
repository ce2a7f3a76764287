package orbitpool

import (
	"bytes"
	"errors"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// adv77cGID is the calling goroutine's id, read from its stack header.
func adv77cGID() int64 {
	var buf [64]byte
	n := runtime.Stack(buf[:], false)
	b := bytes.TrimPrefix(buf[:n], []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		b = b[:i]
	}
	id, _ := strconv.ParseInt(string(b), 10, 64)
	return id
}

// adv77cHolder holds the claims of registered goroutines (Accepts under
// test) in testHookClaimed until their gate is opened; every other claim
// (Reconcile's, an unregistered goroutine's) passes.
type adv77cHolder struct {
	mu    sync.Mutex
	who   map[int64]int // goroutine -> index
	gates map[int]chan struct{}
	held  map[int]bool
	n     atomic.Int64 // claims held now or before
}

func newAdv77cHolder(t *testing.T) *adv77cHolder {
	h := &adv77cHolder{who: map[int64]int{}, gates: map[int]chan struct{}{}, held: map[int]bool{}}
	f := func() {
		gid := adv77cGID()
		h.mu.Lock()
		i, ok := h.who[gid]
		var g chan struct{}
		if ok {
			g = h.gates[i]
			h.held[i] = true
		}
		h.mu.Unlock()
		if !ok {
			return
		}
		h.n.Add(1)
		select {
		case <-g:
		case <-time.After(20 * time.Second):
		}
	}
	testHookClaimed.Store(&f)
	t.Cleanup(func() {
		testHookClaimed.Store(nil)
		h.openAll()
	})
	return h
}

// enter makes the calling goroutine's claims held under index i.
func (h *adv77cHolder) enter(i int) {
	gid := adv77cGID()
	h.mu.Lock()
	h.who[gid] = i
	if h.gates[i] == nil {
		h.gates[i] = make(chan struct{})
	}
	h.mu.Unlock()
}

func (h *adv77cHolder) leave() {
	gid := adv77cGID()
	h.mu.Lock()
	delete(h.who, gid)
	h.mu.Unlock()
}

func (h *adv77cHolder) open(i int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if g := h.gates[i]; g != nil {
		select {
		case <-g:
		default:
			close(g)
		}
	}
}

func (h *adv77cHolder) openAll() {
	h.mu.Lock()
	var is []int
	for i := range h.gates {
		is = append(is, i)
	}
	h.mu.Unlock()
	for _, i := range is {
		h.open(i)
	}
}

func (h *adv77cHolder) wasHeld(i int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held[i]
}

// waitHeld waits until n claims in all were held.
func (h *adv77cHolder) waitHeld(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for h.n.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d claims held within 10s", h.n.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// adv77cReconciler runs p.Reconcile every millisecond until stopped.
type adv77cReconciler struct {
	stop chan struct{}
	done chan struct{}
	errs atomic.Int64
}

func adv77cReconcile(p *Pool) *adv77cReconciler {
	r := &adv77cReconciler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for {
			select {
			case <-r.stop:
				return
			default:
			}
			if err := p.Reconcile(); err != nil && !errors.Is(err, ErrClosed) {
				r.errs.Add(1)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	return r
}

func (r *adv77cReconciler) end() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	<-r.done
}

// adv77cMonitor checks, every 200µs until stopped, that no slot of ids is
// over its capacity (uses plus reservations), and counts the violations.
type adv77cMonitor struct {
	stop chan struct{}
	done chan struct{}
	over atomic.Int64
	what atomic.Value
}

func adv77cWatch(p *Pool, ids []ResourceID) *adv77cMonitor {
	m := &adv77cMonitor{stop: make(chan struct{}), done: make(chan struct{})}
	s := p.seg
	go func() {
		defer close(m.done)
		for {
			for _, id := range ids {
				off := s.slotOff(id.Lane(), id.Slot())
				w := atomic.LoadUint64(s.u64(off + slWord))
				if wState(w) == StateLive && wGen(w) == id.Generation() && wUse(w)+wPendN(w) > s.capacity(off) {
					m.over.Add(1)
					m.what.Store(id.String() + ": use " + strconv.Itoa(wUse(w)) + " + pending " + strconv.Itoa(wPendN(w)) + " > capacity " + strconv.Itoa(s.capacity(off)))
				}
			}
			select {
			case <-m.stop:
				return
			case <-time.After(200 * time.Microsecond):
			}
		}
	}()
	return m
}

func (m *adv77cMonitor) end(t *testing.T) {
	t.Helper()
	select {
	case <-m.stop:
	default:
		close(m.stop)
	}
	<-m.done
	if n := m.over.Load(); n != 0 {
		t.Errorf("a slot was seen over its capacity %d time(s), last %v", n, m.what.Load())
	}
}

// adv77cClaimsForgotten fails t unless p's record of claims under way is
// empty.
func adv77cClaimsForgotten(t *testing.T, p *Pool) {
	t.Helper()
	for i := range p.claiming.words {
		if w := p.claiming.words[i].Load(); w != 0 {
			t.Errorf("claim record word %d still holds %#x after every claim ended", i, w)
		}
	}
	p.claiming.mu.Lock()
	n := len(p.claiming.more)
	p.claiming.mu.Unlock()
	if n != 0 {
		t.Errorf("%d claims left in the claim record's map after every claim ended", n)
	}
}

// adv77cWhole fails t unless each of ids is idle, without tickets, and
// serves its whole capacity (capacity leases from r, all accepted) and not
// one more.
func adv77cWhole(t *testing.T, owner, r *Pool, ids []ResourceID, capacity int) {
	t.Helper()
	for _, id := range ids {
		if n, err := owner.Users(id); n != 0 || err != nil {
			t.Errorf("%v: %d users and reservations (%v), want 0", id, n, err)
		}
		noTickets(t, owner, id)
		var es []*Execution
		for i := range capacity {
			l, err := r.Reserve(id)
			if err != nil {
				t.Errorf("%v: reservation %d of %d: %v", id, i+1, capacity, err)
				break
			}
			e, err := owner.Accept(l)
			if err != nil {
				t.Errorf("%v: Accept %d of %d: %v", id, i+1, capacity, err)
				break
			}
			es = append(es, e)
		}
		if len(es) == capacity {
			if l, err := r.Reserve(id); err == nil {
				t.Errorf("%v: a reservation past the capacity of %d: %+v", id, capacity, l)
				r.Withdraw(l)
			}
		}
		for _, e := range es {
			e.Complete()
		}
	}
}

// TestAdv77cManyHeldAcceptsSurviveReconcile: 150 Accepts of one owner are
// held at once between their claim and their use (more than the claim
// record's 64 words: the rest go to its map, and counters n and n+64 are
// both under way), while Reconcile runs every millisecond with a 1ms
// reservation timeout. None is a stray claim: Reconcile must drop none of
// their bits. Then every other one is let go, 75 new Accepts are held
// (their marks take words freed or still held), and the rest let go last.
// Every held Accept returns an Execution; no slot is ever over its
// capacity; at the end no unit is lost or doubled, no ticket or claim is
// left, and the claim record is empty.
func TestAdv77cManyHeldAcceptsSurviveReconcile(t *testing.T) {
	const (
		slots    = 20
		capacity = 8
		first    = 150
		second   = 75
	)
	spec := PoolSpec{Lanes: 2, Keys: 4, ResourcesPerLane: slots, Path: filepath.Join(t.TempDir(), "seg")}
	opts := Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Millisecond}
	owner := adv77aOpen(t, spec, opts)
	r := adv77aOpen(t, spec, opts)
	var ids []ResourceID
	for i := range slots {
		id, err := owner.Register(Key{0xa77c, uint64(i % 4)}, capacity)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	h := newAdv77cHolder(t)
	mon := adv77cWatch(owner, ids)
	defer mon.end(t)

	type result struct {
		e   *Execution
		err error
	}
	var mu sync.Mutex
	results := map[int]result{}
	var wg sync.WaitGroup
	defer func() {
		h.openAll()
		wg.Wait()
	}()
	start := func(i int, l Lease) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.enter(i)
			e, err := owner.Accept(l)
			h.leave()
			mu.Lock()
			results[i] = result{e, err}
			mu.Unlock()
		}()
	}
	reserve := func(n, from int) {
		t.Helper()
		got := 0
		for got < n {
			progress := false
			for _, id := range ids {
				if got == n {
					break
				}
				l, err := r.Reserve(id)
				if err != nil {
					continue
				}
				progress = true
				start(from+got, l)
				got++
			}
			if !progress {
				t.Fatalf("setup: only %d of %d reservations had room", got, n)
			}
		}
	}

	// Wave one: 150 claims held at once, Reconcile not yet running (so no
	// reservation ages before its claim).
	reserve(first, 0)
	h.waitHeld(t, first)
	rec := adv77cReconcile(owner)
	defer rec.end()
	time.Sleep(40 * time.Millisecond) // 40 reservation timeouts
	total := 0
	for _, id := range ids {
		n, err := owner.Users(id)
		if err != nil {
			t.Fatal(err)
		}
		total += n
	}
	if total != first {
		t.Fatalf("Reconcile took reservations of live held Accepts: %d units held, want %d", total, first)
	}
	// Let every other one go.
	for i := 0; i < first; i += 2 {
		h.open(i)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(results)
		mu.Unlock()
		if n == first/2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d released Accepts returned", n, first/2)
		}
		time.Sleep(time.Millisecond)
	}
	mu.Lock()
	for i, res := range results {
		if res.err != nil {
			t.Errorf("held Accept %d (let go first): %v; a live claim's reservation was taken", i, res.err)
		} else {
			res.e.Complete()
		}
	}
	mu.Unlock()
	// Wave two, with Reconcile paused while the new reservations wait for
	// their claims, running again once they are held.
	rec.end()
	reserve(second, first)
	h.waitHeld(t, first+second)
	rec = adv77cReconcile(owner)
	time.Sleep(40 * time.Millisecond)
	total = 0
	for _, id := range ids {
		n, _ := owner.Users(id)
		total += n
	}
	if want := first/2 + second; total != want {
		t.Errorf("with %d Accepts held across the claim record's words and map: %d units held, want %d", want, total, want)
	}
	h.openAll()
	wg.Wait()
	rec.end()
	if n := rec.errs.Load(); n != 0 {
		t.Errorf("Reconcile failed %d time(s)", n)
	}
	mu.Lock()
	for i, res := range results {
		if !h.wasHeld(i) {
			t.Errorf("Accept %d was never held: the test did not test it", i)
		}
		if i%2 == 0 && i < first {
			continue // completed above
		}
		if res.err != nil {
			t.Errorf("held Accept %d: %v; a live claim's reservation was taken", i, res.err)
		} else {
			res.e.Complete()
		}
	}
	if len(results) != first+second {
		t.Errorf("%d Accepts returned, want %d", len(results), first+second)
	}
	mu.Unlock()
	mon.end(t)
	adv77cClaimsForgotten(t, owner)
	testHookClaimed.Store(nil)
	adv77cWhole(t, owner, r, ids, capacity)
}
