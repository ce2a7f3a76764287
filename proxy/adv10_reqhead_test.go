package proxy

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
)

// TestAdv10LargeRequestHeadThroughSibling: the owner bounds a sibling's
// request head, but not by the response header limit of the Transport
// that made the connection, which may be set far below what a request
// head takes: a request with a 16 KiB cookie, which the local path sends
// as it is, is served through a sibling too under a response header limit
// of 8 KiB.
func TestAdv10LargeRequestHeadThroughSibling(t *testing.T) {
	u := newAdv10Upstream(t, false, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
		return adv10Fresh(c, req, conn, n)
	})
	conf := func(tr *Transport) { tr.MaxResponseHeaderBytes = 8 << 10 }
	owner, client := remotePair(t, conf)
	warm(t, owner, u.url("/warm"))
	for _, size := range []int{16 << 10, 256 << 10} {
		h := http.Header{"Cookie": {strings.Repeat("c", size)}}
		resp, body, err := adv10Do(t, owner.tr, "GET", u.url("/local"), h)
		adv10CheckOwn(t, fmt.Sprintf("%d-byte cookie, local path", size), resp, body, err, "/local")
		served := owner.node.Stats().ServedRemote
		resp, body, err = adv10Do(t, client.tr, "GET", u.url("/remote"), h)
		adv10CheckOwn(t, fmt.Sprintf("%d-byte cookie through a sibling", size), resp, body, err, "/remote")
		if owner.node.Stats().ServedRemote != served+1 {
			t.Fatalf("%d-byte cookie: not served by the owner: %+v", size, owner.node.Stats())
		}
	}
}
