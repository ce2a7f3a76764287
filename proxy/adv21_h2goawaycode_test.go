package proxy

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// TestAdv21H2GoAwayErrorCodeBelowRunning: three requests run on one
// connection (not its first stream); the upstream sends GOAWAY with an error
// code (ENHANCE_YOUR_CALM, INTERNAL_ERROR) naming the lowest of them as the
// last it processed, answers that one and closes the connection. The two
// left out reached nothing: stock net/http retries them on a new
// connection, and orbit must too.
func TestAdv21H2GoAwayErrorCodeBelowRunning(t *testing.T) {
	for _, code := range []http2.ErrCode{http2.ErrCodeEnhanceYourCalm, http2.ErrCodeInternal} {
		for _, who := range []string{"orbit", "stock"} {
			t.Run(who+"/"+code.String(), func(t *testing.T) {
				var mu sync.Mutex
				var first *rawConn
				var group []*rawStream
				up := newRawH2(t, func(s *rawStream) {
					mu.Lock()
					if first == nil {
						first = s.c
					}
					if s.c != first || s.path != "/h" {
						mu.Unlock()
						s.headers(false, ":status", "200")
						s.data(true, []byte("ok"))
						return
					}
					group = append(group, s)
					if len(group) < 3 {
						mu.Unlock()
						return
					}
					low := group[0]
					for _, g := range group {
						if g.id < low.id {
							low = g
						}
					}
					mu.Unlock()
					low.c.wmu.Lock()
					low.c.fr.WriteGoAway(low.id, code, []byte("calm"))
					low.c.wmu.Unlock()
					low.headers(false, ":status", "200")
					low.data(true, []byte("ok"))
					time.Sleep(20 * time.Millisecond)
					low.c.nc.Close()
				})
				var rt http.RoundTripper
				if who == "orbit" {
					rt = newMemberOpts(t, testSpecLocal, NodeOptions{SweepInterval: time.Hour}, h2cConf).tr
				} else {
					var p http.Protocols
					p.SetUnencryptedHTTP2(true)
					tr := &http.Transport{Protocols: &p}
					defer tr.CloseIdleConnections()
					rt = tr
				}
				if err := adv21Get(rt, context.Background(), up.url+"/"); err != nil {
					t.Fatal(err)
				}
				errs := make(chan error, 3)
				for range 3 {
					go func() {
						ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
						defer cancel()
						errs <- adv21Get(rt, ctx, up.url+"/h")
					}()
				}
				for range 3 {
					if err := <-errs; err != nil {
						t.Errorf("%s, GOAWAY %v: %v", who, code, err)
					}
				}
			})
		}
	}
}
