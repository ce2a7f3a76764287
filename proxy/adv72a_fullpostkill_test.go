package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv72aFullTablePostSurvivesSiblingDeath: the consequence of the POST
// relayed on a full table (see TestAdv72aUnreplayablePostOnFullTableNotRelayed).
// Uncapped, relay_unreplayable off, the client's one slot holds an idle
// connection to another upstream. Its POST must be carried on a connection
// of its own (README: "Without a cap, then, a worker's death fails none of
// its siblings' POSTs, as with the stock transport"), so the owner's death
// while the upstream is answering must not fail it.
func TestAdv72aFullTablePostSurvivesSiblingDeath(t *testing.T) {
	var first atomic.Bool
	arrived, release := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/hang" && first.CompareAndSwap(false, true) {
			close(arrived)
			select {
			case <-release:
			case <-time.After(300 * time.Millisecond):
			}
		}
		io.WriteString(w, "answered "+r.URL.Path)
	}))
	defer srv.Close()
	defer close(release)
	other := discardUpstream(t)
	spec := orbitpool.PoolSpec{Lanes: 2, Keys: 32, ResourcesPerLane: 1, Path: filepath.Join(t.TempDir(), "seg")}
	owner, client := newMember(t, spec, nil), newMember(t, spec, nil)
	if _, _, err := adv10Do(t, client.tr, "GET", other.URL, nil); err != nil {
		t.Fatal(err)
	}
	warm(t, owner, srv.URL+"/warm")

	done := roundTripAsync(client.tr, "POST", srv.URL+"/hang", strings.NewReader("payload"))
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the POST never reached the upstream")
	}
	owner.dieAsKilled()

	r := <-done
	if r.err != nil || r.body != "answered /hang" {
		t.Fatalf("uncapped POST failed by a sibling's death: %q, %v (client stats %+v)", r.body, r.err, client.node.Stats())
	}
}
