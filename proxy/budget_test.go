package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/backpressure"
	"github.com/orbitproxy/orbit/governor"
	"github.com/orbitproxy/orbit/orbitpool"
)

// budgetFleet is an owner and a client sharing a segment, the owner with
// nodeOpts (its governor, admission, near-window) and both with conf.
func budgetFleet(t *testing.T, nodeOpts NodeOptions, conf func(*Transport)) (owner, client *member) {
	t.Helper()
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	nodeOpts.SweepInterval = 50 * time.Millisecond
	owner = newMemberOpts(t, spec, nodeOpts, conf)
	client = newMember(t, spec, conf)
	return owner, client
}

// agedReservations is how many reservations the pool dropped unpresented.
func agedReservations(t *testing.T, m *member) uint64 {
	t.Helper()
	snap, err := m.pool.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, k := range snap.Keys {
		n += k.Aged
	}
	return n
}

// TestOwnerWithoutRoomRejectsByDeadline: an owner whose budget has no worker
// free waits for one only until the request's deadline comes within its
// near-window, then rejects the lease (giving its capacity back, so the pool
// ages nothing out); the caller's next claim point refuses the request as
// deadline_near, and nothing reaches the upstream.
func TestOwnerWithoutRoomRejectsByDeadline(t *testing.T) {
	u := newTestUpstream(t)
	gov := governor.New(1, 0)
	lim := backpressure.New(backpressure.WithNearWindow(50 * time.Millisecond))
	owner, client := budgetFleet(t, NodeOptions{Governor: gov, DeadlineNearWindow: 50 * time.Millisecond, MaxLeaseWait: 5 * time.Second},
		func(tr *Transport) { tr.MaxConnsPerKey = 1; tr.Limiter = lim })
	warm(t, owner, u.url("/sink"))
	held := gov.Acquire() // the owner's one worker is busy
	defer held.Release()

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	req, _ := http.NewRequestWithContext(ctx, "POST", u.url("/sink"), strings.NewReader("payload"))
	_, err := client.tr.RoundTrip(req)
	took := time.Since(start)
	if !errors.Is(err, backpressure.ErrDeadlineNear) || !IsRetrySafe(err) {
		t.Fatalf("error %v, want a retry-safe ErrDeadlineNear", err)
	}
	if took < 200*time.Millisecond || took > 2*time.Second {
		t.Errorf("refused after %v, want about 250ms (the deadline less the window)", took)
	}
	st := owner.node.Stats()
	if st.RefusedBy["deadline"] == 0 || st.ServedRemote != 0 {
		t.Errorf("owner: refused %v, served %d; want a deadline refusal and nothing served", st.RefusedBy, st.ServedRemote)
	}
	if n := agedReservations(t, owner); n != 0 {
		t.Errorf("%d reservations aged out; the rejected lease should have been given back", n)
	}
	if lim.Active() != 0 {
		t.Errorf("%d permits leaked", lim.Active())
	}
}

// TestOwnerBusyRetriedElsewhere: without a deadline the owner waits at most
// MaxLeaseWait; its rejection makes the caller avoid that owner and dial its
// own connection, and the request succeeds. (The POST carries an
// Idempotency-Key: one that could not be sent again would dial first.)
func TestOwnerBusyRetriedElsewhere(t *testing.T) {
	u := newTestUpstream(t)
	gov := governor.New(1, 0)
	owner, client := budgetFleet(t, NodeOptions{Governor: gov, MaxLeaseWait: 100 * time.Millisecond},
		func(tr *Transport) { tr.MaxConnsPerKey = 2 })
	warm(t, owner, u.url("/sink"))
	held := gov.Acquire()
	defer held.Release()

	req, _ := http.NewRequest("POST", u.url("/sink"), strings.NewReader("payload"))
	req.Header.Set("Idempotency-Key", "1")
	resp, err := client.tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("request failed: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "7" {
		t.Fatalf("upstream read %q bytes, want 7", b)
	}
	if st := owner.node.Stats(); st.RefusedBy["busy"] != 1 || st.ServedRemote != 0 {
		t.Errorf("owner: refused %v, served %d; want one busy refusal", st.RefusedBy, st.ServedRemote)
	}
	if st := client.node.Stats(); st.Created != 1 || st.ReusedRemote != 1 {
		t.Errorf("client: created %d, remote tries %d; want one refused remote try, then its own connection", st.Created, st.ReusedRemote)
	}
	if n := agedReservations(t, owner); n != 0 {
		t.Errorf("%d reservations aged out", n)
	}
}

