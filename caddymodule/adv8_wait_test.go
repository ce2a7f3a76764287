package caddymodule

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestAdv8WaitTimeoutBoundsOnlyTheWait: wait_timeout bounds the wait for a
// connection, never the exchange. An upstream that takes three times the
// wait timeout to answer, to read a body, or to send its body, answers in
// full, as through the stock transport.
func TestAdv8WaitTimeoutBoundsOnlyTheWait(t *testing.T) {
	const wait = 150 * time.Millisecond
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/slow-head":
			time.Sleep(3 * wait)
		case "/slow-body":
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			time.Sleep(3 * wait)
		}
		fmt.Fprintf(w, "done %d", len(b))
	}), false)
	stock, orbit := adv8Sites(t, up.hostport(), fmt.Sprintf("wait_timeout %s", wait), "")

	for _, path := range []string{"/slow-head", "/slow-body", "/slow-upload"} {
		t.Run(strings.TrimPrefix(path, "/"), func(t *testing.T) {
			got := map[string]string{}
			for name, port := range map[string]int{"stock": stock, "orbit": orbit} {
				var body io.Reader
				if path == "/slow-upload" {
					// More than the transport reads ahead, the rest late.
					pr, pw := io.Pipe()
					go func() {
						pw.Write(make([]byte, 32<<10))
						time.Sleep(3 * wait)
						pw.Write(make([]byte, 10))
						pw.Close()
					}()
					body = pr
				}
				req, _ := http.NewRequest("POST", fmt.Sprintf("http://127.0.0.1:%d%s", port, path), body)
				resp, err := client.Do(req)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				got[name] = fmt.Sprintf("%d %q %v", resp.StatusCode, b, err)
			}
			if got["stock"] != got["orbit"] {
				t.Fatalf("stock: %s; orbit_pool: %s", got["stock"], got["orbit"])
			}
		})
	}
}
