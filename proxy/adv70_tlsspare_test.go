package proxy

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv70TLSSpareWithStrayRecordNotAdopted: a TLS spare on which the
// upstream wrote a stray full-size record while it sat idle outside the
// table is not adopted once the table has room: the next request goes on a
// new connection, is read once by the upstream, and gets its own answer.
func TestAdv70TLSSpareWithStrayRecordNotAdopted(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}
	stray := "HTTP/1.1 200 OK\r\nContent-Length: 16000\r\n\r\n" + strings.Repeat("s", 16000)
	u := newAdv10Upstream(t, true, func(c net.Conn, _ *bufio.Reader, req *http.Request, conn, _ int) bool {
		body := fmt.Sprintf("c%d", conn)
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		if req.URL.Path == "/stray" {
			time.Sleep(30 * time.Millisecond)
			io.WriteString(c, stray)
		}
		return true
	})
	relA := make(chan struct{})
	a := closingStreamUpstream(t, relA, true)
	m := newMember(t, spec, func(tr *Transport) { tr.TLSClientConfig = &tls.Config{RootCAs: u.roots} })
	held := holdStreams(t, m, a, 2)
	_, first, err := adv10Do(t, m.tr, "GET", u.url("/stray"), nil)
	if err != nil || first == "" || m.node.spares.len() != 1 {
		close(relA)
		t.Fatalf("a request with the table full: %q, %v, %d spares", first, err, m.node.spares.len())
	}
	time.Sleep(150 * time.Millisecond) // the stray record is out
	close(relA)
	for _, r := range held {
		drain(r)
	}
	waitFor(t, 3*time.Second, "the held connections to leave", func() bool { return m.node.Stats().Retired == 2 })
	_, body, err := adv10Do(t, m.tr, "GET", u.url("/conn"), nil)
	if err != nil || body == first || !strings.HasPrefix(body, "c") || len(body) > 4 {
		t.Fatalf("a request with room in the table: %q, %v; want its own answer on a new connection (not %q)", body, err, first)
	}
	n := 0
	for _, s := range u.requests() {
		if strings.HasSuffix(s, " /conn") {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("the upstream read /conn %d times (%v); want once", n, u.requests())
	}
	if o, h := adv70Counted(m); o != 1 || h != 1 {
		t.Fatalf("n.open %d, %d held; want the new connection alone", o, h)
	}
}

// TestAdv70AdoptedSpareSharedWithSibling: a spare adopted into the table is
// used by a sibling (a second member on the segment) while its owner's
// requests use it too, one at a time: every answer comes from that one
// connection, and its owner's count stays exact.
func TestAdv70AdoptedSpareSharedWithSibling(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 2, Keys: 4, ResourcesPerLane: 2, Path: t.TempDir() + "/seg"}
	o := newMember(t, spec, nil)
	s := newMember(t, spec, nil)
	relA := make(chan struct{})
	a := closingStreamUpstream(t, relA, true)
	b := unpooledUpstream(t, nil, make(chan bool, 16))
	held := holdStreams(t, o, a, 2)
	_, kept, err := adv10Do(t, o.tr, "GET", b+"/conn", nil)
	close(relA)
	for _, r := range held {
		drain(r)
	}
	if err != nil || kept == "" {
		t.Fatalf("a request with the table full: %q, %v", kept, err)
	}
	waitFor(t, 3*time.Second, "the held connections to leave", func() bool { return o.node.Stats().Retired == 2 })
	for i := range 6 {
		tr := o.tr
		if i%2 == 1 {
			tr = s.tr
		}
		if _, body, err := adv10Do(t, tr, "GET", b+"/conn", nil); err != nil || body != kept {
			t.Fatalf("request %d: %q, %v; want it on the adopted connection %q", i, body, err, kept)
		}
	}
	if st := s.node.Stats(); st.ReusedRemote != 3 || st.Created != 0 {
		t.Fatalf("sibling's stats %+v: want its 3 requests on the owner's adopted connection", st)
	}
	if op, h := adv70Counted(o); op != 1 || h != 1 {
		t.Fatalf("owner: n.open %d, %d held; want 1", op, h)
	}
}
