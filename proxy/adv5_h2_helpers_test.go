package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// rawH2 is an h2c upstream written with x/net/http2's Framer, for answers
// a net/http server does not give: a response that is HEADERS with
// END_STREAM and no Content-Length (gRPC's trailers-only), a connection
// cut under streams in flight. Each stream that opens calls handle, in a
// goroutine of its own, once its request has ended (END_STREAM), or at
// once for a path that begins with /early; request bodies are read and
// credited, and on a stream begun early handed to its handler (received).
type rawH2 struct {
	t      testing.TB
	ln     net.Listener
	url    string
	handle func(s *rawStream)

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
	done  chan struct{}
	opens atomic.Int64
	rsts  atomic.Int64
	raws  []*rawConn // guarded by mu
}

type rawStream struct {
	id      uint32
	path    string
	method  string
	bodyLen int
	c       *rawConn
	// received has the request body's DATA as it comes, on a stream
	// begun early, and is closed at its END_STREAM, its RST_STREAM or the
	// connection's end. It holds 64 frames: past that the serve loop drops
	// them rather than wait, so a handler that reads them takes a body of
	// fewer.
	received chan []byte
	ended    bool // received is closed; the serve loop's
}

// end closes received, once; the serve loop's.
func (s *rawStream) end() {
	if s.received != nil && !s.ended {
		s.ended = true
		close(s.received)
	}
}

type rawConn struct {
	nc   net.Conn
	wmu  sync.Mutex
	fr   *http2.Framer
	henc *hpack.Encoder
	hbuf bytes.Buffer
	// acks counts the client's SETTINGS ACKs, opens its streams.
	acks, opens atomic.Int64
	// headerListSize is the SETTINGS_MAX_HEADER_LIST_SIZE the client
	// advertised, 0 until it has.
	headerListSize atomic.Uint32
	// pingsUnanswered, once set, leaves every PING from now on without
	// its ACK (a peer slow to answer, or one that never does).
	pingsUnanswered atomic.Bool
	held            [][8]byte // PINGs left unanswered; guarded by wmu
}

func newRawH2(t testing.TB, handle func(s *rawStream)) *rawH2 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &rawH2{t: t, ln: ln, url: "http://" + ln.Addr().String(), handle: handle, done: make(chan struct{})}
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			u.mu.Lock()
			u.conns = append(u.conns, nc)
			u.mu.Unlock()
			u.wg.Add(1)
			go func() {
				defer u.wg.Done()
				defer nc.Close()
				u.serve(nc)
			}()
		}
	}()
	t.Cleanup(u.close)
	return u
}

func (u *rawH2) close() {
	select {
	case <-u.done:
	default:
		close(u.done)
	}
	u.ln.Close()
	u.cut()
	u.wg.Wait()
}

// setLimit sends SETTINGS_MAX_CONCURRENT_STREAMS on every connection
// open now; new ones get 100.
func (u *rawH2) setLimit(limit uint32) {
	u.mu.Lock()
	raws := append([]*rawConn(nil), u.raws...)
	u.mu.Unlock()
	for _, c := range raws {
		c.wmu.Lock()
		c.fr.WriteSettings(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: limit})
		c.wmu.Unlock()
	}
}

// waitAcked waits until every connection that has opened a stream has
// acknowledged n of the upstream's SETTINGS: its first, then one per
// setLimit. A count over all connections would not do: net/http's client
// at times dials a connection it then closes unused, whose ACK of the
// first SETTINGS counts and of the next never comes.
func (u *rawH2) waitAcked(t testing.TB, n int64, what string) {
	t.Helper()
	waitFor(t, 5*time.Second, what, func() bool {
		u.mu.Lock()
		defer u.mu.Unlock()
		used := 0
		for _, c := range u.raws {
			if c.opens.Load() == 0 {
				continue
			}
			if c.acks.Load() < n {
				return false
			}
			used++
		}
		return used > 0
	})
}

