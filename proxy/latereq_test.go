package proxy

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

// TestLateRequestNotSentPastDeadline: the owner judges a lease's deadline
// when the frame arrives, then waits for the request head (and the short
// body of declared length sent with it, withBodyAhead) until the deadline
// plus ownerDeadlineGrace. What comes in after the deadline (a slow
// sibling, a stalled socket) must not be sent upstream: its caller has
// already given up and answered 504, and for a POST the upstream would act
// on a request the client was told failed. Every claim point refuses past
// the deadline (DESIGN, seed 001); so must the start of the exchange.
func TestLateRequestNotSentPastDeadline(t *testing.T) {
	for _, tc := range []struct {
		name          string
		flags         uint16
		before, after string // sent with the frame, and past the deadline; %s is the host
	}{
		{"head", flagBodyOnAccept, "", "GET /late HTTP/1.1\r\nHost: %s\r\n\r\n"},
		{"short body", 0, "POST /late HTTP/1.1\r\nHost: %s\r\nContent-Length: 4\r\n\r\nha", "lf"},
		// Head and body overrun the owner's read buffer (adv37).
		{"short body past the buffer", 0, fmt.Sprintf("POST /late HTTP/1.1\r\nHost: %%s\r\nContent-Length: %d\r\n\r\n%s",
			maxBodyWithHead, strings.Repeat("b", maxBodyWithHead-1)), "b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newAdv10Upstream(t, false, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
				io.Copy(io.Discard, req.Body)
				return adv10Fresh(c, req, conn, n)
			})
			owner, client := remotePair(t, nil)
			warm(t, owner, u.url("/warm"))
			kreq, _ := http.NewRequest("GET", u.url("/"), nil)
			_, key, err := client.tr.Upstream(kreq)
			if err != nil {
				t.Fatal(err)
			}
			host := strings.TrimPrefix(u.base, "http://")
			deadline := time.Now().Add(300 * time.Millisecond)
			frame, err := appendRequestFrame(nil, siblingLease(t, client, key, 1), deadline, tc.flags)
			if err != nil {
				t.Fatal(err)
			}
			if tc.before != "" {
				frame = append(frame, strings.ReplaceAll(tc.before, "%s", host)...)
			}
			sc := dialOwner(t, owner)
			sc.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := sc.Write(frame); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Until(deadline) + 40*time.Millisecond) // past the deadline, within the owner's grace
			io.WriteString(sc, strings.ReplaceAll(tc.after, "%s", host))
			br := bufio.NewReader(sc)
			if _, err := readFrame(br, respHeaderLen, decodeResponseFrame); err != nil {
				t.Fatalf("no answer to the frame: %v", err)
			}
			sc.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			io.Copy(io.Discard, br)
			for _, r := range u.requests() {
				if strings.HasSuffix(r, "/late") {
					t.Fatalf("the owner sent upstream a request whose %s came in after its deadline: %q", tc.name, u.requests())
				}
			}
		})
	}
}
