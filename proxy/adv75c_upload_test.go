package proxy

import (
	"context"
	"testing"
	"time"
)

// TestAdv75cSlowUploadNotCancelled: a client's upload through a sibling
// that is slow but live (a chunk every 30 ms for ~0.7 s, many hang-up polls)
// and one that is big against an upstream reading slowly (the owner's writer
// blocked upstream in the body phase) both complete with the right echo:
// the owner's hang-up poll must fire only for a peer that closed.
func TestAdv75cSlowUploadNotCancelled(t *testing.T) {
	for _, c := range []struct {
		name     string
		n, size  int
		pause    time.Duration
		slowRead time.Duration
	}{
		{"trickle", 24, 1024, 30 * time.Millisecond, 0},
		{"blocked-upstream", 64, 32 << 10, 0, 15 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			u := newAdv75bUpstream(t, nil)
			u.slowRead = c.slowRead
			owner, client, _ := adv75cPair(t, 0)
			warm(t, owner, u.srv.URL+"/?q=warm")
			served := owner.node.Stats().ServedRemote
			body := &adv75cTrickle{n: c.n, size: c.size, pause: c.pause}
			got, err := adv75cDo(t, client, "POST", u.srv.URL+"/?q=up", body, 30*time.Second)
			if err != nil {
				t.Fatalf("slow upload through sibling failed: %v", err)
			}
			if want := "POST:" + body.want() + ":up"; got != want {
				t.Fatalf("wrong echo: got %d bytes, want %d", len(got), len(want))
			}
			if owner.node.Stats().ServedRemote <= served {
				t.Fatalf("request did not go through the sibling: %+v", owner.node.Stats())
			}
		})
	}
}

// TestAdv75cShutdownLetsSlowUploadFinish: a graceful Shutdown with ample
// time begins while a slow live upload runs through the owner; the drain
// must let it finish (cancelAll must not fail an exchange the drain had
// time for), and Shutdown returns only after it ended.
func TestAdv75cShutdownLetsSlowUploadFinish(t *testing.T) {
	u := newAdv75bUpstream(t, nil)
	owner, client, _ := adv75cPair(t, 0)
	warm(t, owner, u.srv.URL+"/?q=warm")
	body := &adv75cTrickle{n: 20, size: 2048, pause: 30 * time.Millisecond}
	type res struct {
		got string
		err error
		at  time.Time
	}
	done := make(chan res, 1)
	go func() {
		g, err := adv75cDo(t, client, "POST", u.srv.URL+"/?q=sd", body, 30*time.Second)
		done <- res{g, err, time.Now()}
	}()
	waitFor(t, 10*time.Second, "upload under way at the owner", func() bool { return owner.node.srv.active.Load() > 0 })
	time.Sleep(100 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	owner.node.Shutdown(ctx)
	shutAt := time.Now()
	var r res
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("upload never returned")
	}
	if r.err != nil {
		t.Fatalf("upload failed across a graceful Shutdown with time to spare: %v", r.err)
	}
	if want := "POST:" + body.want() + ":sd"; r.got != want {
		t.Fatalf("wrong echo: %d bytes, want %d", len(r.got), len(want))
	}
	if r.at.After(shutAt.Add(time.Second)) {
		t.Fatalf("Shutdown returned %v before the exchange it drained ended", r.at.Sub(shutAt))
	}
}
