package proxy

import (
	"io"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/governor"
	"github.com/orbitproxy/orbit/orbitpool"
)

// 8823200 holds an exchange's governor share (exchangeOpts.release) until
// its writer has returned: "a write given up after an early answer still
// holds the copy buffer" (TestAdv63StalledWriterStillCountedByGovernor, on
// HTTP/1.1). The same request on an HTTP/2 upstream: the upstream answers
// 200 and ends its stream before the body is done, x/net's writer stays
// blocked in the caller's body with its frame buffer, and useH2 gives the
// worker back (onDone) as soon as the response body ends.
func TestAdv64H2StalledWriterStillCountedByGovernor(t *testing.T) {
	u := newRawH2(t, func(s *rawStream) {
		if s.method == "POST" {
			s.headers(false, ":status", "200")
			s.data(true, []byte("ok"))
			return
		}
		s.headers(false, ":status", "200", "content-length", "2")
		s.data(true, []byte("ok"))
	})
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	gov := governor.New(16, 1<<30)
	m := newMemberPoolOpts(t, spec, orbitpool.Options{}, NodeOptions{Governor: gov}, h2cConf)
	body := &adv63StallBody{left: 16 << 10, done: make(chan struct{})}
	var once sync.Once
	release := func() { once.Do(func() { close(body.done) }) }
	defer release()
	req, _ := http.NewRequest("POST", u.url+"/early/upload", body)
	req.ContentLength = 2 << 20
	resp, err := m.tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	// x/net's Close waits for its writer: closed once the body ends.
	defer func() {
		release()
		resp.Body.Close()
	}()
	if resp.StatusCode != 200 || string(b) != "ok" || resp.ProtoMajor != 2 {
		t.Fatalf("POST: %s %d %q, want HTTP/2 200 ok", resp.Proto, resp.StatusCode, b)
	}
	time.Sleep(4 * maxWriteWait)
	if !body.reading.Load() {
		t.Fatal("x/net's writer is not blocked in the body: the test's premise does not hold")
	}
	if n := gov.Outstanding(); n == 0 {
		t.Fatalf("x/net's writer still runs, blocked in the body, yet the governor has %d workers outstanding; want the exchange's worker held until its writer returns, as on HTTP/1.1 since 8823200", n)
	}
	// And given back once the body ends: nothing is held for good.
	release()
	for start := time.Now(); gov.Outstanding() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("the governor still has %d workers outstanding 5s after the body ended", gov.Outstanding())
		}
	}
}
