package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// scriptAcceptor accepts a lease whose first byte is not 'R' (refused with
// a reason); the exchange of a lease starting with 'E' fails before reading
// the body, with nothing sent, and any other reads the body and answers.
type scriptAcceptor struct{}

func (scriptAcceptor) accept(lease []byte, _ time.Duration) (execution, error) {
	if len(lease) > 0 && lease[0] == 'R' {
		return nil, &rejectError{code: rejectStale, err: fmt.Errorf("refused %q", lease)}
	}
	return scriptExec{fail: len(lease) > 0 && lease[0] == 'E'}, nil
}

type scriptExec struct{ fail bool }

func (scriptExec) maxHeaderBytes() int64 { return 4 << 10 }
func (scriptExec) abandon()              {}
func (e scriptExec) roundTrip(req *http.Request, _ func()) (*http.Response, error) {
	if e.fail {
		return nil, &Error{Op: "write", RetrySafe: true, Err: ErrConnBroken}
	}
	n, err := io.Copy(io.Discard, req.Body)
	if err != nil {
		return nil, &Error{Op: "read body", Err: err}
	}
	body := fmt.Sprintf("%s %d", req.Method, n)
	return &http.Response{StatusCode: 200, Status: "200 OK", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Length": {fmt.Sprint(len(body))}}, ContentLength: int64(len(body)),
		Body: io.NopCloser(strings.NewReader(body))}, nil
}

// reqFrame is a request frame for lease with flags, valid for an hour.
func reqFrame(lease string, flags uint16) string {
	b, _ := appendRequestFrame(nil, []byte(lease), time.Now().Add(time.Hour), flags)
	return string(b)
}

// FuzzOwnerStream: whatever a peer sends on its stream (frames, heads,
// bodies, several exchanges back to back), the owner never panics, and once
// the peer has said all it will (half-close) the owner ends the stream
// promptly: nothing it reads can make it wait for more, or hold on.
func FuzzOwnerStream(f *testing.F) {
	frame := reqFrame
	get := "GET / HTTP/1.1\r\nHost: x\r\n\r\n"
	post := "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
	chunked := "POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n"
	for _, seed := range []string{
		frame("lease", flagBodyOnAccept) + get,
		frame("lease", flagBodyOnAccept) + post + frame("lease", flagBodyOnAccept) + chunked,
		frame("Rlease", flagBodyOnAccept) + post[:strings.Index(post, "hello")] + frame("lease", flagBodyOnAccept) + get,
		frame("Elease", flagBodyOnAccept) + post[:strings.Index(post, "hello")] + frame("lease", flagBodyOnAccept) + get,
		frame("Rlease", 0) + post,
		frame("lease", 0) + "POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
		frame("lease", flagBodyOnAccept) + "GET / HTTP/1.1\r\nX: " + strings.Repeat("h", 5000) + "\r\n\r\n",
		"OR\x01\x01garbage",
		// Short bodies sent with their heads (no flagBodyOnAccept):
		// served, refused, failed, short, long, over the limit, chunked.
		frame("lease", 0) + post + frame("lease", 0) + post,
		frame("Rlease", 0) + post + frame("Elease", 0) + post + frame("lease", flagBodyOnAccept) + get,
		frame("lease", 0) + post[:len(post)-2],
		frame("Elease", 0) + post + "EXTRA",
		frame("lease", 0) + "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 4097\r\n\r\n" + strings.Repeat("y", 4097),
		frame("Rlease", 0) + chunked,
		// Heads past the read buffer, read ahead before the lease (see
		// readPastBuffer): with a short body, the head's end at the
		// buffer's edge, past maxHeadAhead, and another exchange after.
		frame("lease", 0) + "POST /p HTTP/1.1\r\nX: " + strings.Repeat("h", 6000) + "\r\nContent-Length: 5\r\n\r\nhello" + frame("lease", 0) + post,
		frame("lease", 0) + "GET / HTTP/1.1\r\nX: " + strings.Repeat("e", 4096-len("GET / HTTP/1.1\r\nX: \r\n\r\n")-45) + "\r\n\r\n" + frame("lease", flagBodyOnAccept) + get,
		frame("lease", flagBodyOnAccept) + "GET / HTTP/1.1\r\nX: " + strings.Repeat("m", 70<<10) + "\r\n\r\n",
		frame("Rlease", 0) + "POST /p HTTP/1.1\r\nX: " + strings.Repeat("r", 5000) + "\r\nContent-Length: 3\r\n\r\nabc" + frame("lease", 0) + get,
	} {
		f.Add([]byte(seed))
	}
	log, logs := observedLogs()
	path := SocketPath(filepath.Join(f.TempDir(), "sock"), 1)
	ln, err := listenUnix(path)
	if err != nil {
		f.Fatal(err)
	}
	srv := newServer(ln, scriptAcceptor{}, log)
	go srv.serve()
	f.Cleanup(func() { srv.close() })
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := net.DialTimeout("unix", path, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		go func() {
			c.Write(in)
			c.(*net.UnixConn).CloseWrite()
		}()
		// A reset is an end too: the owner closed with bytes unread.
		var out bytes.Buffer
		if _, err := io.Copy(&out, c); errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("the owner did not end the stream after the peer's half-close (answered %q)", out.Bytes())
		}
		if n := logs.FilterMessageSnippet("recovered panic").Len(); n > 0 {
			t.Fatalf("the owner panicked: %v", logs.FilterMessageSnippet("recovered panic").All())
		}
	})
}
