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

// TestAdv34ShortBodyPastDeadlineNotSent: the same short body, the rest of
// which comes in after the frame's deadline (within the owner's grace): the
// owner judged the deadline once the head was in, then waited for the body
// with the connection taken up, and sent the POST upstream for a caller
// that had given up on it (as TestAdv32OwnerStartsExchangePastDeadline for
// a late head).
func TestAdv34ShortBodyPastDeadlineNotSent(t *testing.T) {
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
	deadline := time.Now().Add(300 * time.Millisecond)
	frame, err := appendRequestFrame(nil, siblingLease(t, client, key, 1), deadline, 0)
	if err != nil {
		t.Fatal(err)
	}
	sc := dialOwner(t, owner)
	sc.SetDeadline(time.Now().Add(5 * time.Second))
	host := strings.TrimPrefix(u.base, "http://")
	frame = fmt.Appendf(frame, "POST /late HTTP/1.1\r\nHost: %s\r\nContent-Length: 4\r\n\r\nha", host)
	if _, err := sc.Write(frame); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(deadline) + 40*time.Millisecond) // past the deadline, within the owner's grace
	io.WriteString(sc, "lf")
	br := bufio.NewReader(sc)
	if _, err := readFrame(br, respHeaderLen, decodeResponseFrame); err != nil {
		t.Fatalf("no answer to the frame: %v", err)
	}
	sc.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	io.Copy(io.Discard, br)
	for _, r := range u.requests() {
		if strings.HasSuffix(r, "/late") {
			t.Fatalf("the owner sent upstream a POST whose body (sent with its head) came in after its deadline: %q", u.requests())
		}
	}
}
