package proxy

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/internal/h2frame"
	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv13FollowerNotStalledByBlockedH2Write: the follower is woken for a
// connection whose write is blocked (its upstream stopped reading under a
// request body), and reading that connection's state waits for the write.
// Another connection's SETTINGS must still be followed: its peer lowers its
// stream limit from 8 to 2 while no stream starts or ends there and the
// sweep is an hour away, so only the follower can tell the pool.
func TestAdv13FollowerNotStalledByBlockedH2Write(t *testing.T) {
	release := make(chan struct{})
	defer close(release) // before the member's cleanup: the write ends with it
	stuck := newStuckH2(t, release)
	up := h2frame.New(t, 8, 0)
	m := newMemberOpts(t, testSpecLocal, NodeOptions{SweepInterval: time.Hour}, h2cConf)
	if err := getOK(m, context.Background(), up.URL+"/"); err != nil {
		t.Fatal(err)
	}
	id := h2ID(t, m, up.URL)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	blocked := make(chan error, 1)
	go func() {
		resp, err := m.tr.RoundTrip(grpcReq(t, ctx, stuck+"/upload", io.NopCloser(zeros{})))
		if resp != nil {
			resp.Body.Close()
		}
		blocked <- err
	}()
	stuckID := h2IDWait(t, m, stuck)
	shc := m.node.lookupH2(stuckID)
	if shc == nil {
		t.Fatal("the blocked connection is not installed")
	}
	waitH2WriteBlocked(t, shc)
	m.node.noteH2(shc) // as its read loop's next read would

	up.SetLimit(2)
	waitFor(t, 10*time.Second, "the client to acknowledge the lower limit", func() bool {
		_, _, acked, _ := up.Stats()
		return acked == 1
	})
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := m.pool.Capacity(id)
		if err == nil && c == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("capacity %d, %v 5s after the client acknowledged limit 2: the follower stalled behind the blocked write", c, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case err := <-blocked:
		t.Fatalf("the upload ended (%v); want it blocked for the whole test", err)
	default:
	}
}

// h2IDWait is h2ID once the connection to url is in the pool.
func h2IDWait(t *testing.T, m *member, url string) (id orbitpool.ResourceID) {
	t.Helper()
	key := mustKey(t, m.tr, url)
	waitFor(t, 5*time.Second, "the connection to "+url, func() bool {
		c, _ := m.pool.Candidates(key, nil)
		if len(c) == 1 && c[0].InUse == 1 {
			id = c[0].ID
			return true
		}
		return false
	})
	return id
}
