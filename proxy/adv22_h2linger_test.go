package proxy

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"
)

// TestAdv22H2TLSLingeringEmptyResponse: an https upstream (h2 by ALPN)
// allows one stream per connection and answers /linger with a head that
// says Content-Length: 0 (or any answer to HEAD), then keeps the stream
// open for a second before ending it. Orbit hands such a response back at
// once and gives its unit of capacity back (useH2: "no body to read"), while
// the ClientConn still counts the stream until END_STREAM. The next request
// must not wait for that stream to end: stock net/http over TLS, against
// the same upstream, serves it at once (on another connection).
func TestAdv22H2TLSLingeringEmptyResponse(t *testing.T) {
	for _, method := range []string{"GET", "HEAD"} {
		t.Run(method, func(t *testing.T) {
			up := newAdv22TLSRestarting(t, func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/linger" {
					w.Header().Set("Content-Length", "0")
					w.WriteHeader(http.StatusOK)
					w.(http.Flusher).Flush()
					time.Sleep(time.Second)
					return
				}
				io.WriteString(w, "ok")
			}, 0, time.Second, 1)
			stock := up.stock()
			defer stock.CloseIdleConnections()
			m := newMemberOpts(t, testSpecLocal, NodeOptions{SweepInterval: 50 * time.Millisecond}, up.conf)
			var lat [2]time.Duration
			for i, rt := range []http.RoundTripper{stock, m.tr} {
				// Warm: one connection, idle.
				if err := adv21Get(rt, context.Background(), up.url+"/"); err != nil {
					t.Fatal(err)
				}
				req, _ := http.NewRequest(method, up.url+"/linger", nil)
				resp, err := rt.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				if resp.ProtoMajor != 2 {
					t.Fatalf("%s", resp.Proto)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				err = adv21Get(rt, ctx, up.url+"/")
				cancel()
				lat[i] = time.Since(start)
				if err != nil {
					t.Errorf("request %d after the lingering response: %v", i, err)
				}
				time.Sleep(1200 * time.Millisecond) // let /linger end before the next transport's turn
			}
			t.Logf("h2Wrapped=%v %s: next request after a lingering empty response: stock %v, orbit %v", h2Wrapped, method, lat[0], lat[1])
			if lat[1] > 500*time.Millisecond && lat[0] < 200*time.Millisecond {
				t.Errorf("orbit's next request waited %v for the lingering stream to end; stock served it in %v", lat[1], lat[0])
			}
		})
	}
}

// TestAdv22H2LingeringEmptyResponseRaw: as above against a scripted h2c
// upstream that allows one stream per connection and answers /linger with
// HEADERS (Content-Length: 0) without END_STREAM, ending the stream a
// second later with an empty DATA frame: a response orbit returns, and
// whose unit it gives back, at once.
func TestAdv22H2LingeringEmptyResponseRaw(t *testing.T) {
	up := newRawH2(t, func(s *rawStream) {
		if s.path == "/linger" {
			s.headers(false, ":status", "200", "content-length", "0")
			time.Sleep(time.Second)
			s.data(true, nil)
			return
		}
		s.headers(false, ":status", "200")
		s.data(true, []byte("ok"))
	})
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	stock := &http.Transport{Protocols: &p}
	defer stock.CloseIdleConnections()
	m := newMemberOpts(t, testSpecLocal, NodeOptions{SweepInterval: 50 * time.Millisecond}, h2cConf)
	var lat [2]time.Duration
	for i, rt := range []http.RoundTripper{stock, m.tr} {
		if err := adv21Get(rt, context.Background(), up.url+"/"); err != nil {
			t.Fatal(err)
		}
		up.setLimit(1)
		time.Sleep(100 * time.Millisecond)
		req, _ := http.NewRequest("GET", up.url+"/linger", nil)
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		err = adv21Get(rt, ctx, up.url+"/")
		cancel()
		lat[i] = time.Since(start)
		if err != nil {
			t.Errorf("transport %d: request after the lingering response: %v", i, err)
		}
		time.Sleep(1200 * time.Millisecond)
	}
	t.Logf("h2Wrapped=%v next request after a lingering empty response: stock %v, orbit %v (orbit created %d; upstream conns %d)", h2Wrapped, lat[0], lat[1], m.node.Stats().Created, len(up.conns))
	if lat[1] > 500*time.Millisecond && lat[0] < 200*time.Millisecond {
		t.Errorf("orbit's next request waited %v for the lingering stream to end; stock served it in %v", lat[1], lat[0])
	}
}
