package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAdv34HalfShortBodyHoldsNoConnection: a short request body of
// declared length goes with its head, in the frame's stream, with no
// flagBodyOnAccept (withBodyAhead): the owner reads it before it answers
// anything (readBodyWithHead). awaitHead waits for the head only, so a
// sibling (buggy, stalled, or hostile, same uid) that sends the lease, the
// whole head, and half of the short body, then stalls, has the owner take
// the key's only connection (and a worker) up and hold it until
// peerHeadTimeout (10s) or the frame's deadline: the half-sent head of
// TestAdv29HalfHeadHoldsNoConnection, one step later. Stock Caddy reads
// such a body only once it holds an upstream connection, but its peer here
// promised the body with the head: nothing may hold the connection for it.
func TestAdv34HalfShortBodyHoldsNoConnection(t *testing.T) {
	base := adv29BigUpstream(t)
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	conf := func(tr *Transport) { tr.MaxConnsPerKey = 1 }
	owner := newMember(t, spec, conf)
	client := newMember(t, spec, conf)
	if err := getBody(context.Background(), owner.tr, base+"/small"); err != nil {
		t.Fatalf("warm: %v", err)
	}
	oc := lastOwned(owner)
	if oc == nil {
		t.Fatal("warm left no idle connection")
	}
	frame := leaseFrame(t, client, oc, time.Time{}, 0)
	frame = fmt.Appendf(frame, "POST /small HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhalf")
	c, err := net.Dial("unix", SocketPath(SocketDir(spec.Path), owner.pool.Lane()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(frame); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	start := time.Now()
	if err := getBody(ctx, owner.tr, base+"/small"); err != nil {
		t.Fatalf("the owner's own request, behind a sibling's half-sent short body: %v after %v (served remote %d)",
			err, time.Since(start).Round(time.Millisecond), owner.node.Stats().ServedRemote)
	}
}

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
