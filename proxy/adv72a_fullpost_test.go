package proxy

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// adv72aPost sends a POST with a small body (not replayable: no GetBody, no
// Idempotency-Key) and reads the answer.
func adv72aPost(t *testing.T, rt http.RoundTripper, url string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", url, io.NopCloser(strings.NewReader("payload")))
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = int64(len("payload"))
	if isReplayable(req) {
		t.Fatal("test request is replayable")
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return err
}

// TestAdv72aUnreplayablePostOnFullTableNotRelayed: README: "A request that
// could not be sent again ... goes through a sibling only when
// max_conns_per_host or max_dialing_per_host leaves no dial, or the dial
// fails. Without a cap, then, a worker's death fails none of its siblings'
// POSTs". Uncapped, no relay_unreplayable, the client's table is full (one
// slot, holding an idle connection to another upstream): before the change
// under review, the POST evicted that idle connection (or went unpooled) and
// dialed; the same under a cap that leaves room for the dial (README:
// only the cap or max_dialing leaving no dial relays a POST); now its ErrFull takes the LocalFirst fallback and relays the POST
// through the owner, whose death would fail it.
func TestAdv72aUnreplayablePostOnFullTableNotRelayed(t *testing.T) {
	for _, tc := range []struct {
		name   string
		busy   bool
		capped bool
	}{
		{name: "idle-other"},
		{name: "no-idle-to-evict", busy: true},
		{name: "capped-idle-other", capped: true},
	} {
		busy := tc.busy
		t.Run(tc.name, func(t *testing.T) {
			spec := orbitpool.PoolSpec{Lanes: 2, Keys: 32, ResourcesPerLane: 1, Path: filepath.Join(t.TempDir(), "seg")}
			conf := func(tr *Transport) {
				if tc.capped {
					// The cap (4) leaves room for a dial: only the
					// table is full.
					tr.MaxConnsPerKey = 4
				}
			}
			owner, client := newMember(t, spec, conf), newMember(t, spec, conf)
			up := discardUpstream(t)
			hold := make(chan struct{})
			entered := make(chan struct{}, 1)
			other := discardUpstream(t)
			if busy {
				other.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					select {
					case entered <- struct{}{}:
					default:
					}
					<-hold
				})
			}
			done := make(chan error, 1)
			if busy {
				go func() {
					_, _, err := adv10Do(t, client.tr, "GET", other.URL, nil)
					done <- err
				}()
				<-entered
			} else {
				if _, _, err := adv10Do(t, client.tr, "GET", other.URL, nil); err != nil {
					t.Fatal(err)
				}
			}
			warm(t, owner, up.URL)
			if err := adv72aPost(t, client.tr, up.URL); err != nil {
				t.Fatalf("POST: %v", err)
			}
			st := client.node.Stats()
			close(hold)
			if busy {
				if err := <-done; err != nil {
					t.Fatalf("held GET: %v", err)
				}
			}
			if st.ReusedRemote != 0 {
				t.Fatalf("unreplayable POST on a full table was relayed through a sibling (ReusedRemote=%d, Evicted=%d, Unpooled=%d, Created=%d)", st.ReusedRemote, st.Evicted, st.Unpooled, st.Created)
			}
		})
	}
}
