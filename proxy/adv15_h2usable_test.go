package proxy

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// TestAdv15UnusableH2NotReadBehindBlockedWrite: a request the pool offers
// an HTTP/2 connection that can take no new stream (its upstream sent
// GOAWAY) while a write on it is blocked (the upstream stopped reading under
// a request body). The request used to read the connection's state on its
// own goroutine to take it out of the pool, and x/net/http2's State waits
// for the blocked write: the request hung, past its own deadline. It must
// go to a new connection at once instead.
func TestAdv15UnusableH2NotReadBehindBlockedWrite(t *testing.T) {
	release := make(chan struct{})
	defer close(release) // before the member's cleanup: the write ends with it
	goaway := make(chan struct{})
	url := newStuckH2With(t, func(fr *http2.Framer, f *http2.HeadersFrame, conn int) {
		if conn == 1 {
			// Once the client's write is blocked (the state cannot be
			// read) the stream goes on and no new one may start.
			select {
			case <-goaway:
				fr.WriteGoAway(f.StreamID, http2.ErrCodeNo, nil)
			case <-release:
			}
			<-release
			return
		}
		var b bytes.Buffer
		enc := hpack.NewEncoder(&b)
		enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
		enc.WriteField(hpack.HeaderField{Name: "content-length", Value: "0"})
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: f.StreamID, BlockFragment: b.Bytes(), EndStream: true, EndHeaders: true})
		for {
			if _, err := fr.ReadFrame(); err != nil {
				return
			}
		}
	})
	// No sweep during the test: the request itself must find the
	// connection unusable, not a sweep before it.
	m := newMemberOpts(t, testSpecLocal, NodeOptions{SweepInterval: time.Hour}, func(tr *Transport) { tr.H2C = true })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	blocked := make(chan error, 1)
	go func() {
		resp, err := m.tr.RoundTrip(grpcReq(t, ctx, url+"/upload", io.NopCloser(zeros{})))
		if resp != nil {
			resp.Body.Close()
		}
		blocked <- err
	}()
	key := mustKey(t, m.tr, url)
	var hc *h2conn
	waitFor(t, 5*time.Second, "the blocked upload's connection", func() bool {
		c, _ := m.pool.Candidates(key, nil)
		if len(c) != 1 || c[0].InUse != 1 {
			return false
		}
		hc = m.node.lookupH2(c[0].ID)
		return hc != nil
	})
	waitH2WriteBlocked(t, hc)
	close(goaway)
	waitFor(t, 5*time.Second, "the GOAWAY", func() bool { return !hc.cc.CanTakeNewRequest() })
	if c, _ := m.pool.Candidates(key, nil); len(c) != 1 || c[0].Capacity == 0 {
		t.Fatalf("candidates %+v: want the connection still offered (its state cannot be read), or the test shows nothing", c)
	}

	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		resp, err := m.tr.RoundTrip(grpcReq(t, rctx, url+"/unary", http.NoBody))
		if err == nil {
			drain(resp)
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("request after %v: %v", time.Since(start), err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("request still running 5s past its deadline, behind the blocked write")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("request took %v behind the blocked write, want it on a new connection at once", d)
	}
	if c, _ := m.pool.Candidates(key, nil); len(c) != 2 {
		t.Fatalf("%d connection(s) for the key, want the blocked one and a new one: %+v", len(c), c)
	}
	select {
	case err := <-blocked:
		t.Fatalf("the upload ended (%v); want it blocked for the whole test", err)
	default:
	}
}
