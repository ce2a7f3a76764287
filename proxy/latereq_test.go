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
// the deadline (DESIGN, seed 001); so must the start of the exchange. The refusal is retry-safe (a reject
// frame, which the caller takes as nothing sent), and the stream stays in
// step: the next exchange on it is served. Heads and bodies that overrun
// the owner's read buffer included (adv37, adv38).
func TestLateRequestNotSentPastDeadline(t *testing.T) {
	big := strings.Repeat("c", 6<<10)
	for _, tc := range []struct {
		name          string
		flags         uint16
		before, after string // %s is the host
	}{
		{"head", flagBodyOnAccept, "", "GET /late HTTP/1.1\r\nHost: %s\r\n\r\n"},
		{"short body", 0, "POST /late HTTP/1.1\r\nHost: %s\r\nContent-Length: 4\r\n\r\nha", "lf"},
		{"short body past the buffer", 0, fmt.Sprintf("POST /late HTTP/1.1\r\nHost: %%s\r\nContent-Length: %d\r\n\r\n%s",
			maxBodyWithHead, strings.Repeat("b", maxBodyWithHead-1)), "b"},
		{"large head", flagBodyOnAccept, "GET /late HTTP/1.1\r\nHost: %s\r\nCookie: " + big, "\r\n\r\n"},
		{"large head and short body", 0, "POST /late HTTP/1.1\r\nHost: %s\r\nContent-Length: 4096\r\nCookie: " + big + "\r\n\r\n" +
			strings.Repeat("b", 4000), strings.Repeat("b", 96)},
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
			frame = append(frame, strings.ReplaceAll(tc.before, "%s", host)...)
			sc := dialOwner(t, owner)
			sc.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := sc.Write(frame); err != nil {
				t.Fatal(err)
			}
			// Just past the deadline, well within the owner's grace
			// (ownerDeadlineGrace) for the head's rest.
			time.Sleep(time.Until(deadline) + 5*time.Millisecond)
			io.WriteString(sc, strings.ReplaceAll(tc.after, "%s", host))
			br := bufio.NewReader(sc)
			rf, err := readFrame(br, respHeaderLen, decodeResponseFrame)
			if err != nil {
				t.Fatalf("no answer to the late request: %v", err)
			}
			if rf.typ != frameReject {
				t.Fatalf("late request answered %d (%s), want a reject (%d), which the caller may send again", rf.typ, rf.msg, frameReject)
			}
			// The next exchange on the same stream.
			next, err := appendRequestFrame(nil, siblingLease(t, client, key, 1), time.Time{}, flagBodyOnAccept)
			if err != nil {
				t.Fatal(err)
			}
			next = append(next, "GET /next HTTP/1.1\r\nHost: "+host+"\r\n\r\n"...)
			if _, err := sc.Write(next); err != nil {
				t.Fatalf("the stream did not stay open after the refusal: %v", err)
			}
			rf, err = readFrame(br, respHeaderLen, decodeResponseFrame)
			if err != nil || rf.typ != frameAccept {
				t.Fatalf("the next exchange on the stream: frame %d (%s), %v; want an accept", rf.typ, rf.msg, err)
			}
			for end := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				reqs := u.requests()
				if strings.HasSuffix(reqs[len(reqs)-1], "/next") {
					for _, r := range reqs {
						if strings.HasSuffix(r, "/late") {
							t.Fatalf("a late request went upstream: %q", reqs)
						}
					}
					return
				}
				if time.Now().After(end) {
					t.Fatalf("the next exchange did not reach the upstream: %q", reqs)
				}
			}
		})
	}
}
