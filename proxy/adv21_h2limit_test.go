package proxy

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/internal/h2frame"
)

// TestAdv21H2LimitLoweredBelowHeldStreams: two long-held streams on the one
// connection, then the upstream lowers its stream limit from 4 to 1 (below
// the streams running). A new request must not wait for a held stream:
// stock net/http dials another connection and completes at once; orbit must
// complete it within a second too, and no connection may carry more streams
// than the limit the client acknowledged. The upstream then raises the limit
// back to 4 and a burst of 4 completes.
func TestAdv21H2LimitLoweredBelowHeldStreams(t *testing.T) {
	for _, who := range []string{"orbit", "stock"} {
		t.Run(who, func(t *testing.T) {
			up := h2frame.New(t, 4, time.Millisecond)
			up.ResetsOK = true
			var rt http.RoundTripper
			if who == "orbit" {
				m := newMemberOpts(t, testSpecLocal, NodeOptions{SweepInterval: time.Hour}, h2cConf)
				rt = m.tr
			} else {
				var p http.Protocols
				p.SetUnencryptedHTTP2(true)
				tr := &http.Transport{Protocols: &p}
				defer tr.CloseIdleConnections()
				rt = tr
			}
			if err := adv21Get(rt, context.Background(), up.URL+"/"); err != nil {
				t.Fatal(err)
			}
			hctx, hcancel := context.WithCancel(context.Background())
			defer hcancel()
			for range 2 {
				req, _ := http.NewRequestWithContext(hctx, "GET", up.URL+"/hold", nil)
				resp, err := rt.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
			}
			up.SetLimit(1)
			time.Sleep(50 * time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			start := time.Now()
			err := adv21Get(rt, ctx, up.URL+"/")
			cancel()
			if err != nil {
				t.Errorf("%s: a request after the limit went below the held streams: %v after %v", who, err, time.Since(start))
			}
			up.SetLimit(4)
			time.Sleep(50 * time.Millisecond)
			errs := make(chan error, 4)
			for range 4 {
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					defer cancel()
					errs <- adv21Get(rt, ctx, up.URL+"/")
				}()
			}
			for range 4 {
				if err := <-errs; err != nil {
					t.Errorf("%s: after the limit went back up: %v", who, err)
				}
			}
			conns, served, _, viol := up.Stats()
			t.Logf("%s: h2Wrapped=%v conns=%d served=%d", who, h2Wrapped, conns, served)
			if len(viol) > 0 {
				t.Errorf("%s: the upstream saw its limit exceeded: %v", who, viol)
			}
		})
	}
}
