package proxy

import (
	"strings"
	"testing"
	"time"
)

// TestAdv69bCloseIdleDuringSweep: CloseIdleConnections closes every spare
// there is when it is called, even while the sweep is looking at them (a
// sweep every millisecond here): with no request running, none is left
// after it.
func TestAdv69bCloseIdleDuringSweep(t *testing.T) {
	for _, mode := range adv69bModes() {
		t.Run(mode.name, func(t *testing.T) {
			release := make(chan struct{})
			defer close(release)
			up, tc := newAdv69bUpstream(t, mode.useTLS, adv69bAnswer(release))
			m := newMemberOpts(t, adv69bSpec, NodeOptions{SweepInterval: time.Millisecond}, func(tr *Transport) { tr.TLSClientConfig = tc })
			adv69bHold(t, m.tr, up.url, 2)
			for i := range 400 {
				if _, body, err := adv69bDo(t, m.tr, "GET", up.url+"/conn", ""); err != nil || !strings.HasPrefix(body, "127.0.0.1:") {
					t.Fatalf("round %d: %q %v", i, body, err)
				}
				m.tr.CloseIdleConnections()
				time.Sleep(3 * time.Millisecond) // any sweep under way has ended
				if n := m.node.spares.len(); n != 0 {
					t.Fatalf("round %d: %d spares left after CloseIdleConnections with no request running", i, n)
				}
			}
		})
	}
}

// TestAdv69bOpenConnsDuringSweep: Stats().OpenConns counts the connections
// owned now, the spares included, while the sweep looks at them: with
// nothing running and nothing unfit, it never changes.
func TestAdv69bOpenConnsDuringSweep(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	up, tc := newAdv69bUpstream(t, true, adv69bAnswer(release))
	m := newMemberOpts(t, adv69bSpec, NodeOptions{SweepInterval: time.Millisecond}, func(tr *Transport) { tr.TLSClientConfig = tc })
	adv69bHold(t, m.tr, up.url, 2)
	if _, _, err := adv69bDo(t, m.tr, "GET", up.url+"/conn", ""); err != nil {
		t.Fatal(err)
	}
	end := time.Now().Add(time.Second)
	for samples := 0; time.Now().Before(end); samples++ {
		if n := m.node.Stats().OpenConns; n != 3 {
			t.Fatalf("sample %d: OpenConns %d; want 3 (2 held, 1 spare) throughout", samples, n)
		}
	}
}