// stopAnsweringPings leaves the PINGs of every connection open now
// without their ACK; connections accepted later answer theirs.
func (u *rawH2) stopAnsweringPings() {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, c := range u.raws {
		c.pingsUnanswered.Store(true)
	}
}

// answerHeldPings answers, late, the PINGs left unanswered, and every
// PING from now on.
func (u *rawH2) answerHeldPings() {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, c := range u.raws {
		c.wmu.Lock()
		c.pingsUnanswered.Store(false)
		for _, d := range c.held {
			c.fr.WritePing(true, d)
		}
		c.held = nil
		c.wmu.Unlock()
	}
}

// cut closes every connection the upstream accepted.
func (u *rawH2) cut() {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, c := range u.conns {
		c.Close()
	}
}

func (u *rawH2) serve(nc net.Conn) {
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(nc, preface); err != nil || string(preface) != http2.ClientPreface {
		return
	}
	c := &rawConn{nc: nc, fr: http2.NewFramer(nc, nc)}
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.henc = hpack.NewEncoder(&c.hbuf)
	u.mu.Lock()
	u.raws = append(u.raws, c)
	u.mu.Unlock()
	c.wmu.Lock()
	c.fr.WriteSettings(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 100})
	c.wmu.Unlock()
	streams := map[uint32]*rawStream{}
	defer func() {
		for _, s := range streams {
			s.end()
		}
	}()
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				if v, ok := f.Value(http2.SettingMaxHeaderListSize); ok {
					c.headerListSize.Store(v)
				}
				c.wmu.Lock()
				c.fr.WriteSettingsAck()
				c.wmu.Unlock()
			} else {
				c.acks.Add(1)
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				c.wmu.Lock()
				if c.pingsUnanswered.Load() {
					c.held = append(c.held, f.Data)
				} else {
					c.fr.WritePing(true, f.Data)
				}
				c.wmu.Unlock()
			}
		case *http2.MetaHeadersFrame:
			s := streams[f.StreamID]
			if s == nil {
				s = &rawStream{id: f.StreamID, path: f.PseudoValue("path"), method: f.PseudoValue("method"), c: c}
				if strings.HasPrefix(s.path, "/early") {
					s.received = make(chan []byte, 64)
				}
				streams[f.StreamID] = s
				u.opens.Add(1)
				c.opens.Add(1)
			}
			if f.StreamEnded() {
				s.end()
			}
			if f.StreamEnded() || strings.HasPrefix(s.path, "/early") {
				u.start(s)
			}
		case *http2.DataFrame:
			s := streams[f.StreamID]
			if n := len(f.Data()); n > 0 {
				c.wmu.Lock()
				c.fr.WriteWindowUpdate(0, uint32(n))
				c.fr.WriteWindowUpdate(f.StreamID, uint32(n))
				c.wmu.Unlock()
				if s != nil {
					s.bodyLen += n
				}
				if s != nil && s.received != nil && !s.ended {
					select {
					case s.received <- bytes.Clone(f.Data()):
					default:
					}
				}
			}
			if f.StreamEnded() && s != nil {
				if s.received != nil {
					s.end()
				} else {
					u.start(s)
				}
			}
		case *http2.RSTStreamFrame:
			u.rsts.Add(1)
			if s := streams[f.StreamID]; s != nil {
				s.end()
			}
		}
	}
}

func (u *rawH2) start(s *rawStream) {
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		u.handle(s)
	}()
}

// headers writes a header block on the stream; pairs are name, value.
func (s *rawStream) headers(end bool, pairs ...string) {
	c := s.c
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: s.id, BlockFragment: c.encode(pairs), EndHeaders: true, EndStream: end})
}

// encode returns the header block of pairs (name, value), valid until the
// next call; c.wmu is held.
func (c *rawConn) encode(pairs []string) []byte {
	c.hbuf.Reset()
	for i := 0; i+1 < len(pairs); i += 2 {
		c.henc.WriteField(hpack.HeaderField{Name: pairs[i], Value: pairs[i+1]})
	}
	return c.hbuf.Bytes()
}

