package caddymodule

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/internal/grpcmsg"
	"golang.org/x/net/http2"
)

// grpcHandler: /echo answers each message as it arrives (unary, client and
// bidi streaming, large messages), /server sends five; both end with
// grpc-status and echo the request trailer X-Req-Trailer.
func grpcHandler(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/grpc")
	w.Header().Set("Trailer", "Grpc-Status, X-Got-Trailer")
	w.WriteHeader(http.StatusOK)
	fl := w.(http.Flusher)
	switch r.URL.Path {
	case "/echo":
		grpcmsg.Echo(w, fl.Flush, r.Body, 0)
	case "/server":
		for i := range 5 {
			w.Write(grpcmsg.Frame([]byte(fmt.Sprintf("msg %d", i))))
			fl.Flush()
		}
	}
	io.Copy(io.Discard, r.Body)
	w.Header().Set("X-Got-Trailer", r.Trailer.Get("X-Req-Trailer"))
	w.Header().Set("Grpc-Status", "0")
}

// h2cClient speaks HTTP/2 with prior knowledge to Caddy.
func h2cClient() *http.Client {
	return &http.Client{Transport: &http2.Transport{
		AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	}}
}

// grpcOutcome is what a client sees of one call.
type grpcOutcome struct {
	status  int
	proto   int
	msgs    []string
	grpc    string
	trailer string
}

// bidiCall sends msgs one at a time, each only after the previous one's
// answer came back, which needs both bodies flowing at once.
func bidiCall(t *testing.T, c *http.Client, url string, msgs [][]byte) grpcOutcome {
	t.Helper()
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("POST", url, pr)
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	req.Trailer = http.Header{"X-Req-Trailer": nil}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req = req.WithContext(ctx)
	go pw.Write(grpcmsg.Frame(msgs[0]))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	defer resp.Body.Close()
	o := grpcOutcome{status: resp.StatusCode, proto: resp.ProtoMajor}
	for i := range msgs {
		if i > 0 {
			go pw.Write(grpcmsg.Frame(msgs[i]))
		}
		p, err := grpcmsg.Read(resp.Body)
		if err != nil {
			t.Fatalf("%s: message %d: %v", url, i, err)
		}
		o.msgs = append(o.msgs, fmt.Sprintf("%d:%x", len(p), sha256Sum(p)))
	}
	req.Trailer.Set("X-Req-Trailer", "last")
	pw.Close()
	io.Copy(io.Discard, resp.Body)
	o.grpc, o.trailer = resp.Trailer.Get("Grpc-Status"), resp.Trailer.Get("X-Got-Trailer")
	return o
}

func sha256Sum(p []byte) []byte {
	var x [8]byte
	for i, b := range p {
		x[i%8] ^= b
	}
	return x[:]
}

func serverStreamCall(t *testing.T, c *http.Client, url string) grpcOutcome {
	t.Helper()
	req, _ := http.NewRequest("POST", url, http.NoBody)
	req.Header.Set("Content-Type", "application/grpc")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	defer resp.Body.Close()
	o := grpcOutcome{status: resp.StatusCode, proto: resp.ProtoMajor}
	for {
		p, err := grpcmsg.Read(resp.Body)
		if err != nil {
			break
		}
		o.msgs = append(o.msgs, string(p))
	}
	o.grpc = resp.Trailer.Get("Grpc-Status")
	return o
}

// TestFleetH2CDifferential sends gRPC-style calls (unary, server streaming,
// client streaming, bidi, a large message, trailers both ways) over h2c
// through a fleet of two workers with orbit_pool and through stock Caddy,
// both in front of one h2c upstream, and requires the same outcome.
func TestFleetH2CDifferential(t *testing.T) {
	up := newH2CUpstreamHandler(t, 100, http.HandlerFunc(grpcHandler))
	f := newTestFleet(t, 2)
	f.protocols = "h1 h2c"
	f.writeCaddyfile("h2c://"+up.hostport(), "v1")
	f.launch()
	stockPort := freePort(t)
	startStockWith(t, "\tservers {\n\t\tprotocols h1 h2c\n\t}\n", fmt.Sprintf(":%d {\n\tbind 127.0.0.1\n\treverse_proxy h2c://%s\n}\n", stockPort, up.hostport()))
	stock := fmt.Sprintf("http://127.0.0.1:%d", stockPort)
	waitFor(t, 30*time.Second, "stock caddy to listen", func() bool {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", stockPort))
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<20/16)
	calls := []struct {
		name string
		run  func(c *http.Client, base string) grpcOutcome
	}{
		{"unary", func(c *http.Client, base string) grpcOutcome {
			return bidiCall(t, c, base+"/echo", [][]byte{[]byte("hello")})
		}},
		{"bidi", func(c *http.Client, base string) grpcOutcome {
			var ms [][]byte
			for i := range 10 {
				ms = append(ms, []byte(fmt.Sprintf("m%d", i)))
			}
			return bidiCall(t, c, base+"/echo", ms)
		}},
		{"large", func(c *http.Client, base string) grpcOutcome {
			return bidiCall(t, c, base+"/echo", [][]byte{big, []byte("after")})
		}},
		{"server-stream", func(c *http.Client, base string) grpcOutcome {
			return serverStreamCall(t, c, base+"/server")
		}},
	}
	// Several clients, each a new connection, so that the workers' calls
	// go through the one connection whichever worker owns it.
	for round := range 3 {
		for _, call := range calls {
			want := call.run(h2cClient(), stock)
			got := call.run(h2cClient(), f.url(""))
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("round %d %s: orbit %+v, stock %+v", round, call.name, got, want)
			}
			if want.grpc != "0" || want.status != 200 {
				t.Errorf("round %d %s: stock itself answered %+v", round, call.name, want)
			}
		}
	}
}
