package proxy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestHalfSentHeadHoldsNoConnection: a sibling (buggy or hostile, same
// uid) presents a valid lease on the owner's only connection of a key and
// sends part of what it promised, then stalls with the stream open: half of
// a small request head, or the whole head and half of the short body of
// declared length that goes with it (withBodyAhead: no flagBodyOnAccept,
// the owner reads it before it answers anything). "A silent or half-sent
// peer costs a timer, not a leased upstream connection" (THREATS.md, the
// unix leg): the owner's own request for the key must be served, not wait
// the head's timeout (peerHeadTimeout, 10s) behind a connection taken up
// for bytes that never come. Stock Caddy takes no upstream connection for
// a client until its head is whole, and its peer here promised the body
// with the head.
func TestHalfSentHeadHoldsNoConnection(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags uint16
		sent  string
	}{
		{"half head", flagBodyOnAccept, "GET /small HTTP/1.1\r\nHo"},
		{"half short body", 0, "POST /small HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhalf"},
		// maxBodyWithHead is the whole of the owner's read buffer, so head
		// and body together need not fit it: all but the body's last byte.
		{"short body past the read buffer but its last byte", 0, fmt.Sprintf("POST /small HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s",
			maxBodyWithHead, strings.Repeat("b", maxBodyWithHead-1))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base, owner, client, oc := soleIdleConn(t)
			frame := fmt.Append(leaseFrame(t, client, oc, time.Time{}, tc.flags), tc.sent)
			if _, err := dialOwner(t, owner).Write(frame); err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
			defer cancel()
			start := time.Now()
			if err := getBody(ctx, owner.tr, base+"/small"); err != nil {
				t.Fatalf("the owner's own request, behind a sibling's %s: %v after %v (served remote %d)",
					tc.name, err, time.Since(start).Round(time.Millisecond), owner.node.Stats().ServedRemote)
			}
		})
	}
}
