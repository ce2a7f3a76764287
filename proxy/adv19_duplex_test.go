package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// adv19EchoUpstream answers a POST at once (200, chunked) and then echoes
// each line of the request body as it reads it, an HTTP/1.1 full-duplex
// handler (http.ResponseController.EnableFullDuplex), as a streaming RPC
// or a chat relay does.
func adv19EchoUpstream(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "POST" {
			io.WriteString(w, "ok")
			return
		}
		rc := http.NewResponseController(w)
		rc.EnableFullDuplex()
		w.WriteHeader(200)
		rc.Flush()
		br := bufio.NewReader(r.Body)
		for {
			line, err := br.ReadString('\n')
			if line != "" {
				io.WriteString(w, "echo "+line)
				rc.Flush()
			}
			if err != nil {
				return
			}
		}
	}))
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	return srv
}

// adv19PingPong sends lines on a streamed request body and waits for each
// echo before the next, within 3s in all.
func adv19PingPong(rt http.RoundTripper, url string, rounds int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	pr, pw := io.Pipe()
	defer pw.Close()
	req, _ := http.NewRequestWithContext(ctx, "POST", url, pr)
	type res struct {
		resp *http.Response
		err  error
	}
	got := make(chan res, 1)
	go func() {
		resp, err := rt.RoundTrip(req)
		got <- res{resp, err}
	}()
	// The first line goes before the response is asked for: a transport
	// may wait for some of the body before it sends the head.
	if _, err := io.WriteString(pw, "line 0\n"); err != nil {
		return fmt.Errorf("write 0: %w", err)
	}
	var r res
	select {
	case r = <-got:
	case <-ctx.Done():
		return fmt.Errorf("no response head after the first line: %w", ctx.Err())
	}
	if r.err != nil {
		return fmt.Errorf("round trip: %w", r.err)
	}
	defer r.resp.Body.Close()
	br := bufio.NewReader(r.resp.Body)
	for i := 0; i < rounds; i++ {
		if i > 0 {
			if _, err := fmt.Fprintf(pw, "line %d\n", i); err != nil {
				return fmt.Errorf("write %d: %w", i, err)
			}
		}
		line, err := br.ReadString('\n')
		if err != nil {
			return fmt.Errorf("echo %d: %q, %w", i, line, err)
		}
		if want := fmt.Sprintf("echo line %d\n", i); line != want {
			return fmt.Errorf("echo %d: %q, want %q", i, line, want)
		}
	}
	pw.Close()
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		return fmt.Errorf("after the last echo: %q, %v", rest, err)
	}
	return nil
}

// TestAdv19FullDuplexH1: an HTTP/1.1 upstream that answers while it reads
// the request body and echoes it line by line. net/http's Transport serves
// it (it writes the body while it reads the response); orbit must, on its
// own connection and through a sibling's, and the connection must serve
// the next request.
func TestAdv19FullDuplexH1(t *testing.T) {
	srv := adv19EchoUpstream(t)
	t.Run("stock", func(t *testing.T) {
		tr := &http.Transport{}
		defer tr.CloseIdleConnections()
		if err := adv19PingPong(tr, srv.URL+"/echo", 5); err != nil {
			t.Fatalf("stock transport: %v", err)
		}
	})
	t.Run("local", func(t *testing.T) {
		m := localTransportMember(t, nil)
		warm(t, m, srv.URL+"/warm")
		if err := adv19PingPong(m.tr, srv.URL+"/echo", 5); err != nil {
			t.Fatalf("local: %v", err)
		}
		if _, body, err := adv10Do(t, m.tr, "GET", srv.URL+"/after", nil); err != nil || body != "ok" {
			t.Fatalf("after: %q %v", body, err)
		}
	})
	t.Run("remote", func(t *testing.T) {
		owner, client := remotePair(t, nil)
		warm(t, owner, srv.URL+"/warm")
		if err := adv19PingPong(client.tr, srv.URL+"/echo", 5); err != nil {
			t.Fatalf("through a sibling: %v (owner %+v)", err, owner.node.Stats())
		}
		if _, body, err := adv10Do(t, client.tr, "GET", srv.URL+"/after", nil); err != nil || body != "ok" {
			t.Fatalf("after: %q %v", body, err)
		}
		if s := owner.node.Stats(); s.ServedRemote == 0 {
			t.Fatalf("not through the owner: %+v", s)
		}
	})
}
