package proxy

import (
	"context"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// adv16AlwaysCreate dials for every request: the test's other traffic, which
// keeps making new connections to the upstream.
type adv16AlwaysCreate struct{}

func (adv16AlwaysCreate) Decide(*orbitpool.View) orbitpool.Decision {
	return orbitpool.Decision{Action: orbitpool.ActionCreate}
}

// TestAdv16ReviewGoAwayChurnRetriesBounded: an upstream GOAWAYs every
// connection right after its first stream (a server that serves one stream
// per connection, or one restarting over and over), while other requests of
// the process keep dialing new connections to it. Each time the request is
// sent, it lands on a pooled connection it has not met before, whose GOAWAY
// leaves its stream out (retry-safe, connGone): "once per connection" makes
// every such retry free, so the request is sent again for as long as the
// churn lasts, bounded by neither MaxRetries nor anything else but its
// context (none here, as for a Caddy request without a deadline). Stock
// net/http's HTTP/2 client gives up on these after 6 retries. The same
// holds for a sibling's request on the owner's connections (flagConnGone,
// once per lease's ResourceID). The upstream stops refusing after churn
// refusals, so the test ends either way.
func TestAdv16ReviewGoAwayChurnRetriesBounded(t *testing.T) {
	t.Run("local", func(t *testing.T) { goAwayChurn(t, false) })
	t.Run("sibling", func(t *testing.T) { goAwayChurn(t, true) })
}

func goAwayChurn(t *testing.T, sibling bool) {
	const churn = 50
	const maxRetries = 3
	var helper *Transport
	var up *rawH2
	var refused, sent atomic.Int64
	helperErr := make(chan error, churn+1)
	up = newRawH2(t, func(s *rawStream) {
		if s.path == "/r" {
			sent.Add(1)
		}
		if s.path != "/r" || s.id == 1 || refused.Load() >= churn {
			s.headers(false, ":status", "200")
			s.data(true, []byte("ok"))
			return
		}
		refused.Add(1)
		// Other traffic makes a new connection (and uses it once)
		// before this one's GOAWAY is out.
		helperErr <- getOK(&member{tr: helper}, context.Background(), up.url+"/h")
		s.goAway(s.id - 2)
	})
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	conf := func(tr *Transport) {
		tr.H2C = true
		tr.MaxRetries = maxRetries
	}
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: time.Hour}, conf)
	client := m
	if sibling {
		client = newMemberOpts(t, spec, NodeOptions{SweepInterval: time.Hour}, conf)
	}
	helper = &Transport{Node: m.node, H2C: true, Policy: adv16AlwaysCreate{}}
	if mustKey(t, helper, up.url) != mustKey(t, m.tr, up.url) {
		t.Fatal("the helper's requests go to another key")
	}
	if err := getOK(&member{tr: helper}, context.Background(), up.url+"/h"); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/r", nil)
	before := client.node.Stats().ReusedRemote
	resp, err := client.tr.RoundTrip(req)
	if err == nil {
		drain(resp)
	}
	close(helperErr)
	for herr := range helperErr {
		if herr != nil {
			t.Fatalf("the other traffic's request failed: %v", herr)
		}
	}
	if sibling && client.node.Stats().ReusedRemote-before < 2 {
		t.Fatalf("the sibling's request went through the owner %d time(s); want it refused on several of the owner's connections, or the test shows nothing",
			client.node.Stats().ReusedRemote-before)
	}
	// However free retries are counted, one request is sent a bounded
	// number of times, well under the churn.
	if n := sent.Load(); n > 20 {
		t.Fatalf("one request (MaxRetries %d) was sent %d times to an upstream that GOAWAYed each connection after its first stream (err %v)",
			maxRetries, n, err)
	}
}
