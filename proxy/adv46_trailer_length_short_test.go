package proxy

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestAdv46KnownLengthTrailersShortBodyNotOwnerGone: a request that declares
// Content-Length 10, has trailers, and whose body ends after 3 bytes.
// net/http fails it "ContentLength=10 with Body length 3", and so does the
// owner's own exchange; through a sibling without trailers the caller's own
// writer says the same. With trailers the caller sends the body chunked and
// the length in the frame (flagLength); the owner finds the body short, and
// closes the stream with no word: the caller reports the owner process gone
// (ErrOwnerGone), for an owner that is alive, and on a fresh stream marks
// it down.
func TestAdv46KnownLengthTrailersShortBodyNotOwnerGone(t *testing.T) {
	up := discardUpstream(t)
	owner, client := remotePair(t, nil)
	for _, withTrailers := range []bool{false, true} {
		warm(t, owner, up.URL+"/warm") // the failure before broke its connection
		before := client.node.Stats().ReusedRemote
		req, _ := http.NewRequest("POST", up.URL+"/short", nil)
		req.Body = io.NopCloser(strings.NewReader("abc"))
		req.ContentLength = 10
		if withTrailers {
			req.Trailer = http.Header{"X-T": {"t"}}
		}
		resp, err := client.tr.RoundTrip(req)
		if resp != nil {
			resp.Body.Close()
			t.Fatalf("trailers %v: a response to a short body", withTrailers)
		}
		t.Logf("trailers %v: %v (%+v)", withTrailers, err, client.node.Stats())
		if client.node.Stats().ReusedRemote == before {
			t.Fatalf("trailers %v: the sibling's request did not go through the owner (%+v)", withTrailers, client.node.Stats())
		}
		if errors.Is(err, ErrOwnerGone) {
			t.Errorf("trailers %v: %v; the owner is not gone (the body was short)", withTrailers, err)
		}
		if err == nil || !strings.Contains(err.Error(), "ContentLength=10 with Body length 3") {
			t.Errorf("trailers %v: %v; want net/http's ContentLength=10 with Body length 3", withTrailers, err)
		}
	}
}
