// Package upstream is the demo and test upstream of orbit's scenarios: an
// HTTP/1.1 server on loopback that counts what a proxy fleet costs it —
// connections accepted, open and at peak, TLS handshakes, requests — and can
// refuse connections beyond a cap, as a small real upstream would.
//
// Routes:
//
//	/                 a short body, after the configured delay
//	/bytes?n=N        N bytes
//	/echo             the request body back, once it has all arrived
//	/stream?n=N&gap=D N chunks, flushed D apart
//	/status?code=C    an empty response with status C
//	/ws               a WebSocket-style upgrade that echoes bytes
//	/grpc             gRPC-style unary echo: each 5-byte-prefixed message
//	                  back as it arrives, then the grpc-status trailer
//
// With Options.H2C it speaks HTTP/2 with prior knowledge (and HTTP/1.1) and
// counts concurrent streams too.
package upstream

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/orbitproxy/orbit/internal/grpcmsg"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"
)

// Options configures a Server.
type Options struct {
	// Addr to listen on. Default 127.0.0.1:0.
	Addr string
	// TLS serves HTTPS with a fresh self-signed certificate.
	TLS bool
	// MaxConns, if positive, makes the server close at once any connection
	// accepted while MaxConns are open, counting it as refused.
	MaxConns int
	// Delay is added before answering "/" and "/grpc".
	Delay time.Duration
	// H2C serves HTTP/2 with prior knowledge as well as HTTP/1.1, with
	// MaxStreams concurrent streams per connection (default 100).
	H2C        bool
	MaxStreams uint32
	// Gather, if positive, holds every call to "/" and "/grpc", after
	// Delay, until Gather requests have been in progress at once, or for
	// GatherWait (default 1s) at most. A test that asserts how a proxy
	// carries a load of that many requests in flight then gets that load
	// however slowly the machine lets the proxy forward it, where a
	// delay alone gets it only at the speed the test was written on.
	Gather     int
	GatherWait time.Duration
}

// Stats is what the server counted since it started.
type Stats struct {
	Accepted    int64 // TCP connections accepted and kept
	Refused     int64 // TCP connections closed at once for MaxConns
	Open        int64 // open now
	Peak        int64 // most open at once
	Handshakes  int64 // TLS handshakes completed
	Resumed     int64 // of which resumed a session
	Requests    int64 // HTTP requests served
	Streams     int64 // requests in progress now
	PeakStreams int64 // most requests in progress at once (HTTP/2 streams, for H2C)
	// Busy is the time requests spent in the server's handlers, summed
	// over requests: against the time connections were open, how much of
	// it they carried a request.
	Busy time.Duration
}

// Server is a running upstream.
type Server struct {
	// URL is where it serves, e.g. http://127.0.0.1:41234.
	URL string
	// Addr is its listening address.
	Addr string
	// CertPool trusts its certificate, for TLS clients.
	CertPool *x509.CertPool

	delay atomic.Int64
	max   int64
	// gathered is closed once Options.Gather requests were in progress
	// at once (nil without Gather).
	gather     int64
	gatherWait time.Duration
	gathered   chan struct{}
	gatherOnce sync.Once
	stats      struct {
		accepted, refused, open, peak, handshakes, resumed, requests atomic.Int64
		streams, peakStreams, busy                                   atomic.Int64
	}
	ln   net.Listener
	srv  *http.Server
	done chan struct{}
}

// Start runs a server until Close.
func Start(o Options) (*Server, error) {
	if o.Addr == "" {
		o.Addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		return nil, fmt.Errorf("upstream: listen: %w", err)
	}
	s := &Server{Addr: ln.Addr().String(), max: int64(o.MaxConns), done: make(chan struct{})}
	s.delay.Store(int64(o.Delay))
	if o.Gather > 0 {
		s.gather, s.gatherWait, s.gathered = int64(o.Gather), o.GatherWait, make(chan struct{})
		if s.gatherWait <= 0 {
			s.gatherWait = time.Second
		}
	}
	s.ln = &countingListener{Listener: ln, s: s}
	s.srv = &http.Server{Handler: s.routes(), ReadHeaderTimeout: 10 * time.Second}
	scheme := "http"
	if o.H2C {
		ms := o.MaxStreams
		if ms == 0 {
			ms = 100
		}
		s.srv.Handler = h2c.NewHandler(s.srv.Handler, &http2.Server{MaxConcurrentStreams: ms})
	}
	if o.TLS {
		cert, pool, err := selfSigned()
		if err != nil {
			ln.Close()
			return nil, err
		}
		s.CertPool = pool
		s.srv.TLSConfig = &tls.Config{
			Certificates: []tls.Certificate{cert},
			NextProtos:   []string{"http/1.1"},
			VerifyConnection: func(cs tls.ConnectionState) error {
				s.stats.handshakes.Add(1)
				if cs.DidResume {
					s.stats.resumed.Add(1)
				}
				return nil
			},
		}
		s.ln = tls.NewListener(s.ln, s.srv.TLSConfig)
		scheme = "https"
	}
	s.URL = scheme + "://" + s.Addr
	go func() {
		defer close(s.done)
		s.srv.Serve(s.ln)
	}()
	return s, nil
}

