package proxy

import (
	"crypto/tls"
	"net/http"
	"sync"
	"testing"
)

// TestAdv69bUnpooledDialPanic: a panic out of an unpooled dial (a
// TLSClientConfig callback) reaches the caller and leaves the counts as
// they were: no connection counted, none dialing, no spare; the next
// request outside the table is served.
func TestAdv69bUnpooledDialPanic(t *testing.T) {
	release := make(chan struct{})
	relOnce := sync.OnceFunc(func() { close(release) })
	defer relOnce()
	ts, tc0 := adv68cTLSH1(t, release)
	var mu sync.Mutex
	panicking := false
	tc := &tls.Config{RootCAs: tc0.RootCAs, VerifyConnection: func(tls.ConnectionState) error {
		mu.Lock()
		p := panicking
		mu.Unlock()
		if p {
			panic("adv69b verify")
		}
		return nil
	}}
	m := newMember(t, adv69bSpec, func(tr *Transport) { tr.TLSClientConfig = tc })
	holdStreams(t, m, ts.URL, 2)
	mu.Lock()
	panicking = true
	mu.Unlock()
	for range 3 {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("no panic out of the dial")
				}
			}()
			req, _ := http.NewRequest("GET", ts.URL+"/x", nil)
			m.tr.RoundTrip(req)
		}()
	}
	if o, d, sp := m.node.open.Load(), m.node.dialing.Load(), m.node.spares.len(); o != 2 || d != 0 || sp != 0 {
		t.Fatalf("after panicking dials: open %d dialing %d spares %d; want 2, 0, 0", o, d, sp)
	}
	mu.Lock()
	panicking = false
	mu.Unlock()
	if _, body, err := adv10Do(t, m.tr, "GET", ts.URL+"/x", nil); err != nil || body != "ok" {
		t.Fatalf("after the panics: %q %v", body, err)
	}
	assertAdv69bOpen(t, m, 2)
}
