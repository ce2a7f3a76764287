package scenario

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/integration/upstream"
)

// TestPeersHoldTheCap: the demo sets nginx and HAProxy beside orbit with
// the same cap on upstream connections, and the comparison means something
// only if each peer's configuration does cap them, as far as it can. Here
// the upstream enforces no cap of its own, so that what it sees open is what
// the peer allows. Neither peer holds the cap across its workers exactly:
// nginx's max_conns counts per worker, and HAProxy's maxconn counts requests
// in progress, its idle connections kept per thread on top. Both stay within
// a cap per worker (nginx reaches it), where without their caps they open a
// connection per client. CI installs both (.ci/run, which sets
// ORBIT_PEERS=require); elsewhere a peer that is not on PATH is left out.
func TestPeersHoldTheCap(t *testing.T) {
	peers := Peers()
	if os.Getenv("ORBIT_PEERS") == "require" && len(peers) != 2 {
		t.Fatalf("nginx and haproxy must both be on PATH; found %v", peers)
	}
	if len(peers) == 0 {
		t.Skip("neither nginx nor haproxy is on PATH")
	}
	const limit = 4
	s := Scenario{Name: "capped", Upstream: upstream.Options{Delay: 2 * time.Millisecond}, MaxConns: limit, Duration: shortLoad, Conns: shortConns}
	for _, v := range peers {
		t.Run(string(v), func(t *testing.T) {
			r := &Runner{Workers: shortWorkers, Dir: shortTempDir(t)}
			row, err := r.Run(context.Background(), s, v)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d requests, %d served, peak %d upstream connections, %d opened, errors: %s",
				row.Load.Requests, row.Load.OK, row.Upstream.Peak, row.Upstream.Accepted, row.Load.ErrorSummary())
			if row.Load.OK == 0 {
				t.Fatalf("no request served: %s", row.Load.ErrorSummary())
			}
			if most := int64(limit * shortWorkers); row.Upstream.Peak > most {
				t.Errorf("%d connections open at the upstream at once under a cap of %d in each of %d workers", row.Upstream.Peak, limit, shortWorkers)
			}
		})
	}
}
