package proxy

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// TestAdv55H2Relay100StallsSharedConn: relay100 runs in the HTTP/2
// client's read loop (x/net calls Got100Continue there) and flushes each
// 100 to the sibling's stream, with no deadline but the exchange's. A
// sibling whose caller reads no interim responses (flagNoInterim) and that
// stops reading its stream, while the upstream sends a run of 100s on its
// stream (well under x/net's interim limit), blocks that read loop: every
// other stream on the shared upstream connection, the owner's own
// requests and other siblings', stalls until the stuck exchange's
// deadline. A local hookless caller's x/net client never blocks its read
// loop on a 100. The threat model: a silent peer costs a timer, not a
// leased upstream connection. relay100 now relays every 100 with a write
// that never waits (relay1xxNoWait): the stuck exchange fails instead.
func TestAdv55H2Relay100StallsSharedConn(t *testing.T) {
	up := newRawH2(t, func(s *rawStream) {
		if s.path != "/flood" {
			s.headers(false, ":status", "200", "content-length", "2")
			s.data(true, []byte("ok"))
			return
		}
		for range 5000 {
			s.headers(false, ":status", "100")
		}
		s.headers(false, ":status", "200", "content-length", "2")
		s.data(true, []byte("ok"))
	})
	owner, client := h2Pair(t, up.url)
	key := mustKey(t, owner.tr, up.url)
	sc := dialOwner(t, owner)
	host := strings.TrimPrefix(up.url, "http://")
	frame, err := appendRequestFrame(nil, siblingLease(t, client, key, 1), time.Now().Add(30*time.Second), flagNoInterim)
	if err != nil {
		t.Fatal(err)
	}
	// The sibling sends its request and then reads nothing.
	io.WriteString(sc, string(frame)+"GET /flood HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
	time.Sleep(300 * time.Millisecond)

	// The owner's own request on the same upstream connection.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	err = getOK(owner, ctx, up.url+"/")
	if err != nil {
		t.Errorf("the owner's own GET on the shared HTTP/2 connection, while a sibling that reads nothing gets 100s: %v after %v: the connection's read loop is blocked in relay100's write to the sibling",
			err, time.Since(start).Round(time.Millisecond))
	}
	if s := owner.node.Stats(); s.Created != 1 {
		t.Logf("owner %+v", s)
	}
}
