package caddymodule

import (
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"
)

// TestAdv68ClientCancelReachesUpstream: a client that gives up on a slow
// request cancels the upstream's work: the proxy closes the upstream
// connection, and the upstream's request context ends, soon after the
// client leaves, through either transport (long polls and expensive
// handlers rely on it).
func TestAdv68ClientCancelReachesUpstream(t *testing.T) {
	canceled := make(chan time.Duration, 16)
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		select {
		case <-r.Context().Done():
			canceled <- time.Since(start)
		case <-time.After(4 * time.Second):
			canceled <- -1
			io.WriteString(w, "late")
		}
	}), false)
	stock, orbit := adv8Sites(t, up.hostport(), "", "")
	for _, v := range bothSites(stock, orbit) {
		t.Run(v.name, func(t *testing.T) {
			for round := 0; round < 2; round++ {
				c := &http.Client{Timeout: 200 * time.Millisecond}
				if _, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/poll", v.port)); err == nil {
					t.Fatal("the slow request did not time out")
				}
				select {
				case d := <-canceled:
					if d < 0 || d > time.Second {
						t.Errorf("round %d: the upstream's request ran on after the client left (%v)", round, d)
					}
				case <-time.After(6 * time.Second):
					t.Fatal("upstream handler never ended")
				}
			}
		})
	}
}
