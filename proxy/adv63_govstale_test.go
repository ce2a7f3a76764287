package proxy

import (
	"io"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/governor"
	"github.com/orbitproxy/orbit/orbitpool"
)

// adv63StallBody gives 64 KiB at once, then blocks in Read until closed.
type adv63StallBody struct {
	left    int
	reading atomic.Bool
	done    chan struct{}
}

func (b *adv63StallBody) Read(p []byte) (int, error) {
	if b.left > 0 {
		n := min(len(p), b.left)
		b.left -= n
		return n, nil
	}
	b.reading.Store(true)
	<-b.done
	b.reading.Store(false)
	return 0, io.EOF
}

func (b *adv63StallBody) Close() error { return nil }

// NodeOptions.Governor: "every exchange ... holds a worker and its buffers'
// memory for as long as it runs". After an early answer, finishRead's timer
// now finishes the write's part at maxWriteWait while the writer still runs:
// blocked in the caller's body, inside countWriter.ReadFrom, holding a copy
// buffer of the exchange's 8 exchange buffers (256 KiB). The governor gets
// the worker and those buffers back at once: the memory the stalled writer
// holds is no longer counted, and any number of such writers can pile up
// while the governor reports nothing outstanding.
func TestAdv63StalledWriterStillCountedByGovernor(t *testing.T) {
	url := earlyRefusalUpstream(t)
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	gov := governor.New(16, 1<<30)
	m := newMemberPoolOpts(t, spec, orbitpool.Options{}, NodeOptions{Governor: gov}, nil)
	body := &adv63StallBody{left: 64 << 10, done: make(chan struct{})}
	defer close(body.done)
	req, _ := http.NewRequest("POST", url+"/upload", body)
	req.ContentLength = 2 << 20 // eight exchange buffers
	resp, err := m.tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	drain(resp)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("POST: status %d, want 401", resp.StatusCode)
	}
	time.Sleep(4 * maxWriteWait)
	if !body.reading.Load() {
		t.Skip("the writer is not blocked in the body")
	}
	if n := gov.Outstanding(); n == 0 {
		t.Fatalf("the POST's writer still runs, blocked in the body with its copy buffer, yet the governor has %d workers outstanding; want the exchange's worker and buffers held until its writer returns", n)
	}
}
