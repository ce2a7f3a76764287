package proxy

import (
	"crypto/tls"
	"path/filepath"
	"testing"
	"time"

	countingupstream "github.com/orbitproxy/orbit/integration/upstream"
)

// TestAdv2RefusedTLSUpstream is TestRefusedConnectionWaitsForTheUpstreamsRoom
// with an HTTPS upstream: the same cap of 2, the same abandoned requests,
// the same four waiters. An HTTPS upstream at its cap closes a connection
// past it as it accepts it too, before the TLS handshake ends: the refusal
// is a dial (handshake) error, not a read error, so readError's refusal
// check never sees it. Does the hold still happen, and are the waiters
// served without a storm of refusals?
func TestAdv2RefusedTLSUpstream(t *testing.T) {
	const limit = 2
	up := startCappedUpstream(t, countingupstream.Options{MaxConns: limit, Delay: 1500 * time.Millisecond, TLS: true})
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond, FailedCloseWait: 300 * time.Millisecond},
		func(tr *Transport) {
			tr.MaxConnsPerKey = limit
			tr.TLSClientConfig = &tls.Config{RootCAs: up.CertPool}
		})

	abandonWhileWaiting(t, m, m, up, limit)
	st := up.Stats()
	t.Logf("round 1: upstream refused %d, peak %d; UpstreamRefused=%d", st.Refused, st.Peak, m.node.Stats().UpstreamRefused)
	if st.Peak > limit || st.Refused > limit {
		t.Errorf("the upstream saw %d connections at once and refused %d, cap %d: want at most one refusal per connection closed before it let go", st.Peak, st.Refused, limit)
	}
	abandonWhileWaiting(t, m, m, up, limit)
	again := up.Stats()
	t.Logf("round 2: upstream refused %d more, peak %d; UpstreamRefused=%d", again.Refused-st.Refused, again.Peak, m.node.Stats().UpstreamRefused)
	if again.Refused != st.Refused {
		t.Errorf("second round: the upstream refused %d more connections (it has refused before: enforcing)", again.Refused-st.Refused)
	}
}

// TestAdv2RefusedH2CUpstream: the same with an h2c upstream (prior
// knowledge) at a cap of 2 connections.
func TestAdv2RefusedH2CUpstream(t *testing.T) {
	const limit = 2
	up := startCappedUpstream(t, countingupstream.Options{MaxConns: limit, Delay: 1500 * time.Millisecond, H2C: true, MaxStreams: 1})
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond, FailedCloseWait: 300 * time.Millisecond},
		func(tr *Transport) {
			tr.MaxConnsPerKey = limit
			tr.H2C = true
		})
	abandonWhileWaiting(t, m, m, up, limit)
	st := up.Stats()
	t.Logf("round 1: upstream refused %d, peak %d; UpstreamRefused=%d", st.Refused, st.Peak, m.node.Stats().UpstreamRefused)
	if st.Peak > limit || st.Refused > limit {
		t.Errorf("the upstream saw %d connections at once and refused %d, cap %d", st.Peak, st.Refused, limit)
	}
}
