package proxy

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAdvRefusedSlowDropIsNoRefusal: the upstream reads a GET, works on it
// for 500ms and then closes the new connection without an answer (a worker
// crash, a gateway timeout that drops). That is no "refusal, full": the
// upstream took the request. net/http sends it once.
func TestAdvRefusedSlowDropIsNoRefusal(t *testing.T) {
	up := startAdv2Upstream(t, time.Second)
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond},
		func(tr *Transport) { tr.MaxConnsPerKey = 4 })
	start := time.Now()
	err := getBody(context.Background(), m.tr, up.url+"/slowdrop")
	t.Logf("GET /slowdrop: %v after %v, sent %d times", err, time.Since(start).Round(time.Millisecond), up.count("/slowdrop"))
	if n := up.count("/slowdrop"); n != 1 {
		t.Errorf("a GET the upstream worked on for 500ms and then dropped was sent %d times, want 1", n)
	}
}

// TestAdvRefusedHeldUp: what must not change. An uncapped key, a POST
// without Idempotency-Key, a PUT with GetBody but no key: each is sent
// once. The cap comes back after a storm. A Node closed while requests are
// failing on new connections closes at once.
func TestAdvRefusedHeldUp(t *testing.T) {
	up := startAdv2Upstream(t, time.Second)
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")

	unc := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond}, nil)
	if err := getBody(context.Background(), unc.tr, up.url+"/drop-uncapped"); err == nil {
		t.Fatal("answered")
	}
	if n := up.count("/drop-uncapped"); n != 1 {
		t.Errorf("uncapped: sent %d times", n)
	}

	spec2 := testSpec
	spec2.Path = filepath.Join(t.TempDir(), "seg")
	m := newMemberOpts(t, spec2, NodeOptions{SweepInterval: 50 * time.Millisecond},
		func(tr *Transport) { tr.MaxConnsPerKey = 2 })
	for _, method := range []string{"POST", "PUT", "PATCH", "DELETE"} {
		path := "/drop-" + method
		req, _ := http.NewRequest(method, up.url+path, strings.NewReader("body"))
		if method == "DELETE" {
			req, _ = http.NewRequest(method, up.url+path, nil)
		}
		if _, err := m.tr.RoundTrip(req); err == nil {
			t.Fatal("answered")
		}
		if n := up.count(path); n != 1 {
			t.Errorf("%s without Idempotency-Key on a refused connection: sent %d times", method, n)
		}
	}

	// The cap comes back.
	time.Sleep(400 * time.Millisecond)
	if err := getBody(context.Background(), m.tr, up.url+"/ok"); err != nil {
		t.Errorf("after refusals: %v", err)
	}

	// Close under held units.
	for range 2 {
		go getBody(context.Background(), m.tr, up.url+"/drop-close")
	}
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	m.node.Close()
	if d := time.Since(start); d > time.Second {
		t.Errorf("Node.Close took %v", d)
	}
}