func (s *rawStream) data(end bool, p []byte) error {
	s.c.wmu.Lock()
	defer s.c.wmu.Unlock()
	return s.c.fr.WriteData(s.id, end, p)
}

func (s *rawStream) rst(code http2.ErrCode) {
	s.c.wmu.Lock()
	defer s.c.wmu.Unlock()
	s.c.fr.WriteRSTStream(s.id, code)
}

func (s *rawStream) goAway(last uint32) {
	s.c.wmu.Lock()
	defer s.c.wmu.Unlock()
	s.c.fr.WriteGoAway(last, http2.ErrCodeNo, nil)
}

// outcome is what a caller saw of one exchange, for comparing paths.
type h2Outcome struct {
	status   int
	proto    string
	length   int64
	header   http.Header
	body     string
	trailer  http.Header
	err      string // of RoundTrip or of the body read
	duration time.Duration
}

// roundTripOutcome runs req through rt and reads the whole body.
func roundTripOutcome(rt http.RoundTripper, req *http.Request) h2Outcome {
	start := time.Now()
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return h2Outcome{err: err.Error(), duration: time.Since(start)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	o := h2Outcome{status: resp.StatusCode, proto: resp.Proto, length: resp.ContentLength, header: resp.Header,
		body: string(b), trailer: resp.Trailer, duration: time.Since(start)}
	if err != nil {
		o.err = err.Error()
	}
	return o
}

// h2Paths are the ways eachH2Path sends a request, in its order.
var h2Paths = []string{"x/net", "owner", "sibling"}

// eachH2Path sends the request newReq makes through net/http's own HTTP/2
// client, the owner's exchange and the sibling's (see h2Pair), one after
// another, each within 5s, and returns what each saw, by name.
func eachH2Path(owner, client *member, newReq func(ctx context.Context) *http.Request) map[string]h2Outcome {
	ref := refH2C()
	defer ref.CloseIdleConnections()
	return eachH2PathVia(ref, owner, client, newReq)
}

// eachH2PathVia is eachH2Path with ref for net/http's client.
func eachH2PathVia(ref http.RoundTripper, owner, client *member, newReq func(ctx context.Context) *http.Request) map[string]h2Outcome {
	out := map[string]h2Outcome{}
	for _, name := range h2Paths {
		rt := map[string]http.RoundTripper{"x/net": ref, "owner": owner.tr, "sibling": client.tr}[name]
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		out[name] = roundTripOutcome(rt, newReq(ctx))
		cancel()
	}
	return out
}

// rawH2Outcomes serves answer as an HTTP/2 upstream (h2Pair's warm-up at
// "/" is answered "ok"), sends method path through each of h2Paths
// (eachH2Path), and returns what each saw, and the sibling.
func rawH2Outcomes(t *testing.T, method, path string, answer func(s *rawStream)) (map[string]h2Outcome, *member) {
	t.Helper()
	up := newRawH2(t, func(s *rawStream) {
		if s.path == "/" {
			s.headers(false, ":status", "200", "content-length", "2")
			s.data(true, []byte("ok"))
			return
		}
		answer(s)
	})
	owner, client := h2Pair(t, up.url)
	return eachH2Path(owner, client, func(ctx context.Context) *http.Request {
		req, _ := http.NewRequestWithContext(ctx, method, up.url+path, nil)
		return req
	}), client
}

// refH2C is net/http's own HTTP/2 client (x/net/http2) for h2c upstreams.
func refH2C() *http2.Transport {
	return &http2.Transport{AllowHTTP: true, DisableCompression: true,
		DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}}
}

