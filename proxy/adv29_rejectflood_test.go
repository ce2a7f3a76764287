package proxy

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/governor"
	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv29UnreadRefusalsHoldNoWorker: a sibling (buggy or hostile, same
// uid) pipelines request frames whose leases name nothing, and reads none
// of the owner's refusals. Once the stream's buffers are full the owner's
// write of a refusal blocks. Whatever that costs, it must not be a worker of
// the owner's budget held for as long as the peer keeps the stream open: a
// refusal serves nothing, and the owner's own requests (and every other
// sibling's) need those workers. With a budget of one worker, the owner's
// own request must still be served.
func TestAdv29UnreadRefusalsHoldNoWorker(t *testing.T) {
	base := adv29BigUpstream(t)
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	gov := governor.New(1, 1<<30)
	owner := newMemberPoolOpts(t, spec, orbitpool.Options{ReconcileInterval: 50 * time.Millisecond},
		NodeOptions{SweepInterval: 50 * time.Millisecond, Governor: gov}, nil)
	frame, err := appendRequestFrame(nil, []byte("no such lease"), time.Time{}, flagBodyOnAccept)
	if err != nil {
		t.Fatal(err)
	}
	frame = append(frame, "GET /small HTTP/1.1\r\nHost: x\r\n\r\n"...)
	flood := bytes.Repeat(frame, 40000)
	c, err := net.Dial("unix", SocketPath(SocketDir(spec.Path), owner.pool.Lane()))
	if err != nil {
		t.Fatal(err)
	}
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		c.Write(flood)
	}()
	t.Cleanup(func() {
		c.Close()
		<-wrote
	})
	// Until the owner's refusals fill the stream and it stops reading.
	last := uint64(0)
	for start := time.Now(); ; {
		time.Sleep(100 * time.Millisecond)
		n := owner.node.Stats().Refused
		if n > 0 && n == last {
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("the owner still reads the peer's frames after 5s (%d refused)", n)
		}
		last = n
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := getBody(ctx, owner.tr, base+"/small"); err != nil {
		t.Fatalf("the owner's own request, with a peer that reads none of its %d refusals: %v (budget workers outstanding %d)",
			owner.node.Stats().Refused, err, gov.Outstanding())
	}
}
