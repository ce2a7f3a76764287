package proxy

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/governor"
	"github.com/orbitproxy/orbit/orbitpool"
)

// adv32HoldFirst hands every accepted connection but the first to the
// server; the first is sent on held, for the test to end when it likes.
type adv32HoldFirst struct {
	net.Listener
	once sync.Once
	held chan net.Conn
}

func (l *adv32HoldFirst) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		first := false
		l.once.Do(func() { first = true })
		if !first {
			return c, nil
		}
		l.held <- c
	}
}

// adv32WaitSignal is LocalFirst, telling when a decision is to wait.
type adv32WaitSignal struct {
	waits atomic.Int32
}

func (p *adv32WaitSignal) Decide(v *orbitpool.View) orbitpool.Decision {
	d := orbitpool.LocalFirst{}.Decide(v)
	if d.Action == orbitpool.ActionWait {
		p.waits.Add(1)
	}
	return d
}

// TestAdv32RetryHoldsWorkerWhileWaitingOnPool: the governor's rule is that
// a unit never waits for more while holding (hold-and-wait deadlocks), and
// the transport says a request that waits for the pool holds no worker. But
// a request whose first attempt failed retry-safely (here its dial's TLS
// handshake) keeps its worker across the retry, and the retry waits on the
// pool with it. With one worker and one connection per key: A holds the
// worker and dials; B waits on the pool; A's dial fails, so B gets the
// creation unit and waits for the worker, while A, retrying, waits on the
// pool for B's unit. Each holds what the other waits for until their
// deadlines (forever without one). Both must be served.
func TestAdv32RetryHoldsWorkerWhileWaitingOnPool(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hl := &adv32HoldFirst{Listener: ln, held: make(chan net.Conn, 1)}
	srv.Listener = hl
	srv.StartTLS()
	t.Cleanup(srv.Close)

	gov := governor.New(1, 0)
	pol := &adv32WaitSignal{}
	m := newMemberOpts(t, orbitpool.PoolSpec{Lanes: 1, Keys: 32, ResourcesPerLane: 128},
		NodeOptions{SweepInterval: 50 * time.Millisecond, Governor: gov}, func(tr *Transport) {
			tr.MaxConnsPerKey = 1
			tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true}
			tr.Policy = pol
		})

	const budget = 3 * time.Second
	do := func(name string, errs chan<- error) {
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/"+name, nil)
		resp, err := m.tr.RoundTrip(req)
		if err == nil {
			drain(resp)
		}
		errs <- err
	}
	aErr, bErr := make(chan error, 1), make(chan error, 1)
	go do("a", aErr)
	var first net.Conn
	select {
	case first = <-hl.held:
	case <-time.After(5 * time.Second):
		t.Fatal("A never dialed")
	}
	if n := gov.Outstanding(); n != 1 {
		t.Fatalf("A dials holding %d workers, want 1", n)
	}
	go do("b", bErr)
	waitFor(t, 5*time.Second, "B waiting on the pool", func() bool { return pol.waits.Load() > 0 })
	first.Close() // A's handshake fails: a retry-safe dial error

	start := time.Now()
	for _, c := range []struct {
		name string
		ch   chan error
	}{{"A", aErr}, {"B", bErr}} {
		select {
		case err := <-c.ch:
			if err != nil {
				t.Errorf("%s after %s: %v (governor outstanding %d)", c.name, time.Since(start).Round(time.Millisecond), err, gov.Outstanding())
			}
		case <-time.After(budget + 5*time.Second):
			t.Fatalf("%s never returned", c.name)
		}
	}
	waitFor(t, 5*time.Second, "workers back", func() bool { return gov.Outstanding() == 0 })
}
