package proxy

import (
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/governor"
)

// TestAdv6LifeSiblingClosesWhileWaitingOnOwner: a sibling's POST waits on
// the owner for a worker of its budget when the sibling leaves the fleet
// (Node.Close, then its pool). The sibling's Close returns at once; the POST
// reaches the upstream at most once; and once everything settles nothing of
// the table is leaked: the owner's one connection (the key's cap is 1)
// serves a new member's request and the owner's own.
func TestAdv6LifeSiblingClosesWhileWaitingOnOwner(t *testing.T) {
	u := newHangUpstream(t)
	close(u.release)
	gov := governor.New(1, 0)
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	owner := newMemberOpts(t, spec, NodeOptions{Governor: gov, MaxLeaseWait: 2 * time.Second, SweepInterval: 50 * time.Millisecond},
		func(tr *Transport) { tr.MaxConnsPerKey = 1 })
	client := newMember(t, spec, func(tr *Transport) { tr.MaxConnsPerKey = 1 })
	warm(t, owner, u.srv.URL+"/warm")
	held := gov.Acquire()
	released := false
	defer func() {
		if !released {
			held.Release()
		}
	}()

	done := sendAsync(client.tr, postOnce(u.srv.URL+"/hang", "once"))
	waitFor(t, 2*time.Second, "the POST to wait on the owner", func() bool { return client.node.Stats().ReusedRemote == 1 })
	time.Sleep(50 * time.Millisecond)

	start := time.Now()
	if err := client.node.Close(); err != nil {
		t.Fatal(err)
	}
	client.pool.Close()
	if d := time.Since(start); d > time.Second {
		t.Fatalf("the sibling's Close took %s with a request waiting on its owner", d)
	}
	held.Release()
	released = true
	select {
	case <-done:
	case <-time.After(8 * time.Second):
		t.Fatal("the POST hung after its sender closed")
	}
	if n := u.count("POST once"); n > 1 {
		t.Fatalf("the upstream saw the POST %d times", n)
	}

	third := newMember(t, spec, func(tr *Transport) { tr.MaxConnsPerKey = 1 })
	for i, m := range []*member{third, owner} {
		req, _ := http.NewRequest("GET", u.srv.URL+"/after", nil)
		r := <-sendAsync(m.tr, req)
		if r.err != nil || r.body != "ok" {
			t.Fatalf("request %d after the sibling left: %q, %v (owner %+v)", i, r.body, r.err, owner.node.Stats())
		}
	}
	if st := owner.node.Stats(); st.OpenConns != 1 || st.Created != 1 {
		t.Fatalf("the owner's connection did not survive its sibling's leaving, or more were made: %+v", st)
	}
}
