package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/internal/grpcmsg"
)

// duplexUpstream: /first answers after the first request message with
// grpc-status in the trailers and returns without reading the rest (a
// gRPC server failing a client stream early); /stream echoes every
// message until the request ends or its context does.
func duplexUpstream(t *testing.T) *h2cServer {
	return newH2CServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/grpc")
		w.Header().Set("Trailer", "Grpc-Status")
		switch r.URL.Path {
		case "/first":
			p, err := grpcmsg.Read(r.Body)
			if err != nil {
				return
			}
			w.Write(grpcmsg.Frame(append([]byte("first "), p...)))
			w.Header().Set("Grpc-Status", "3")
		case "/stream":
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			grpcmsg.Echo(w, w.(http.Flusher).Flush, r.Body, 0)
			w.Header().Set("Grpc-Status", "0")
		default:
			io.WriteString(w, "ok")
		}
	})
}

// TestAdv5H2ResponseEndsWhileRequestStreams: the upstream ends the
// response (with its grpc-status trailer) while the caller's request body
// is still open. The caller reads the whole response and its trailer, as
// through x/net/http2, and the request body is closed within a bound (a
// later write to it fails) rather than read by a writer left behind; the
// stream's unit comes back.
func TestAdv5H2ResponseEndsWhileRequestStreams(t *testing.T) {
	up := duplexUpstream(t)
	owner, client := h2Pair(t, up.url)
	ref := refH2C()
	defer ref.CloseIdleConnections()
	for _, name := range []string{"x/net", "owner", "sibling"} {
		rt := map[string]http.RoundTripper{"x/net": ref, "owner": owner.tr, "sibling": client.tr}[name]
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		pr, pw := io.Pipe()
		req := grpcReq(t, ctx, up.url+"/first", pr)
		done := make(chan h2Outcome, 1)
		go func() { done <- roundTripOutcome(rt, req) }()
		if _, err := pw.Write(grpcmsg.Frame([]byte("m0"))); err != nil {
			t.Fatalf("%s: first message: %v", name, err)
		}
		var o h2Outcome
		select {
		case o = <-done:
		case <-time.After(3 * time.Second):
			t.Fatalf("%s: no complete response while the request body stays open", name)
		}
		if o.err != "" || o.status != 200 || o.body != string(grpcmsg.Frame([]byte("first m0"))) || o.trailer.Get("Grpc-Status") != "3" {
			t.Errorf("%s: %+v; want the message and grpc-status 3", name, o)
		}
		// The request body is given up: a write to it fails, in time. The
		// bound is time, not a count of writes: on a busy machine the
		// body's writer may copy many small writes before the close
		// reaches it.
		werr := make(chan error, 1)
		go func() {
			var err error
			for i, start := 0, time.Now(); err == nil && time.Since(start) < 2*time.Second; i++ {
				_, err = pw.Write(grpcmsg.Frame([]byte(fmt.Sprint("more ", i))))
			}
			werr <- err
		}()
		select {
		case err := <-werr:
			if err == nil {
				t.Errorf("%s: writes to the request body went somewhere for 2s after the response ended", name)
			}
		case <-time.After(3 * time.Second):
			pr.CloseWithError(fmt.Errorf("test gives up"))
			<-werr
			t.Errorf("%s: the request body was left open, a writer blocked on it, after the response ended", name)
		}
		pw.Close()
		cancel()
	}
	if s := client.node.Stats(); s.Created != 0 || s.ReusedRemote != 1 {
		t.Errorf("sibling %+v: want the request through the owner", s)
	}
	capacityBack(t, owner, up.url)
	if err := getOK(client, context.Background(), up.url+"/"); err != nil {
		t.Errorf("the sibling's next request: %v", err)
	}
}

// TestAdv5H2CancelMidUpload: a bidirectional stream through a sibling,
// cancelled while both bodies are open: the caller's read ends with an
// error at once, the caller's request body is not read on, and the
// stream's unit comes back; then the sibling's next request works.
// (x/net/http2 itself, and so the owner's local path, does not end the
// body read while its writer waits in the request body's Read: it notices
// the cancel only when that Read returns. The sibling's is stricter.)
func TestAdv5H2CancelMidUpload(t *testing.T) {
	up := duplexUpstream(t)
	owner, client := h2Pair(t, up.url)
	for _, m := range []*member{client} {
		name := "sibling"
		ctx, cancel := context.WithCancel(context.Background())
		pr, pw := io.Pipe()
		req := grpcReq(t, ctx, up.url+"/stream", pr)
		got, errc := headAsync(m.tr, req)
		pw.Write(grpcmsg.Frame([]byte("a")))
		var resp *http.Response
		select {
		case resp = <-got:
		case err := <-errc:
			t.Fatalf("%s: %v", name, err)
		case <-time.After(3 * time.Second):
			cancel()
			t.Fatalf("%s: no head", name)
		}
		if p, err := grpcmsg.Read(resp.Body); err != nil || string(p) != "a" {
			t.Fatalf("%s: echo %q %v", name, p, err)
		}
		cancel()
		readErr := make(chan error, 1)
		go func() {
			_, err := io.Copy(io.Discard, resp.Body)
			readErr <- err
		}()
		select {
		case err := <-readErr:
			if err == nil {
				t.Errorf("%s: the body of a cancelled stream ended cleanly", name)
			}
		case <-time.After(2 * time.Second):
			t.Errorf("%s: the body read did not end after the cancel", name)
			resp.Body.Close()
			<-readErr
		}
		resp.Body.Close()
		werr := make(chan error, 1)
		go func() {
			var err error
			for i := 0; err == nil && i < 1000; i++ {
				_, err = pw.Write(grpcmsg.Frame([]byte("more")))
			}
			werr <- err
		}()
		select {
		case err := <-werr:
			if err == nil {
				t.Errorf("%s: writes to the request body went on after the cancel", name)
			}
		case <-time.After(2 * time.Second):
			pr.CloseWithError(fmt.Errorf("test gives up"))
			<-werr
			t.Errorf("%s: a writer stayed blocked on the request body after the cancel", name)
		}
		capacityBack(t, owner, up.url)
	}
	if err := getOK(client, context.Background(), up.url+"/"); err != nil {
		t.Errorf("the sibling's next request: %v", err)
	}
}
