package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// adv48CloseErrBody reads its bytes, then fails its Close with err.
type adv48CloseErrBody struct {
	io.Reader
	err error
}

func (b *adv48CloseErrBody) Close() error { return b.err }

// TestAdv48CloseErrorNotOwnerGone: a request body that reads to its end and
// then fails its Close with an I/O error (io.ErrUnexpectedEOF: a body over a
// stream that reports the stream cut at its close). Request.Write returns
// Close's error as it is (only Read errors are wrapped), and net/http's
// transport fails the request with it, sent once. Through a sibling, 3d44e61
// takes it for the request's own failure and aborts at once, with
// writeError's verdict for the unix leg: an I/O error there is "owner
// process gone", idleClosed. So a live owner is reported gone (its lane's
// idle streams dropped, the pool reconciled), and a replayable request (an
// Idempotency-Key) is sent again, though the first went upstream with all
// of its body: the upstream runs it twice, and the caller whose body failed
// gets 200.
func TestAdv48CloseErrorNotOwnerGone(t *testing.T) {
	// Hits by path, one path a request: a request whose RoundTrip failed
	// may reach the upstream's handler after it returned, and must not
	// count as the next request's.
	var mu sync.Mutex
	hits := map[string]int{}
	hitsOf := func(path string) int { mu.Lock(); defer mu.Unlock(); return hits[path] }
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits[r.URL.Path]++
		mu.Unlock()
		io.Copy(io.Discard, r.Body)
	}))
	defer up.Close()
	var paths []string
	for _, size := range []int{10, 100000} {
		for _, key := range []bool{false, true} {
			for _, name := range []string{"net/http", "sibling"} {
				// A pair of its own for each: a request sent again
				// may leave the sibling with a connection of its own.
				owner, client := remotePair(t, nil)
				warm(t, owner, up.URL+"/warm")
				rt := map[string]http.RoundTripper{"net/http": http.DefaultTransport, "sibling": client.tr}[name]
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				path := fmt.Sprintf("/x/%s/%d/%v", strings.ReplaceAll(name, "/", ""), size, key)
				paths = append(paths, path)
				req, _ := http.NewRequestWithContext(ctx, "PUT", up.URL+path, nil)
				if key {
					req.Header.Set("Idempotency-Key", "k")
				}
				body := strings.Repeat("a", size)
				req.Body = &adv48CloseErrBody{Reader: strings.NewReader(body), err: io.ErrUnexpectedEOF}
				req.ContentLength = -1
				req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(body)), nil }
				before := client.node.Stats().ReusedRemote
				resp, err := rt.RoundTrip(req)
				cancel()
				st := 0
				if resp != nil {
					st = resp.StatusCode
					drain(resp)
				}
				if name == "sibling" && client.node.Stats().ReusedRemote == before {
					t.Fatalf("not through the owner (%+v)", client.node.Stats())
				}
				if n := hitsOf(path); err == nil || errors.Is(err, ErrOwnerGone) || n > 1 {
					t.Errorf("%s, body of %d, idempotency key %v: status %d, error %v, upstream ran it %d times; want the body's failure, sent once, the owner not gone",
						name, size, key, st, err, n)
				}
			}
		}
	}
	// A request sent twice may reach the upstream late: none did.
	time.Sleep(200 * time.Millisecond)
	for _, path := range paths {
		if n := hitsOf(path); n > 1 {
			t.Errorf("%s: the upstream ran it %d times", path, n)
		}
	}
}
