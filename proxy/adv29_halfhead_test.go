package proxy

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// TestAdv29HalfHeadHoldsNoConnection: a sibling (buggy or hostile, same
// uid) presents a valid lease on the owner's only connection of a key and
// sends half of a small request head, then stalls with the stream open.
// "A silent or half-sent peer costs a timer, not a leased upstream
// connection" (THREATS.md, the unix leg): the owner's own request for the
// key must be served, not wait the head's timeout (peerHeadTimeout, 10s)
// behind a connection taken up for a head that never comes. Stock Caddy
// takes no upstream connection for a client until its head is whole.
func TestAdv29HalfHeadHoldsNoConnection(t *testing.T) {
	base := adv29BigUpstream(t)
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	conf := func(tr *Transport) { tr.MaxConnsPerKey = 1 }
	owner := newMember(t, spec, conf)
	client := newMember(t, spec, conf)
	if err := getBody(context.Background(), owner.tr, base+"/small"); err != nil {
		t.Fatalf("warm: %v", err)
	}
	oc := lastOwned(owner)
	if oc == nil {
		t.Fatal("warm left no idle connection")
	}
	frame := leaseFrame(t, client, oc, time.Time{}, flagBodyOnAccept)
	frame = fmt.Appendf(frame, "GET /small HTTP/1.1\r\nHo")
	c, err := net.Dial("unix", SocketPath(SocketDir(spec.Path), owner.pool.Lane()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(frame); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	start := time.Now()
	if err := getBody(ctx, owner.tr, base+"/small"); err != nil {
		t.Fatalf("the owner's own request, behind a sibling's half-sent head: %v after %v (served remote %d)",
			err, time.Since(start).Round(time.Millisecond), owner.node.Stats().ServedRemote)
	}
}
