//go:build !race

package caddymodule

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestAdvEarlyResponseRetryRace: the first upstream answers 503 at once,
// without reading a body whose client sends 2 of 10 declared bytes, then the
// rest 300ms later; lb_retry_match retries on 503. Caddy closes the first
// response and starts the next attempt while the first attempt's request
// writer may still be blocked reading the same body. The request must be
// answered, and no upstream get a body other than the client's.
//
// It runs without the race detector only: the first attempt's writer may
// still be inside a Read of reverse_proxy's body when reverse_proxy closes
// that body, which Caddy's body wrappers (bodyNopCloserIfNotRead,
// requestBodyWithTrailers) do not guard; the detector reports it with the
// stock transport too.
func TestAdvEarlyResponseRetryRace(t *testing.T) {
	for _, kind := range advKinds {
		t.Run(kind, func(t *testing.T) {
			var r1 recorder
			u1 := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r1.add("hit"); len(r1.get()) == 1 {
					w.Header().Set("Connection", "close")
					w.WriteHeader(503)
					return
				}
				b, err := io.ReadAll(r.Body)
				r1.add(fmt.Sprintf("%q err=%v", b, err))
				fmt.Fprintf(w, "got %s", b)
			}), false)
			port := freePort(t)
			startCaddy(t, "", advSite(port, u1.hostport(), kind,
				"lb_retries 1\n\t\tlb_retry_match {\n\t\t\texpression `{rp.status_code} == 503`\n\t\t}"))
			c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			io.WriteString(c, "POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: 10\r\n\r\n01")
			time.Sleep(300 * time.Millisecond)
			io.WriteString(c, "23456789")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			status := 0
			var b []byte
			if err == nil {
				b, _ = io.ReadAll(resp.Body)
				status = resp.StatusCode
			}
			t.Logf("%s: client got %d %q %v; upstream saw %v", kind, status, b, err, r1.get())
			if status == 0 {
				t.Errorf("%s: no response within 5s (stock answers 502 at once): %v", kind, err)
			}
			for _, s := range r1.get() {
				if s != "hit" && s != `"0123456789" err=<nil>` && !strings.Contains(s, "unexpected EOF") {
					t.Errorf("%s: upstream got a body not the client's: %s", kind, s)
				}
			}
		})
	}
}
