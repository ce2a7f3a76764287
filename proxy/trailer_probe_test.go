package proxy

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// timedBody gives, each after its delay, data, then the end; with eofWithData
// the end comes with the last data, in the same Read.
type timedBody struct {
	delay       time.Duration
	data        []string
	eofWithData bool
}

func (b *timedBody) Read(p []byte) (int, error) {
	time.Sleep(b.delay)
	if len(b.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p, b.data[0])
	b.data = b.data[1:]
	if b.eofWithData && len(b.data) == 0 {
		return n, io.EOF
	}
	return n, nil
}

// framingRecorder runs an HTTP/1.1 upstream that records, under the value of
// each request's query parameter k, its framing, body and trailers as the
// upstream read them; seen returns what it recorded under a key.
func framingRecorder(t *testing.T) (up *httptest.Server, seen func(key string) string) {
	var mu sync.Mutex
	rec := map[string]string{}
	up = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if key := r.URL.Query().Get("k"); key != "" {
			mu.Lock()
			rec[key] = fmt.Sprintf("TE=%q CL=%d body=%q trailer=%q", r.TransferEncoding, r.ContentLength, b, r.Trailer)
			mu.Unlock()
		}
	}))
	t.Cleanup(up.Close)
	return up, func(key string) string {
		mu.Lock()
		defer mu.Unlock()
		return rec[key]
	}
}

// TestProbedBodyTrailersLikeNetHTTP: a GET with a body of unknown length and
// trailers, whose body net/http's Request.Write probes on a goroutine of
// its own, and a POST, whose body it does not: whether the body is empty or
// not, ends in the probe's 200ms or past it, alone or with the last data,
// the upstream sees the same framing, body and trailers through a sibling
// as through net/http. Run with -race: the trailers must be set on the
// writer's side only.
func TestProbedBodyTrailersLikeNetHTTP(t *testing.T) {
	up, seen := framingRecorder(t)
	owner, client := remotePair(t, nil)
	warm(t, owner, up.URL+"/warm")

	cases := map[string]func() *timedBody{
		"empty":         func() *timedBody { return &timedBody{} },
		"empty-late":    func() *timedBody { return &timedBody{delay: 250 * time.Millisecond} },
		"data":          func() *timedBody { return &timedBody{data: []string{"ab", "c"}} },
		"data-late":     func() *timedBody { return &timedBody{delay: 250 * time.Millisecond, data: []string{"ab"}} },
		"data-with-eof": func() *timedBody { return &timedBody{data: []string{"a"}, eofWithData: true} },
		"data-late-with-eof": func() *timedBody {
			return &timedBody{delay: 250 * time.Millisecond, data: []string{"a"}, eofWithData: true}
		},
	}
	for c, body := range cases {
		for _, method := range []string{"GET", "POST"} {
			name := method + "-" + c
			for _, path := range []string{"net/http", "sibling"} {
				rt := map[string]http.RoundTripper{"net/http": http.DefaultTransport, "sibling": client.tr}[path]
				req, _ := http.NewRequest(method, up.URL+"/?k="+name+"-"+path, nil)
				req.Body = io.NopCloser(body())
				req.ContentLength = 0 // unknown, with a body: a GET's is probed
				// Set before the request goes: set as the body ends,
				// net/http's own probe would race the caller's write.
				req.Trailer = http.Header{"X-T": {" v "}}
				if o := roundTripOutcome(rt, req); o.err != "" || o.status != 200 {
					t.Fatalf("%s through %s: %+v", name, path, o)
				}
			}
			if got, want := seen(name+"-sibling"), seen(name+"-net/http"); got != want {
				t.Errorf("%s: the upstream saw %s through the sibling; %s through net/http", name, got, want)
			}
		}
	}
	if n := client.node.Stats().ReusedRemote; n < uint64(2*len(cases)) {
		t.Errorf("%d requests went through the owner; want %d (%+v)", n, 2*len(cases), client.node.Stats())
	}
}