// SetDelay changes the delay of "/".
func (s *Server) SetDelay(d time.Duration) { s.delay.Store(int64(d)) }

// Stats reads the counters.
func (s *Server) Stats() Stats {
	return Stats{
		Accepted:    s.stats.accepted.Load(),
		Refused:     s.stats.refused.Load(),
		Open:        s.stats.open.Load(),
		Peak:        s.stats.peak.Load(),
		Handshakes:  s.stats.handshakes.Load(),
		Resumed:     s.stats.resumed.Load(),
		Requests:    s.stats.requests.Load(),
		Streams:     s.stats.streams.Load(),
		PeakStreams: s.stats.peakStreams.Load(),
		Busy:        time.Duration(s.stats.busy.Load()),
	}
}

// Close stops the server and closes every connection.
func (s *Server) Close() error {
	err := s.srv.Close()
	<-s.done
	return err
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	count := func(h http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			s.stats.requests.Add(1)
			n := s.stats.streams.Add(1)
			start := time.Now()
			defer func() {
				s.stats.streams.Add(-1)
				s.stats.busy.Add(int64(time.Since(start)))
			}()
			for p := s.stats.peakStreams.Load(); n > p && !s.stats.peakStreams.CompareAndSwap(p, n); p = s.stats.peakStreams.Load() {
			}
			if s.gathered != nil && n >= s.gather {
				s.gatherOnce.Do(func() { close(s.gathered) })
			}
			h(w, r)
		}
	}
	mux.HandleFunc("/", count(func(w http.ResponseWriter, r *http.Request) {
		s.wait(r)
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "hello from the upstream\n")
	}))
	mux.HandleFunc("/bytes", count(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		io.CopyN(w, zeros{}, n)
	}))
	mux.HandleFunc("/echo", count(func(w http.ResponseWriter, r *http.Request) {
		// Read the whole body before answering: an HTTP/1.1 server that
		// answers while the request is still arriving is not something a
		// proxy can be held to (net/http's own server stops reading then).
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.Write(b)
	}))
	mux.HandleFunc("/stream", count(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		gap, _ := time.ParseDuration(r.URL.Query().Get("gap"))
		rc := http.NewResponseController(w)
		for i := range n {
			fmt.Fprintf(w, "chunk %d\n", i)
			rc.Flush()
			time.Sleep(gap)
		}
	}))
	mux.HandleFunc("/status", count(func(w http.ResponseWriter, r *http.Request) {
		code, err := strconv.Atoi(r.URL.Query().Get("code"))
		if err != nil || code < 200 || code > 599 {
			code = http.StatusBadRequest
		}
		w.WriteHeader(code)
	}))
	mux.HandleFunc("/ws", count(wsEcho))
	mux.HandleFunc("/grpc", count(func(w http.ResponseWriter, r *http.Request) {
		s.wait(r)
		w.Header().Set("Content-Type", "application/grpc")
		w.Header().Set("Trailer", "Grpc-Status")
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		grpcmsg.Echo(w, func() { rc.Flush() }, r.Body, 0)
		w.Header().Set("Grpc-Status", "0")
	}))
	return mux
}

// wait holds a call to "/" or "/grpc" for the delay, then until the
// requests in progress were Options.Gather at once (or GatherWait has
// passed, or the request's context ended).
func (s *Server) wait(r *http.Request) {
	if d := time.Duration(s.delay.Load()); d > 0 {
		hold(d)
	}
	if s.gathered == nil {
		return
	}
	select {
	case <-s.gathered:
		return // the common case once the load has gathered: no timer
	default:
	}
	t := time.NewTimer(s.gatherWait)
	defer t.Stop()
	select {
	case <-s.gathered:
	case <-t.C:
	case <-r.Context().Done():
	}
}

// wsEcho answers an Upgrade with 101 and echoes bytes until the client
// half-closes; enough of WebSocket to prove a proxy's tunnel, without frames.
func wsEcho(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Upgrade") == "" {
		http.Error(w, "upgrade required", http.StatusUpgradeRequired)
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", r.Header.Get("Upgrade"))
	brw.Flush()
	io.Copy(conn, brw.Reader) // the reader drains its buffer, then the conn
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// countingListener counts and caps accepted connections.
type countingListener struct {
	net.Listener
	s *Server
}

func (l *countingListener) Accept() (net.Conn, error) {
	st := &l.s.stats
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		open := st.open.Add(1)
		if l.s.max > 0 && open > l.s.max {
			st.open.Add(-1)
			st.refused.Add(1)
			c.Close()
			continue
		}
		st.accepted.Add(1)
		for {
			p := st.peak.Load()
			if open <= p || st.peak.CompareAndSwap(p, open) {
				break
			}
		}
		return &countedConn{Conn: c, open: &st.open}, nil
	}
}

type countedConn struct {
	net.Conn
	open *atomic.Int64
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.open.Add(-1) })
	return c.Conn.Close()
}

func selfSigned() (tls.Certificate, *x509.CertPool, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "orbit demo upstream"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("upstream: certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool, nil
}
