package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// ownerView is what a scripted owner saw of one request: the frame's
// flags, the body bytes that came before it answered, and the rest.
type ownerView struct {
	flags        uint16
	early, later string
	err          error
}

// scriptedOwner serves one exchange on own: it reads the request frame and
// head, then for up to wait whatever of the body arrives before it answers,
// then answers with answer (frames and heads), and reads the rest of the
// body, if the answer accepted the request.
func scriptedOwner(own *net.UnixConn, wait time.Duration, answer []byte) <-chan ownerView {
	seen := make(chan ownerView, 1)
	go func() {
		defer own.Close()
		var v ownerView
		defer func() { seen <- v }()
		br := bufio.NewReader(own)
		f, err := readFrame(br, reqHeaderLen, decodeRequestFrame)
		if err != nil {
			v.err = err
			return
		}
		v.flags = f.flags
		req, err := http.ReadRequest(br)
		if err != nil {
			v.err = err
			return
		}
		body := make([]byte, req.ContentLength)
		own.SetReadDeadline(time.Now().Add(wait))
		n, _ := io.ReadFull(br, body)
		v.early = string(body[:n])
		own.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := own.Write(answer); err != nil {
			v.err = err
			return
		}
		if answer[3] == byte(frameAccept) {
			m, _ := io.ReadFull(br, body[n:])
			v.later = string(body[n : n+m])
		}
	}()
	return seen
}

// oneStream is a peers whose only idle stream to lane is sib.
func oneStream(t *testing.T, sib *net.UnixConn, lane int) *peers {
	p := newPeers(t.TempDir(), 0)
	c := newConn(sib, sib)
	c.idleAt = time.Now()
	p.idle[lane] = []*conn{c}
	return p
}

// splitReader returns its parts one per Read (the last with io.EOF if
// eofLast, as a server's request body does), then io.EOF, and counts its
// Close calls.
type splitReader struct {
	parts   []string
	eofLast bool
	closed  atomic.Int32
}

func (r *splitReader) Read(p []byte) (int, error) {
	if len(r.parts) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.parts[0])
	r.parts[0] = r.parts[0][n:]
	if r.parts[0] == "" {
		r.parts = r.parts[1:]
		if r.eofLast && len(r.parts) == 0 {
			return n, io.EOF
		}
	}
	return n, nil
}

func (r *splitReader) Close() error { r.closed.Add(1); return nil }

func postWith(t *testing.T, body *trackBody, n int64) *http.Request {
	req, err := http.NewRequest("POST", "http://upstream.test/echo", body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = n
	return req
}

var acceptOK = appendHead(appendResponseFrame(nil, responseFrame{typ: frameAccept}), 0)

// TestShortBodyGoesWithItsHead: a short request body that the client has
// sent in full goes to the owner with the frame and the head, before the
// owner has accepted anything; one the client has sent only part of waits
// for the accept, as a long body always does.
func TestShortBodyGoesWithItsHead(t *testing.T) {
	answer := append(acceptOK, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"...)
	for _, tc := range []struct {
		name  string
		parts []string
		wait  time.Duration
		want  ownerView
	}{
		{"whole", []string{"hello"}, 2 * time.Second, ownerView{flags: flagNoUserAgent | flagNoInterim, early: "hello"}},
		{"part", []string{"he", "llo"}, 150 * time.Millisecond, ownerView{flags: flagBodyOnAccept | flagNoUserAgent | flagNoInterim, later: "hello"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sib, own := streamPair(t)
			seen := scriptedOwner(own, tc.wait, answer)
			p := oneStream(t, sib, 3)
			defer p.close()
			tb := &trackBody{rc: &splitReader{parts: tc.parts}}
			if err := tb.readAhead(5); err != nil {
				t.Fatal(err)
			}
			resp, err := p.roundTrip(postWith(t, tb, 5), 3, orbitpool.Lease{}, &remoteOpts{}, 1, nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(b) != "ok" {
				t.Fatalf("response %d %q", resp.StatusCode, b)
			}
			if v := <-seen; v != tc.want {
				t.Fatalf("the owner saw %+v; want %+v", v, tc.want)
			}
		})
	}
}

// TestRefusedShortBodyIsSentAgain: an owner that refuses a request whose
// body came with its head reads that body past; the caller keeps the stream,
// and the request, whose body it kept, may go on another plan whatever its
// method, with its body going with its head again.
func TestRefusedShortBodyIsSentAgain(t *testing.T) {
	sib, own := streamPair(t)
	seen := scriptedOwner(own, 2*time.Second, appendResponseFrame(nil, responseFrame{typ: frameReject, code: rejectStale, msg: "stale"}))
	p := oneStream(t, sib, 3)
	defer p.close()
	src := &splitReader{parts: []string{"hello"}}
	tb := &trackBody{rc: src}
	if err := tb.readAhead(5); err != nil {
		t.Fatal(err)
	}
	req := postWith(t, tb, 5)
	_, err := p.roundTrip(req, 3, orbitpool.Lease{}, &remoteOpts{}, 1, nil)
	if !IsRetrySafe(err) {
		t.Fatalf("a refusal gave %v, not retry-safe", err)
	}
	if v := <-seen; v.early != "hello" || v.err != nil {
		t.Fatalf("the refusing owner saw %+v", v)
	}
	if n := len(p.idle[3]); n != 1 {
		t.Fatalf("%d streams kept after a refusal; the owner read the body past, and the stream is in step", n)
	}
	if src.closed.Load() != 1 {
		t.Fatalf("the client's body was closed %d times once read in full; want once", src.closed.Load())
	}
	next, again := rewind(req, req, tb, err)
	if !again {
		t.Fatalf("a POST whose body is kept is not sent again after %v", err)
	}

	sib2, own2 := streamPair(t)
	seen2 := scriptedOwner(own2, 2*time.Second, append(acceptOK, "HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n"...))
	p2 := oneStream(t, sib2, 4)
	defer p2.close()
	resp, err := p2.roundTrip(next, 4, orbitpool.Lease{}, &remoteOpts{}, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if v := <-seen2; v.flags != flagNoUserAgent|flagNoInterim || v.early != "hello" || resp.StatusCode != 201 {
		t.Fatalf("the second owner saw %+v and answered %d", v, resp.StatusCode)
	}
}
