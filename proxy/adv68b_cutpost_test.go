package proxy

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv68bPostAcceptCutInTheField: a long POST (flagBodyOnAccept) whose
// owner's accept is cut inside its waited field, then the stream closes:
// the body is held back (the accept never came whole), so none of it goes
// out, and the failure is as retry-safe as an accept cut in its header.
func TestAdv68bPostAcceptCutInTheField(t *testing.T) {
	full := adv68bAccept(flagAcceptWaited, 5*time.Millisecond)
	body := bytes.Repeat([]byte("b"), 64<<10)
	outcome := func(cut int) (safe bool, bodyBytes int64, err error) {
		sib, own := streamPair(t)
		const lane = 3
		p := oneStream(t, sib, lane)
		defer p.close()
		var got atomic.Int64
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer own.Close()
			br := bufio.NewReader(own)
			if _, err := readFrame(br, reqHeaderLen, decodeRequestFrame); err != nil {
				return
			}
			if _, err := http.ReadRequest(br); err != nil {
				return
			}
			own.Write(full[:cut])
			own.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			n, _ := io.Copy(io.Discard, br)
			got.Store(n)
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		rw := &recordWaits{}
		req, _ := http.NewRequestWithContext(WithWaitWatcher(ctx, rw), "POST", "http://upstream.test/x", bytes.NewReader(body))
		resp, err := p.roundTrip(req, lane, orbitpool.Lease{}, &remoteOpts{}, 1, nil)
		if err == nil {
			resp.Body.Close()
			t.Fatalf("cut at %d: succeeded", cut)
		}
		if rw.ownerWait() != 0 {
			t.Errorf("cut at %d: watcher told %v", cut, rw.ownerWait())
		}
		wg.Wait()
		return IsRetrySafe(err), got.Load(), err
	}
	refSafe, refN, refErr := outcome(5)
	for cut := respHeaderLen; cut < len(full); cut++ {
		safe, n, err := outcome(cut)
		if safe != refSafe || n != refN {
			t.Errorf("cut at %d: retry-safe %v, %d body bytes sent (%v); cut in the header: %v, %d (%v)", cut, safe, n, err, refSafe, refN, refErr)
		}
		if n != 0 {
			t.Errorf("cut at %d: %d body bytes went to an owner whose accept never came whole", cut, n)
		}
	}
	t.Logf("retry-safe %v (%v)", refSafe, refErr)
}
