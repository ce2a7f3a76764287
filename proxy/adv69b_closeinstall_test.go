package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// adv69bH2C is an h2c upstream that holds the PING ack of each new
// connection's setup until gate is closed, then answers every request 200
// "ok". It reports how many of its connections are still open.
type adv69bH2C struct {
	addr  string
	mu    sync.Mutex
	open  int
	pings chan struct{}
}

func newAdv69bH2C(t *testing.T, gate chan struct{}) *adv69bH2C {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &adv69bH2C{addr: ln.Addr().String(), pings: make(chan struct{}, 16)}
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		u.mu.Lock()
		defer u.mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.mu.Lock()
			conns = append(conns, c)
			u.open++
			u.mu.Unlock()
			go func() {
				defer func() {
					u.mu.Lock()
					u.open--
					u.mu.Unlock()
				}()
				defer c.Close()
				preface := make([]byte, len(http2.ClientPreface))
				if _, err := io.ReadFull(c, preface); err != nil {
					return
				}
				var wmu sync.Mutex
				fr := http2.NewFramer(c, c)
				fr.WriteSettings()
				for {
					f, err := fr.ReadFrame()
					if err != nil {
						return
					}
					switch f := f.(type) {
					case *http2.SettingsFrame:
						if !f.IsAck() {
							wmu.Lock()
							fr.WriteSettingsAck()
							wmu.Unlock()
						}
					case *http2.PingFrame:
						if !f.IsAck() {
							data := f.Data
							select {
							case u.pings <- struct{}{}:
							default:
							}
							go func() {
								<-gate
								wmu.Lock()
								fr.WritePing(true, data)
								wmu.Unlock()
							}()
						}
					case *http2.HeadersFrame:
						var hb bytes.Buffer
						enc := hpack.NewEncoder(&hb)
						enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
						enc.WriteField(hpack.HeaderField{Name: "content-length", Value: "2"})
						wmu.Lock()
						fr.WriteHeaders(http2.HeadersFrameParam{StreamID: f.StreamID, BlockFragment: hb.Bytes(), EndHeaders: true})
						fr.WriteData(f.StreamID, true, []byte("ok"))
						wmu.Unlock()
					}
				}
			}()
		}
	}()
	return u
}

func (u *adv69bH2C) openConns() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.open
}

// TestAdv69bH2InstallAfterClose: an h2c connection whose setup (SETTINGS,
// PING) is still under way when Node.Close runs is not installed after it,
// as an HTTP/1.1 one is not (install refuses once Close has begun): once
// the request has ended, the node owns no connection and the upstream sees
// its connection closed. Otherwise nothing would ever close it.
func TestAdv69bH2InstallAfterClose(t *testing.T) {
	gate := make(chan struct{})
	gateOnce := sync.OnceFunc(func() { close(gate) })
	defer gateOnce()
	up := newAdv69bH2C(t, gate)
	m := newMember(t, testSpecLocal, func(tr *Transport) { tr.H2C = true })
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+up.addr+"/", nil)
		resp, err := m.tr.RoundTrip(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	select {
	case <-up.pings:
	case <-time.After(3 * time.Second):
		t.Fatal("the h2c setup's PING never came")
	}
	closed := make(chan struct{})
	go func() {
		m.node.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(3 * time.Second):
		t.Fatal("Close did not return while a dial's setup was under way")
	}
	gateOnce()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the request never ended")
	}
	time.Sleep(100 * time.Millisecond)
	if o := m.node.open.Load(); o != 0 {
		t.Errorf("n.open = %d after Close and the request's end; want 0", o)
	}
	if s := m.node.Stats(); s.OpenConns != 0 {
		t.Errorf("Stats().OpenConns = %d after Close and the request's end; want 0", s.OpenConns)
	}
	waitFor(t, 2*time.Second, "the upstream to see its connection closed after Close", func() bool { return up.openConns() == 0 })
}

// TestAdv69bH1InstallAfterClose: the HTTP/1.1 counterpart (in the table,
// and outside a full one): a TLS dial whose handshake is under way when
// Node.Close runs leaves nothing open once the request has ended.
func TestAdv69bH1InstallAfterClose(t *testing.T) {
	for _, full := range []bool{false, true} {
		name := "room"
		if full {
			name = "full"
		}
		t.Run(name, func(t *testing.T) {
			gate := make(chan struct{})
			gateOnce := sync.OnceFunc(func() { close(gate) })
			defer gateOnce()
			release := make(chan struct{})
			relOnce := sync.OnceFunc(func() { close(release) })
			defer relOnce()
			hello := make(chan struct{}, 4)
			var armed atomic.Bool
			var openUp atomic.Int32
			ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/stream" {
					io.WriteString(w, "first")
					w.(http.Flusher).Flush()
					<-release
					return
				}
				io.WriteString(w, "ok")
			}))
			ts.TLS = &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
				if armed.Load() {
					hello <- struct{}{}
					<-gate
				}
				return nil, nil
			}}
			ts.Config.ConnState = func(_ net.Conn, s http.ConnState) {
				switch s {
				case http.StateNew:
					openUp.Add(1)
				case http.StateClosed, http.StateHijacked:
					openUp.Add(-1)
				}
			}
			ts.StartTLS()
			defer ts.Close()
			roots := x509.NewCertPool()
			roots.AddCert(ts.Certificate())
			tc := &tls.Config{RootCAs: roots}
			m := newMember(t, adv69bSpec, func(tr *Transport) { tr.TLSClientConfig = tc })
			if full {
				holdStreams(t, m, ts.URL, 2)
			}
			armed.Store(true)
			done := make(chan error, 1)
			go func() {
				_, _, err := adv10Do(t, m.tr, "GET", ts.URL+"/x", nil)
				done <- err
			}()
			select {
			case <-hello:
			case <-time.After(3 * time.Second):
				t.Fatal("no handshake")
			}
			armed.Store(false)
			closed := make(chan struct{})
			go func() { m.node.Close(); close(closed) }()
			select {
			case <-closed:
			case <-time.After(3 * time.Second):
				t.Fatal("Close did not return")
			}
			gateOnce()
			var err error
			select {
			case err = <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("the request never ended")
			}
			relOnce()
			waitFor(t, 2*time.Second, "n.open to reach 0", func() bool { return m.node.open.Load() == 0 })
			if sp := m.node.spares.len(); sp != 0 {
				t.Fatalf("%d spares after Close (request err %v)", sp, err)
			}
			waitFor(t, 3*time.Second, "the upstream to see every connection closed", func() bool { return openUp.Load() == 0 })
		})
	}
}
