package proxy

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/governor"
	"github.com/orbitproxy/orbit/internal/grpcmsg"
)

// TestAdv77cH2ShutdownRefusesWaitingStreams: as TestAdv77cShutdownAtWorkerHandoff
// over HTTP/2 (h2c): the owner's only worker is held by its own call
// (/hold, until it goes away), siblings' gRPC unary calls lease streams on the
// owner's h2c connection (the fleet's only one allowed) and wait for the
// worker, and the owner Shuts down (8s grace) while its own exchange gives
// the worker back 200ms later. Every call is answered whole (its message
// and grpc-status 0), once, and Shutdown returns.
func TestAdv77cH2ShutdownRefusesWaitingStreams(t *testing.T) {
	up := newH2Upstream(t, 100)
	spec := testSpec
	spec.Path = t.TempDir() + "/seg"
	conf := func(tr *Transport) { h2cConf(tr); tr.MaxConnsPerKey = 1 }
	owner := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond, Governor: governor.New(1, 0), MaxLeaseWait: 4 * time.Second}, conf)
	sibs := []*member{newMember(t, spec, conf), newMember(t, spec, conf)}
	warmH2(t, owner, up.url)

	// The owner's own call, held by the upstream until it goes away,
	// holds the one worker.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	resp, err := owner.tr.RoundTrip(grpcReq(t, ctx, up.url+"/hold", http.NoBody))
	if err != nil {
		t.Fatalf("the owner's held call: %v", err)
	}
	var once sync.Once
	releaseWorker := func() {
		once.Do(func() {
			cancel()
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
	t.Cleanup(releaseWorker)

	const n = 4
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		m := sibs[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 12*time.Second)
			defer cancel()
			msg := []byte{'m', byte('0' + i)}
			resp, err := m.tr.RoundTrip(grpcReq(t, ctx, up.url+"/unary", bytes.NewReader(grpcmsg.Frame(msg))))
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			p, err := grpcmsg.Read(resp.Body)
			if err != nil || !bytes.Equal(p, msg) {
				errs <- &Error{Op: "read", Err: io.ErrUnexpectedEOF}
				t.Errorf("unary call %d: message %q, %v; want %q", i, p, err, msg)
				return
			}
			io.Copy(io.Discard, resp.Body)
			if st := resp.Trailer.Get("Grpc-Status"); st != "0" {
				t.Errorf("unary call %d: grpc-status %q, want 0", i, st)
			}
			errs <- nil
		}()
	}
	time.Sleep(300 * time.Millisecond)
	if k := len(errs); k != 0 {
		t.Fatalf("setup: %d of %d calls ended before the owner's worker came free; they should wait on it", k, n)
	}
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
		defer cancel()
		shut <- owner.node.Shutdown(ctx)
	}()
	time.Sleep(200 * time.Millisecond)
	go releaseWorker()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(13 * time.Second):
		t.Fatal("sibling gRPC calls hung as the owner drained")
	}
	close(errs)
	fails := 0
	for err := range errs {
		if err != nil {
			fails++
			t.Errorf("a sibling's gRPC call waiting on the owner's worker at its drain: %v", err)
		}
	}
	if fails != 0 {
		t.Errorf("%d of %d calls failed; net/http's HTTP/2 client serves each", fails, n)
	}
	select {
	case err := <-shut:
		if err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown did not return")
	}
}