// TestPoolWaitEndsNearDeadline: a request waiting for the one connection
// gives up when its deadline comes within the near-window, not at the
// deadline, and as ErrDeadlineNear.
func TestPoolWaitEndsNearDeadline(t *testing.T) {
	u := newTestUpstream(t)
	lim := backpressure.New(backpressure.WithNearWindow(100 * time.Millisecond))
	tr := localTransport(t, func(tr *Transport) { tr.MaxConnsPerKey = 1; tr.Limiter = lim })
	busy := make(chan struct{})
	go func() {
		defer close(busy)
		resp, err := get(t, context.Background(), tr, u.url("/slow?ms=600"))
		if err == nil {
			drain(resp)
		}
	}()
	waitFor(t, 2*time.Second, "the connection to be busy", func() bool { return tr.Node.Stats().OpenConns == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := get(t, ctx, tr, u.url("/cl"))
	took := time.Since(start)
	if !errors.Is(err, backpressure.ErrDeadlineNear) {
		t.Fatalf("error %v, want ErrDeadlineNear", err)
	}
	var we *orbitpool.WaitError
	if !errors.As(err, &we) || we.Reason != orbitpool.ReasonBusy {
		t.Errorf("error %v does not say what the pool lacked", err)
	}
	if took < 150*time.Millisecond || took >= 300*time.Millisecond+200*time.Millisecond {
		t.Errorf("gave up after %v, want about 200ms", took)
	}
	<-busy
}

// TestAdmissionRefusesDial: with the admission ceiling at one connection, a
// second dial is refused at once as ErrNotAdmitted and not retried.
func TestAdmissionRefusesDial(t *testing.T) {
	u := newTestUpstream(t)
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 32, ResourcesPerLane: 128}
	m := newMemberOpts(t, spec, NodeOptions{Admission: governor.NewAdmission(1)}, nil)
	busy := make(chan struct{})
	go func() {
		defer close(busy)
		resp, err := get(t, context.Background(), m.tr, u.url("/slow?ms=300"))
		if err == nil {
			drain(resp)
		}
	}()
	waitFor(t, 2*time.Second, "the first connection", func() bool { return m.node.Stats().OpenConns == 1 })
	_, err := get(t, context.Background(), m.tr, u.url("/cl"))
	if !errors.Is(err, ErrNotAdmitted) || !IsRetrySafe(err) {
		t.Fatalf("error %v, want a retry-safe ErrNotAdmitted", err)
	}
	if st := m.node.Stats(); st.DialsNotAdmitted != 1 || st.Retries != 0 {
		t.Errorf("dials not admitted %d, retries %d; want 1 and 0", st.DialsNotAdmitted, st.Retries)
	}
	<-busy
	resp, err := get(t, context.Background(), m.tr, u.url("/cl"))
	if err != nil {
		t.Fatalf("once the connection is free: %v", err)
	}
	drain(resp)
}

// TestOwnerAdmission: an owner at its admission ceiling of forwarded
// exchanges rejects the next lease with its own reason; the caller, with
// nothing else to try (the fleet's budget is the owner's connections), asks
// again and gives up as ErrOwnerBusy.
func TestOwnerAdmission(t *testing.T) {
	u := newTestUpstream(t)
	adm := governor.NewAdmission(4)
	owner, client := budgetFleet(t, NodeOptions{Admission: adm},
		func(tr *Transport) { tr.MaxConnsPerKey = 2; tr.MaxRetries = 1 })
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { warm(t, owner, u.url("/slow?ms=100")) })
	}
	wg.Wait()
	if n := owner.node.Stats().OpenConns; n != 2 {
		t.Fatalf("owner has %d connections, want 2", n)
	}
	adm.SetCeiling(1) // one forwarded exchange at a time
	first := make(chan error, 1)
	go func() {
		resp, err := get(t, context.Background(), client.tr, u.url("/slow?ms=400"))
		if err == nil {
			drain(resp)
		}
		first <- err
	}()
	waitFor(t, 2*time.Second, "the first forwarded exchange", func() bool { return owner.node.Stats().ServedRemote == 1 })
	_, err := get(t, context.Background(), client.tr, u.url("/cl"))
	if !errors.Is(err, ErrOwnerBusy) || !IsRetrySafe(err) {
		t.Fatalf("error %v, want a retry-safe ErrOwnerBusy", err)
	}
	if st := owner.node.Stats(); st.RefusedBy["admission"] != 2 {
		t.Errorf("owner refusals %v, want admission twice (the try and its one retry)", st.RefusedBy)
	}
	if err := <-first; err != nil {
		t.Fatalf("the admitted exchange: %v", err)
	}
}

