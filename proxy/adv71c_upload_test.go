package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// adv71cFeedBody is a request body fed by the test, one chunk per send on
// feed, which records reads that begin after the RoundTrip that owns it has
// returned (late) and reads still under way at that moment (pending).
type adv71cFeedBody struct {
	feed     chan []byte
	closed   chan struct{}
	once     sync.Once
	returned atomic.Bool
	inRead   atomic.Int32
	late     atomic.Int32
}

func newAdv71cFeedBody() *adv71cFeedBody {
	return &adv71cFeedBody{feed: make(chan []byte), closed: make(chan struct{})}
}

func (b *adv71cFeedBody) Read(p []byte) (int, error) {
	if b.returned.Load() {
		b.late.Add(1)
	}
	b.inRead.Add(1)
	defer b.inRead.Add(-1)
	select {
	case c, ok := <-b.feed:
		if !ok {
			return 0, io.EOF
		}
		return copy(p, c), nil
	case <-b.closed:
		return 0, errors.New("body closed")
	}
}

func (b *adv71cFeedBody) Close() error {
	b.once.Do(func() { close(b.closed) })
	return nil
}

// TestAdv71cShutdownTimeoutMidUploadFailsOnce: a sibling's POST is half
// uploaded through its owner when the owner's Shutdown runs out of time and
// the owner closes. The request reached the upstream, so the sibling must
// report an error that is not retry-safe, must not send the POST again
// (the upstream sees it once), and once its RoundTrip has returned no
// goroutine of the attempt reads the caller's body (THREATS "Lifetimes").
// Over HTTP/1.1 the writer, as net/http's, may wait in the caller's body
// until it yields, which the test feeds.
func TestAdv71cShutdownTimeoutMidUploadFailsOnce(t *testing.T) {
	var posts atomic.Int32
	bodyBegan := make(chan struct{}, 1)
	base := rawUpstream(t, func(c net.Conn, br *bufio.Reader, req *http.Request) bool {
		if req.URL.Path == "/warm" {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			return true
		}
		posts.Add(1)
		buf := make([]byte, 1)
		_, err := io.ReadFull(req.Body, buf)
		select {
		case bodyBegan <- struct{}{}:
		default:
		}
		if err == nil {
			_, err = io.Copy(io.Discard, req.Body)
		}
		if err != nil {
			return false
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ndone")
		return true
	})
	owner, client := remotePair(t, nil)
	warm(t, owner, base+"/warm")

	body := newAdv71cFeedBody()
	defer body.Close()
	req, _ := http.NewRequest("POST", base+"/up", body)
	req.ContentLength = 1 << 20
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type res struct {
		resp *http.Response
		err  error
	}
	done := make(chan res, 1)
	go func() {
		resp, err := client.tr.RoundTrip(req.WithContext(ctx))
		body.returned.Store(true)
		done <- res{resp, err}
	}()
	select {
	case body.feed <- make([]byte, 32<<10):
	case <-time.After(5 * time.Second):
		t.Fatal("the body was never read")
	}
	select {
	case <-bodyBegan:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream never saw the body begin")
	}
	// The attempt's writer is now waiting in the body for more.
	waitFor(t, 2*time.Second, "the writer to wait in the body", func() bool { return body.inRead.Load() > 0 })
	sctx, scancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	shutErr := make(chan error, 1)
	defer scancel()
	go func() { shutErr <- owner.node.Shutdown(sctx) }()
	select {
	case <-shutErr:
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not return")
	}
	// As net/http's writer, the attempt's may wait in the caller's body
	// until it yields: feed it until RoundTrip returns (bounded).
	var r res
	deadline := time.After(8 * time.Second)
feed:
	for {
		select {
		case r = <-done:
			break feed
		case body.feed <- make([]byte, 1024):
		case <-deadline:
			t.Fatal("the sibling's RoundTrip did not return after its owner closed, its body fed")
		}
	}
	pendingAtReturn := body.inRead.Load()
	if r.err == nil {
		b, berr := io.ReadAll(r.resp.Body)
		r.resp.Body.Close()
		t.Fatalf("a POST cut mid-upload by its owner's close succeeded: %q %v", b, berr)
	}
	if IsRetrySafe(r.err) {
		t.Errorf("error %v is retry-safe, but the request reached the upstream", r.err)
	}
	// Give a goroutine of the attempt that outlived RoundTrip the chance
	// to read again: offer it more of the body.
	select {
	case body.feed <- make([]byte, 1024):
		t.Errorf("a goroutine of the attempt read the body after RoundTrip returned %v", r.err)
	case <-time.After(200 * time.Millisecond):
	}
	if n := body.late.Load(); n != 0 {
		t.Errorf("%d reads of the body began after RoundTrip returned", n)
	}
	if pendingAtReturn != 0 {
		t.Logf("a read of the body was still under way when RoundTrip returned (body closed meanwhile: %v)", isClosedChan(body.closed))
		if !isClosedChan(body.closed) {
			t.Errorf("RoundTrip returned with a read of the body under way and the body not closed")
		}
	}
	if n := posts.Load(); n != 1 {
		t.Fatalf("the upstream saw the POST %d times, want once", n)
	}
}

func isClosedChan(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// TestAdv71cSiblingLeavesMidExchange: a sibling process leaves (its Node
// closes, then its pool) while a response it gets through the owner's
// connection is still streaming. Whatever becomes of that response, the
// owner's connection must end up in a known state: idle and reused by the
// owner's next request with the right answer, or closed and replaced; and
// the table, as the owner reads it, keeps no user or reservation of the
// sibling's.
func TestAdv71cSiblingLeavesMidExchange(t *testing.T) {
	for _, readRest := range []bool{true, false} {
		t.Run("readRest="+strconv.FormatBool(readRest), func(t *testing.T) {
			u := newTestUpstream(t)
			spec := testSpec
			spec.Path = filepath.Join(t.TempDir(), "seg")
			conf := func(tr *Transport) { tr.MaxConnsPerKey = 1 }
			owner := newMember(t, spec, conf)
			p, err := orbitpool.Open(spec, orbitpool.Options{ReconcileInterval: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			nd, err := NewNode(p, NodeOptions{SweepInterval: 50 * time.Millisecond})
			if err != nil {
				p.Close()
				t.Fatal(err)
			}
			ctr := &Transport{Node: nd, MaxConnsPerKey: 1}
			var closeOnce sync.Once
			leave := func() { closeOnce.Do(func() { nd.Close(); p.Close() }) }
			defer leave()
			warm(t, owner, u.url("/cl"))

			id := "leave-" + strconv.FormatBool(readRest)
			g := u.gate(id)
			defer func() {
				for range 2 {
					select {
					case g <- struct{}{}:
					default:
					}
				}
			}()
			resp, err := get(t, context.Background(), ctr, u.url("/stream?id="+id))
			if err != nil {
				t.Fatal(err)
			}
			if got, err := readWithTimeout(resp.Body, len("chunk-0;"), 5*time.Second); err != nil || got != "chunk-0;" {
				resp.Body.Close()
				t.Fatalf("first chunk: %q %v", got, err)
			}
			if nd.Stats().ReusedRemote == 0 {
				resp.Body.Close()
				t.Fatalf("not through the owner: %+v", nd.Stats())
			}
			left := make(chan struct{})
			go func() { defer close(left); leave() }()
			select {
			case <-left:
			case <-time.After(5 * time.Second):
				resp.Body.Close()
				t.Fatal("the sibling's Close did not return with an exchange streaming")
			}
			g <- struct{}{}
			g <- struct{}{}
			if readRest {
				rest, err := readWithTimeout(resp.Body, len("chunk-1;chunk-2;"), 5*time.Second)
				if err == nil && rest != "chunk-1;chunk-2;" {
					t.Errorf("rest of the stream after the sibling left: %q", rest)
				}
			}
			resp.Body.Close()

			// The owner's next requests are answered right, on its one
			// connection of the key or on a replacement.
			for i := range 3 {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				r, err := get(t, ctx, owner.tr, u.url("/cl"))
				if err != nil {
					cancel()
					t.Fatalf("owner request %d after the sibling left: %v", i, err)
				}
				b, err := io.ReadAll(r.Body)
				r.Body.Close()
				cancel()
				if err != nil || string(b) != "hello world" {
					t.Fatalf("owner request %d after the sibling left: %q %v", i, b, err)
				}
			}
			waitFor(t, 3*time.Second, "the table to hold no user or reservation", func() bool {
				s, err := owner.pool.Snapshot()
				if err != nil {
					return false
				}
				for _, k := range s.Keys {
					if k.InUse != 0 || k.Pending != 0 || k.Live > 1 {
						return false
					}
				}
				return true
			})
		})
	}
}

// TestAdv71cH2OwnerCloseMidUploadLifetimes: the HTTP/2 variant of a
// sibling's upload cut by its owner's Close, without a drain, while the
// attempt's writer waits in the caller's body. Over HTTP/2 the failed
// exchange closes the caller's body (as x/net's client does), so RoundTrip
// must return without the body yielding; it must fail, not succeed; and
// once it has returned, no goroutine of the attempt may begin a read of the
// body.
func TestAdv71cH2OwnerCloseMidUploadLifetimes(t *testing.T) {
	bodyBegan := make(chan struct{}, 1)
	s := newH2CServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/warm" {
			io.WriteString(w, "ok")
			return
		}
		buf := make([]byte, 1)
		if _, err := io.ReadFull(r.Body, buf); err != nil {
			return
		}
		select {
		case bodyBegan <- struct{}{}:
		default:
		}
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "done")
	})
	owner, client := remotePair(t, h2cConf)
	warm(t, owner, s.url+"/warm")

	body := newAdv71cFeedBody()
	defer body.Close()
	req, _ := http.NewRequest("POST", s.url+"/up", body)
	req.ContentLength = 1 << 20
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type res struct {
		resp *http.Response
		err  error
	}
	done := make(chan res, 1)
	go func() {
		resp, err := client.tr.RoundTrip(req.WithContext(ctx))
		body.returned.Store(true)
		done <- res{resp, err}
	}()
	select {
	case body.feed <- make([]byte, 16<<10):
	case <-time.After(5 * time.Second):
		t.Fatal("the body was never read")
	}
	select {
	case <-bodyBegan:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream never saw the body begin")
	}
	if client.node.Stats().ReusedRemote == 0 {
		t.Fatalf("not through the owner: %+v", client.node.Stats())
	}
	waitFor(t, 2*time.Second, "the writer to wait in the body", func() bool { return body.inRead.Load() > 0 })
	closed := make(chan struct{})
	go func() { defer close(closed); owner.node.Close() }()
	var r res
	select {
	case r = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the sibling's HTTP/2 RoundTrip did not return after its owner closed, its body not fed")
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("owner's Close hung")
	}
	if r.err == nil {
		b, berr := io.ReadAll(r.resp.Body)
		r.resp.Body.Close()
		if berr == nil {
			t.Fatalf("an upload cut by its owner's close succeeded: %q", b)
		}
	}
	select {
	case body.feed <- make([]byte, 1024):
		t.Errorf("a goroutine of the attempt read the body after RoundTrip returned (%v)", r.err)
	case <-time.After(200 * time.Millisecond):
	}
	if n := body.late.Load(); n != 0 {
		t.Errorf("%d reads of the body began after RoundTrip returned", n)
	}
}
