package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestAdv48BodyReadErrorKeptAsNetHTTP: a request body whose Read fails is
// the request's own failure, which 3d44e61 now reports at once "so the
// caller gets that error". net/http's transport hands the caller the body's
// error itself (it unwraps Request.Write's requestBodyReadError), so a
// caller can tell it: Caddy's request_body max_size wraps the body in
// http.MaxBytesReader, and reverse_proxy answers the client 413 through
// caddyhttp.Error's errors.As when the transport returns the body's
// *http.MaxBytesError (or the HandlerError around it). Orbit wraps
// Request.Write's unexported requestBodyReadError, which has no Unwrap, in
// "upstream connection broken": the caller sees an upstream failure (502,
// counted against the upstream) for a client that sent too much, on the
// owner's own exchanges and a sibling's, with a body streamed chunked or one
// of declared length past what is read ahead. (A short declared body,
// read ahead before any connection, does keep the error: orbit is not even
// consistent with itself.)
func TestAdv48BodyReadErrorKeptAsNetHTTP(t *testing.T) {
	up := discardUpstream(t)
	owner, client := remotePair(t, nil)
	const limit = 64 << 10
	for _, cl := range []int64{-1, 100000} {
		for _, name := range []string{"net/http", "owner", "sibling"} {
			warm(t, owner, up.URL+"/warm")
			rt := map[string]http.RoundTripper{"net/http": http.DefaultTransport, "owner": owner.tr, "sibling": client.tr}[name]
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			req, _ := http.NewRequestWithContext(ctx, "POST", up.URL+"/upload", nil)
			req.Body = http.MaxBytesReader(nil, io.NopCloser(strings.NewReader(strings.Repeat("a", 100000))), limit)
			req.ContentLength = cl
			before := client.node.Stats().ReusedRemote
			resp, err := rt.RoundTrip(req)
			cancel()
			if resp != nil {
				drain(resp)
			}
			if name == "sibling" && client.node.Stats().ReusedRemote == before {
				t.Fatalf("not through the owner (%+v)", client.node.Stats())
			}
			var mbe *http.MaxBytesError
			if !errors.As(err, &mbe) {
				t.Errorf("%s, length %d: error %v; want the body's *http.MaxBytesError, as net/http returns it", name, cl, err)
			}
		}
	}
}