// blockingBody yields n bytes in small reads, pausing once half is out until
// resume is closed.
type blockingBody struct {
	n, sent int
	half    chan struct{}
	resume  chan struct{}
	once    sync.Once
}

func (b *blockingBody) Read(p []byte) (int, error) {
	if b.sent >= b.n {
		return 0, io.EOF
	}
	if b.sent >= b.n/2 {
		b.once.Do(func() { close(b.half) })
		<-b.resume
	}
	k := min(len(p), b.n-b.sent, 4096)
	for i := range k {
		p[i] = 'x'
	}
	b.sent += k
	return k, nil
}

func (b *blockingBody) Close() error { return nil }

// TestLargeUploadBuffers: a large upload holds several workers' worth of
// buffers while memory allows, fewer when it is short, and never none; all
// of it is given back when the exchange ends.
func TestLargeUploadBuffers(t *testing.T) {
	u := newTestUpstream(t)
	for _, tc := range []struct {
		name      string
		memory    uint64
		wantBufs  int
		wantBytes uint64
	}{
		{"memory to spare", 0, maxExchangeBufs, maxExchangeBufs * exchangeBuf},
		{"memory short", 3 * exchangeBuf, 3, 3 * exchangeBuf},
		{"memory exhausted", exchangeBuf / 2, 1, exchangeBuf},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gov := governor.New(64, tc.memory)
			spec := orbitpool.PoolSpec{Lanes: 1, Keys: 32, ResourcesPerLane: 128}
			m := newMemberOpts(t, spec, NodeOptions{Governor: gov}, nil)
			body := &blockingBody{n: 2 << 20, half: make(chan struct{}), resume: make(chan struct{})}
			req, _ := http.NewRequest("POST", u.url("/sink"), body)
			req.ContentLength = int64(body.n)
			done := make(chan string, 1)
			go func() {
				resp, err := m.tr.RoundTrip(req)
				if err != nil {
					done <- err.Error()
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				done <- string(b)
			}()
			<-body.half
			if got := gov.Outstanding(); got != tc.wantBufs {
				t.Errorf("upload holds %d workers, want %d", got, tc.wantBufs)
			}
			if got := gov.ReservedBytes(); got != tc.wantBytes {
				t.Errorf("upload charged %d bytes, want %d", got, tc.wantBytes)
			}
			close(body.resume)
			if got := <-done; got != "2097152" {
				t.Fatalf("upstream read %s", got)
			}
			waitFor(t, time.Second, "the budget to be given back", func() bool {
				return gov.Outstanding() == 0 && gov.ReservedBytes() == 0
			})
		})
	}
}

// TestWaitingRequestsHoldNoWorker: an owner with one worker and one
// connection runs a request of its own on it while another of its own and a
// sibling's wait for it. A waiting request holds no worker, so whichever
// gets the connection next runs: the sibling's lease is never refused as
// busy for want of a worker that a waiting request of the owner's held, and
// all three succeed.
func TestWaitingRequestsHoldNoWorker(t *testing.T) {
	u := newTestUpstream(t)
	gov := governor.New(1, 0)
	owner, client := budgetFleet(t, NodeOptions{Governor: gov, MaxLeaseWait: time.Second},
		func(tr *Transport) { tr.MaxConnsPerKey = 1 })
	warm(t, owner, u.url("/sink"))
	errs := make(chan error, 3)
	send := func(m *member, ms int) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := get(t, ctx, m.tr, u.url(fmt.Sprintf("/slow?ms=%d", ms)))
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != "ok" {
				err = fmt.Errorf("body %q", b)
			}
		}
		errs <- err
	}
	go send(owner, 300)
	time.Sleep(50 * time.Millisecond)
	go send(owner, 300)
	time.Sleep(50 * time.Millisecond)
	go send(client, 50)
	for range 3 {
		if err := <-errs; err != nil {
			t.Errorf("request failed: %v", err)
		}
	}
	if st := owner.node.Stats(); st.RefusedBy["busy"] != 0 || st.ServedRemote != 1 {
		t.Errorf("owner: refused %v, served %d for the sibling; want no refusal and one served", st.RefusedBy, st.ServedRemote)
	}
	if st := client.node.Stats(); st.Created != 0 {
		t.Errorf("client dialed %d connections over a cap of 1", st.Created)
	}
}