// stockH2C is net/http's HTTP/2 client for h2c upstreams as Caddy's http
// transport configures it: a net/http Transport, whose ExpectContinueTimeout
// (ect) its HTTP/2 streams keep to, configured with x/net/http2's
// ConfigureTransport, which then runs its h2c streams (not net/http's
// bundled copy of HTTP/2, which differs in places: it keeps a response's
// Connection and Transfer-Encoding headers, which x/net drops).
func stockH2C(t testing.TB, ect time.Duration) *http.Transport {
	t.Helper()
	tr := &http.Transport{ExpectContinueTimeout: ect}
	if err := http2.ConfigureTransport(tr); err != nil {
		t.Fatal(err)
	}
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetUnencryptedHTTP2(true)
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// h2Pair is remotePair over h2c after the owner has made its connection to
// the upstream at url: the client's requests go through the owner.
func h2Pair(t *testing.T, url string) (owner, client *member) {
	t.Helper()
	owner, client = remotePair(t, h2cConf)
	if err := getOK(owner, context.Background(), url+"/"); err != nil {
		t.Fatal(err)
	}
	return owner, client
}

// limitedH2Pair is h2Pair with a response header limit of limit bytes
// (MaxResponseHeaderBytes), and stock's client (stockH2C) with the same.
func limitedH2Pair(t *testing.T, url string, limit int64) (owner, client *member, ref *http.Transport) {
	t.Helper()
	owner, client = remotePair(t, func(tr *Transport) { h2cConf(tr); tr.MaxResponseHeaderBytes = limit })
	if err := getOK(owner, context.Background(), url+"/"); err != nil {
		t.Fatal(err)
	}
	ref = stockH2C(t, 0)
	ref.MaxResponseHeaderBytes = limit
	return owner, client, ref
}

// getVia is a newReq for eachH2PathVia: a GET of url.
func getVia(url string) func(ctx context.Context) *http.Request {
	return func(ctx context.Context) *http.Request {
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		return req
	}
}

// headAsync runs req through rt in the background and delivers its response
// as soon as the head is in (a streaming request's body may still be open),
// or its error.
func headAsync(rt http.RoundTripper, req *http.Request) (<-chan *http.Response, <-chan error) {
	got, errc := make(chan *http.Response, 1), make(chan error, 1)
	go func() {
		resp, err := rt.RoundTrip(req)
		if err != nil {
			errc <- err
			return
		}
		got <- resp
	}()
	return got, errc
}

// goroutinesBackTo waits up to 3s for the process to be back to g0
// goroutines (give or take two), and fails with their stacks if it is not.
func goroutinesBackTo(t *testing.T, g0 int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	g := runtime.NumGoroutine()
	for g > g0+2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		g = runtime.NumGoroutine()
	}
	if g > g0+2 {
		buf := make([]byte, 1<<20)
		st := string(buf[:runtime.Stack(buf, true)])
		t.Errorf("goroutines: %d before, %d after\n%s", g0, g, st[:min(len(st), 10000)])
	}
}

// capacityBack waits until the owner's connections to url have nothing in
// use or pending.
func capacityBack(t testing.TB, owner *member, url string) {
	t.Helper()
	key := mustKey(t, owner.tr, url)
	waitFor(t, 5*time.Second, "every stream's capacity to come back", func() bool {
		c, _ := owner.pool.Candidates(key, nil)
		for _, r := range c {
			if r.InUse != 0 || r.Pending != 0 {
				return false
			}
		}
		return true
	})
}

// h2cServer is net/http's server speaking h2c (prior knowledge) only, with
// h as its handler; it counts connections.
type h2cServer struct {
	url   string
	srv   *http.Server
	conns atomic.Int64
}

func newH2CServer(t testing.TB, h http.HandlerFunc, maxStreams ...int) *h2cServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &h2cServer{url: "http://" + ln.Addr().String()}
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	s.srv = &http.Server{Handler: h, Protocols: &p, ConnState: func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.conns.Add(1)
		}
	}}
	if len(maxStreams) > 0 {
		s.srv.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: maxStreams[0]}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.srv.Serve(ln)
	}()
	t.Cleanup(func() {
		s.srv.Close()
		<-done
	})
	return s
}
