package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestAdv50InterimOverLimitRefusedThroughSibling: a caller that does not
// look at interim responses (no Got1xxResponse) bounds all the heads of a
// response, interim ones included, by its header limit: net/http's
// Transport refuses 96 KiB of 103s before the final head under a 64 KiB
// MaxResponseHeaderBytes, and so does orbit's local path. Through a
// sibling the owner relays every 1xx (its own trace always has
// Got1xxResponse, so it resets its limit on each), and the sibling bounds
// the relayed heads only by relayedHeadLimit, three times the limit: the
// same upstream bytes that net/http and the local path refuse come back as
// a 200 through a sibling. The limit a caller sets is not the limit it
// gets: a response whose heads are up to ~3x the configured bound is
// accepted, depending only on which process owns the connection.
func TestAdv50InterimOverLimitRefusedThroughSibling(t *testing.T) {
	const head = "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n" // 61 bytes
	const limit = 64 << 10
	burst := strings.Repeat(head, (96<<10)/len(head)) // 96 KiB of 103s, then the final head
	mk := func(t *testing.T, withTLS bool) *adv10Upstream {
		return newAdv10Upstream(t, withTLS, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
			if req.URL.Path != "/hints" {
				return adv10Fresh(c, req, conn, n)
			}
			io.WriteString(c, burst+"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			return true
		})
	}
	do := func(rt http.RoundTripper, url string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		resp, err := rt.RoundTrip(req)
		if err == nil {
			drain(resp)
		}
		return err
	}
	t.Run("net/http", func(t *testing.T) {
		u := mk(t, false)
		ref := u.refTransport(t)
		ref.MaxResponseHeaderBytes = limit
		err := do(ref, u.url("/hints"))
		if err == nil || !strings.Contains(err.Error(), "headers exceeded") {
			t.Fatalf("net/http: %v, want its header limit error", err)
		}
		t.Logf("net/http: %v", err)
	})
	for _, withTLS := range []bool{false, true} {
		for _, remote := range []bool{false, true} {
			name := map[bool]string{false: "plain", true: "tls"}[withTLS] + "/" + map[bool]string{false: "local", true: "remote"}[remote]
			t.Run(name, func(t *testing.T) {
				u := mk(t, withTLS)
				conf := u.conf(func(tr *Transport) { tr.MaxResponseHeaderBytes = limit })
				owner, rt := adv10Members(t, conf, remote)
				warm(t, owner, u.url("/warm"))
				err := do(rt, u.url("/hints"))
				if !errors.Is(err, ErrHeaderTooLarge) {
					t.Errorf("96 KiB of interim heads under a %d-byte header limit, caller not looking at them: %v, want ErrHeaderTooLarge as net/http refuses it", limit, err)
				}
			})
		}
	}
}
