//go:build go1.27 && !http2legacy

package proxy

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/internal/h2frame"
)

// TestH2GateWaitLeavesNoLinger: a request whose context ends while it waits
// at the send gate (h2conn.roundTrip) fails with its context's error, and
// leaves its connection as it found it: it never reached the ClientConn, so
// it left no reset stream there, and the connection, with a stream still
// running, is not marked as possibly lingering (which made a later request
// offered it full at its limit wait to settle).
func TestH2GateWaitLeavesNoLinger(t *testing.T) {
	up := h2frame.New(t, 8, 0)
	m := newMember(t, testSpecLocal, h2cConf)
	if err := getOK(m, context.Background(), up.URL+"/"); err != nil {
		t.Fatal(err)
	}
	hc := installedH2(t, m)
	held := make(chan error, 1)
	go func() { held <- getOK(m, context.Background(), up.URL+"/hold") }()
	waitFor(t, 5*time.Second, "the held stream to run", func() bool { return hc.active.Load() == 1 })
	if hc.lingering.Load() {
		t.Fatal("lingering set with one stream running")
	}
	hc.sending <- struct{}{} // as a request in the ClientConn, its headers not yet written
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := getOK(m, ctx, up.URL+"/")
	<-hc.sending
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("request held at the gate past its deadline: %v, want its context's error", err)
	}
	if hc.lingering.Load() {
		t.Error("a request that never passed the gate marked its connection lingering")
	}
	close(up.Release)
	if err := <-held; err != nil {
		t.Errorf("held request: %v", err)
	}
	if err := getOK(m, context.Background(), up.URL+"/"); err != nil {
		t.Errorf("request after the gate opened: %v", err)
	}
}
