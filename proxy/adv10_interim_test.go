package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"testing"
	"time"
)

// TestAdv10InterimFloodBoundedThroughSibling: an HTTP/1.1 upstream that
// answers with interim responses without end. A caller that does not look
// at them is bounded by its header limit, as with net/http, on the local
// path and through a sibling (whose owner bounds them so over HTTP/1.1, told
// by flagNoInterim, and relays each one over HTTP/2): the request fails with ErrHeaderTooLarge
// well before its deadline, wherever in a head the limit falls (net/http
// reports its limit whatever parse error the cut head gives), the flooding
// connection leaves the pool, and the next request gets its own answer.
func TestAdv10InterimFloodBoundedThroughSibling(t *testing.T) {
	const head = "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n" // 61 bytes
	mk := func(t *testing.T, withTLS bool) *adv10Upstream {
		return newAdv10Upstream(t, withTLS, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
			if req.URL.Path != "/flood" {
				return adv10Fresh(c, req, conn, n)
			}
			for {
				c.SetWriteDeadline(time.Now().Add(3 * time.Second))
				if _, err := io.WriteString(c, strings.Repeat(head, 64)); err != nil {
					return false
				}
			}
		})
	}
	// Limits that cut a status line after "HTTP": on the local path
	// (61-byte heads), and through a sibling, where the accept frame (10
	// bytes) and a 2-byte marker before each head count too.
	limits := []int64{1000*int64(len(head)) + 4, 10 + 1000*int64(len(head)+2) + 4}
	for _, withTLS := range []bool{false, true} {
		for _, remote := range []bool{false, true} {
			for _, limit := range limits {
				name := fmt.Sprintf("%s/%s/limit=%d", map[bool]string{false: "plain", true: "tls"}[withTLS],
					map[bool]string{false: "local", true: "remote"}[remote], limit)
				t.Run(name, func(t *testing.T) {
					u := mk(t, withTLS)
					conf := u.conf(func(tr *Transport) { tr.MaxResponseHeaderBytes = limit })
					owner, rt := adv10Members(t, conf, remote)
					warm(t, owner, u.url("/warm"))
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					start := time.Now()
					// A trace that does not look at interim responses.
					trace := &httptrace.ClientTrace{GotFirstResponseByte: func() {}}
					req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), "GET", u.url("/flood"), nil)
					resp, err := rt.RoundTrip(req)
					if err == nil {
						resp.Body.Close()
						t.Fatalf("a flood of interim responses gave %d", resp.StatusCode)
					}
					if !errors.Is(err, ErrHeaderTooLarge) {
						t.Errorf("error %v, want ErrHeaderTooLarge", err)
					}
					if took := time.Since(start); took > 2*time.Second {
						t.Errorf("the flood took %v to be refused", took)
					}
					waitFor(t, 3*time.Second, "the flooding connection to leave the pool", func() bool {
						return owner.node.Stats().OpenConns == 0
					})
					resp2, body, err := adv10Do(t, rt, "GET", u.url("/next"), nil)
					adv10CheckOwn(t, "GET after the flood", resp2, body, err, "/next")
				})
			}
		}
	}
}

// TestAdv10InterimThenFinalReusedInStep: interim responses the caller sees
// (Got1xxResponse), then the final one, and more interim responses in the
// same write after it, which belong to no request. Through a sibling the
// owner relays each interim response before the final one; the caller sees
// exactly those, and the next request on the connection gets its own
// answer, never the interim responses left over.
func TestAdv10InterimThenFinalReusedInStep(t *testing.T) {
	mk := func(t *testing.T, withTLS bool) *adv10Upstream {
		return newAdv10Upstream(t, withTLS, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
			if req.URL.Path != "/hints" {
				return adv10Fresh(c, req, conn, n)
			}
			io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: <a>\r\n\r\n"+
				"HTTP/1.1 103 Early Hints\r\nLink: <b>\r\n\r\n"+
				"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ndone"+
				"HTTP/1.1 103 Early Hints\r\nLink: <stray>\r\n\r\n")
			return true
		})
	}
	adv10Paths(t, mk, func(t *testing.T, u *adv10Upstream, rt http.RoundTripper, owner *member) {
		for round := range 2 {
			var links []string
			trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
				links = append(links, h.Get("Link"))
				return nil
			}}
			ctx, cancel := context.WithTimeout(httptrace.WithClientTrace(context.Background(), trace), 5*time.Second)
			req, _ := http.NewRequestWithContext(ctx, "GET", u.url("/hints"), nil)
			resp, err := rt.RoundTrip(req)
			if err != nil {
				cancel()
				t.Fatal(err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			cancel()
			if err != nil || string(b) != "done" || strings.Join(links, ",") != "<a>,<b>" {
				t.Fatalf("round %d: %q %v, interim %q", round, b, err, links)
			}
			time.Sleep(20 * time.Millisecond)
			// The next request sees no interim response: the one left
			// over is not its own.
			var stray []string
			trace = &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
				stray = append(stray, h.Get("Link"))
				return nil
			}}
			ctx, cancel = context.WithTimeout(httptrace.WithClientTrace(context.Background(), trace), 5*time.Second)
			req, _ = http.NewRequestWithContext(ctx, "GET", u.url("/next"), nil)
			resp2, err := rt.RoundTrip(req)
			var body string
			if err == nil {
				b, rerr := io.ReadAll(resp2.Body)
				resp2.Body.Close()
				body, err = string(b), rerr
			}
			cancel()
			adv10CheckOwn(t, "GET after the hints", resp2, body, err, "/next")
			if len(stray) > 0 {
				t.Fatalf("round %d: the next request saw interim responses %q", round, stray)
			}
		}
	})
}

// adv10Members is the member whose connection a test's request uses, and
// the round tripper it sends through: the owner itself, or a sibling of it
// (remote).
func adv10Members(t *testing.T, conf func(*Transport), remote bool) (owner *member, rt http.RoundTripper) {
	t.Helper()
	if remote {
		var client *member
		owner, client = remotePair(t, conf)
		return owner, client.tr
	}
	owner = localTransportMember(t, conf)
	return owner, owner.tr
}
