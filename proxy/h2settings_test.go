package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// frameUpstream is an h2c upstream written at the frame level with
// x/net/http2's Framer, so that a test decides when SETTINGS go out and sees
// when the client acknowledges them. It checks the client against the limit
// the client has acknowledged: every HEADERS that opens a stream is counted
// against SETTINGS_MAX_CONCURRENT_STREAMS as of the client's latest ACK.
// A stream's response is sent after hold, or, for /hold, when release is
// closed; a stream stops counting just before its END_STREAM is written, so
// the count here never exceeds the client's own.
type frameUpstream struct {
	t       testing.TB
	ln      net.Listener
	url     string
	hold    time.Duration
	release chan struct{}

	mu        sync.Mutex
	limit     uint32 // announced last
	conns     []*frameConn
	served    int // responses ended
	acked     int // SETTINGS changes (after the first) acknowledged, all connections
	violation []string
	resets    int  // RST_STREAM frames from clients
	resetsOK  bool // set before use: resets are expected
	wg        sync.WaitGroup
	done      chan struct{}
}

type frameConn struct {
	u    *frameUpstream
	c    net.Conn
	wmu  sync.Mutex // the framer's writes and the encoder
	fr   *http2.Framer
	henc *hpack.Encoder
	hbuf bytes.Buffer

	// guarded by u.mu
	sent     []uint32 // limits announced and not yet acknowledged, in order
	enforced uint32   // the limit the client acknowledged last; 0: none yet
	open     int
	peak     int // streams open when one opened, at most, since the last ACK
	reqEnded map[uint32]bool
}

func newFrameUpstream(t testing.TB, limit uint32, hold time.Duration) *frameUpstream {
	return newFrameUpstreamTLS(t, limit, hold, nil)
}

// newFrameUpstreamTLS is newFrameUpstream over TLS with cfg (ALPN h2), or
// h2c for a nil cfg.
func newFrameUpstreamTLS(t testing.TB, limit uint32, hold time.Duration, cfg *tls.Config) *frameUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	if cfg != nil {
		cfg = cfg.Clone()
		cfg.NextProtos = []string{http2.NextProtoTLS}
		ln = tls.NewListener(ln, cfg)
		url = "https://" + ln.Addr().String()
	}
	u := &frameUpstream{t: t, ln: ln, url: url, hold: hold, limit: limit,
		release: make(chan struct{}), done: make(chan struct{})}
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fc := &frameConn{u: u, c: c, reqEnded: map[uint32]bool{}}
			fc.fr = http2.NewFramer(c, c)
			fc.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
			fc.henc = hpack.NewEncoder(&fc.hbuf)
			u.mu.Lock()
			u.conns = append(u.conns, fc)
			u.mu.Unlock()
			u.wg.Add(1)
			go func() {
				defer u.wg.Done()
				fc.serve()
			}()
		}
	}()
	t.Cleanup(u.close)
	return u
}

func (u *frameUpstream) close() {
	close(u.done)
	u.ln.Close()
	u.mu.Lock()
	for _, fc := range u.conns {
		fc.c.Close()
	}
	u.mu.Unlock()
	u.wg.Wait()
}

func (u *frameUpstream) fail(format string, args ...any) {
	u.violation = append(u.violation, fmt.Sprintf(format, args...))
}

// setLimit announces a new SETTINGS_MAX_CONCURRENT_STREAMS on every
// connection.
func (u *frameUpstream) setLimit(limit uint32) {
	u.mu.Lock()
	u.limit = limit
	conns := append([]*frameConn(nil), u.conns...)
	for _, fc := range conns {
		fc.sent = append(fc.sent, limit)
	}
	u.mu.Unlock()
	for _, fc := range conns {
		fc.wmu.Lock()
		fc.fr.WriteSettings(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: limit})
		fc.wmu.Unlock()
	}
}

func (u *frameUpstream) stats() (conns, served, acked int, violations []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.conns), u.served, u.acked, append([]string(nil), u.violation...)
}

// peakSinceAck is the most streams open on any connection when a stream
// opened since that connection's last acknowledged SETTINGS.
func (u *frameUpstream) peakSinceAck() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	p := 0
	for _, fc := range u.conns {
		p = max(p, fc.peak)
	}
	return p
}

func (fc *frameConn) serve() {
	u := fc.u
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(fc.c, preface); err != nil || string(preface) != http2.ClientPreface {
		return
	}
	u.mu.Lock()
	fc.sent = append(fc.sent, u.limit)
	limit := u.limit
	u.mu.Unlock()
	fc.wmu.Lock()
	fc.fr.WriteSettings(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: limit})
	fc.wmu.Unlock()
	first := true
	for {
		f, err := fc.fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fc.wmu.Lock()
				fc.fr.WriteSettingsAck()
				fc.wmu.Unlock()
				continue
			}
			u.mu.Lock()
			if len(fc.sent) == 0 {
				u.fail("an ACK for SETTINGS never sent")
			} else {
				fc.enforced, fc.sent = fc.sent[0], fc.sent[1:]
				fc.peak = 0
				if !first {
					u.acked++
				}
			}
			first = false
			u.mu.Unlock()
		case *http2.PingFrame:
			if !f.IsAck() {
				fc.wmu.Lock()
				fc.fr.WritePing(true, f.Data)
				fc.wmu.Unlock()
			}
		case *http2.MetaHeadersFrame:
			id := f.StreamID
			u.mu.Lock()
			fc.open++
			fc.peak = max(fc.peak, fc.open)
			if fc.enforced > 0 && fc.open > int(fc.enforced) {
				u.fail("stream %d opened with %d open, limit %d acknowledged", id, fc.open, fc.enforced)
			}
			fc.reqEnded[id] = f.StreamEnded()
			path := f.PseudoValue("path")
			u.mu.Unlock()
			if f.StreamEnded() {
				fc.respond(id, path)
			} else {
				u.mu.Lock()
				u.fail("stream %d: request with a body", id)
				u.mu.Unlock()
			}
		case *http2.RSTStreamFrame:
			u.mu.Lock()
			u.resets++
			if !u.resetsOK {
				u.fail("stream %d reset by the client: %v", f.StreamID, f.ErrCode)
			}
			u.mu.Unlock()
		}
	}
}

// respond answers stream id after the hold (or the release, for /hold).
func (fc *frameConn) respond(id uint32, path string) {
	u := fc.u
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		if path == "/flood" {
			u.flood(fc, id)
			return
		}
		fc.wmu.Lock()
		fc.hbuf.Reset()
		fc.henc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
		fc.henc.WriteField(hpack.HeaderField{Name: "content-type", Value: "text/plain"})
		fc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: fc.hbuf.Bytes(), EndHeaders: true})
		fc.wmu.Unlock()
		wait := time.After(u.hold)
		var rel chan struct{}
		if path == "/hold" {
			wait, rel = nil, u.release
		}
		select {
		case <-wait:
		case <-rel:
		case <-u.done:
			return
		}
		u.mu.Lock()
		fc.open--
		u.served++
		u.mu.Unlock()
		fc.wmu.Lock()
		fc.fr.WriteData(id, true, []byte("ok"))
		fc.wmu.Unlock()
	}()
}

// flood answers stream id with interim responses (103, a 1 KiB field
// each) until 16 MiB went out or the client reset the stream or left, and
// never a final one. The stream stops counting as open either way.
func (u *frameUpstream) flood(fc *frameConn, id uint32) {
	defer func() {
		u.mu.Lock()
		fc.open--
		u.mu.Unlock()
	}()
	for range 16 << 10 {
		fc.wmu.Lock()
		fc.hbuf.Reset()
		fc.henc.WriteField(hpack.HeaderField{Name: ":status", Value: "103"})
		fc.henc.WriteField(hpack.HeaderField{Name: "link", Value: strings.Repeat("x", 1024)})
		err := fc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: fc.hbuf.Bytes(), EndHeaders: true})
		fc.wmu.Unlock()
		if err != nil {
			return
		}
		select {
		case <-u.done:
			return
		default:
		}
	}
}

func h2ID(t testing.TB, m *member, url string) orbitpool.ResourceID {
	t.Helper()
	c, err := m.pool.Candidates(mustKey(t, m.tr, url), nil)
	if err != nil || len(c) == 0 {
		t.Fatalf("candidates: %v, %v", c, err)
	}
	return c[0].ID
}

func getOK(m *member, ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return err
	}
	resp, err := m.tr.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != 200 || string(b) != "ok" || resp.ProtoMajor != 2 {
		return fmt.Errorf("%s %d %q", resp.Proto, resp.StatusCode, b)
	}
	return nil
}

// TestH2CPeerLowersStreamLimitUnderLoad: an upstream lowers
// SETTINGS_MAX_CONCURRENT_STREAMS from 8 to 2 while two members keep twelve
// requests running on its one connection, then raises it to 6. The pool's
// capacity follows each change, the connection never carries more streams
// than the limit the client acknowledged, the raise is used, and no request
// fails.
func TestH2CPeerLowersStreamLimitUnderLoad(t *testing.T) {
	up := newFrameUpstream(t, 8, 3*time.Millisecond)
	owner, client := remotePair(t, h2cConf)
	if err := getOK(owner, context.Background(), up.url+"/"); err != nil {
		t.Fatal(err)
	}
	id := h2ID(t, owner, up.url)
	if c, err := owner.pool.Capacity(id); err != nil || c != 8 {
		t.Fatalf("capacity %d, %v: want the announced 8", c, err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var ok, failed atomic.Int64
	for i := range 12 {
		m := []*member{owner, client}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				err := getOK(m, ctx, up.url+"/")
				cancel()
				if err != nil {
					failed.Add(1)
					t.Errorf("request: %v", err)
					return
				}
				ok.Add(1)
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()
	served := func() int { _, s, _, _ := up.stats(); return s }
	acked := func() int { _, _, a, _ := up.stats(); return a }

	waitFor(t, 10*time.Second, "load at the first limit", func() bool { return served() >= 60 && up.peakSinceAck() > 2 })
	up.setLimit(2)
	waitFor(t, 10*time.Second, "the client to acknowledge the lower limit", func() bool { return acked() == 1 })
	ackAt := time.Now()
	waitFor(t, 5*time.Second, "the pool's capacity to follow down", func() bool { c, _ := owner.pool.Capacity(id); return c == 2 })
	lag := time.Since(ackAt)
	base := served()
	waitFor(t, 10*time.Second, "load at the lower limit", func() bool { return served() >= base+60 })
	if p := up.peakSinceAck(); p > 2 {
		t.Errorf("%d streams at once after the client acknowledged limit 2", p)
	}
	if c, _ := owner.pool.Candidates(mustKey(t, owner.tr, up.url), nil); len(c) != 1 || c[0].InUse+c[0].Pending > 2 {
		t.Errorf("pool after the lower limit settled: %+v, want one connection with at most 2 in use", c)
	}

	up.setLimit(6)
	waitFor(t, 10*time.Second, "the client to acknowledge the raise", func() bool { return acked() == 2 })
	waitFor(t, 5*time.Second, "the pool's capacity to follow up", func() bool { c, _ := owner.pool.Capacity(id); return c == 6 })
	waitFor(t, 10*time.Second, "the raised limit to be used", func() bool { return up.peakSinceAck() > 2 })
	close(stop)
	wg.Wait()
	stop = make(chan struct{})

	conns, total, _, violations := up.stats()
	for _, v := range violations {
		t.Error(v)
	}
	if conns != 1 || failed.Load() != 0 || up.peakSinceAck() > 6 {
		t.Errorf("%d connections, %d failed requests, peak %d after the raise: want 1, 0, <= 6", conns, failed.Load(), up.peakSinceAck())
	}
	t.Logf("%d requests, %d streams served; capacity followed the ACK within %v", ok.Load(), total, lag)
}

// TestH2CFollowsSettingsWhileStreamsHold: the pool follows a lower limit
// while no stream starts or ends and the sweep is a minute away, so a
// sibling's request is not granted a stream the connection cannot open: it
// dials a second connection and completes while the first one's streams are
// still held. Over h2c and over TLS (ALPN h2), where the watch sits under
// crypto/tls.
func TestH2CFollowsSettingsWhileStreamsHold(t *testing.T) {
	t.Run("h2c", func(t *testing.T) { testFollowsSettingsWhileStreamsHold(t, false) })
	t.Run("h2", func(t *testing.T) { testFollowsSettingsWhileStreamsHold(t, true) })
}

func testFollowsSettingsWhileStreamsHold(t *testing.T, useTLS bool) {
	var up *frameUpstream
	conf := func(tr *Transport) { tr.H2C = true; tr.MaxConnsPerKey = 2 }
	if useTLS {
		// httptest's certificate, for 127.0.0.1.
		ts := httptest.NewUnstartedServer(nil)
		ts.StartTLS()
		cfg := ts.TLS
		roots := x509.NewCertPool()
		roots.AddCert(ts.Certificate())
		ts.Close()
		up = newFrameUpstreamTLS(t, 4, time.Millisecond, cfg)
		conf = func(tr *Transport) {
			tr.HTTP2 = true
			tr.MaxConnsPerKey = 2
			tr.TLSClientConfig = &tls.Config{RootCAs: roots}
		}
	} else {
		up = newFrameUpstream(t, 4, time.Millisecond)
	}
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	opts := NodeOptions{SweepInterval: time.Minute}
	owner := newMemberOpts(t, spec, opts, conf)
	client := newMemberOpts(t, spec, opts, conf)
	if err := getOK(owner, context.Background(), up.url+"/"); err != nil {
		t.Fatal(err)
	}

	held := make(chan error, 3)
	bodies := make(chan *http.Response, 3)
	for range 3 {
		go func() {
			req, _ := http.NewRequest("GET", up.url+"/hold", nil)
			resp, err := owner.tr.RoundTrip(req)
			if err != nil {
				held <- err
				return
			}
			bodies <- resp
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil && string(b) != "ok" {
				err = fmt.Errorf("body %q", b)
			}
			held <- err
		}()
	}
	for range 3 {
		select {
		case <-bodies:
		case err := <-held:
			t.Fatalf("held stream: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("held streams did not start")
		}
	}
	if conns, _, _, _ := up.stats(); conns != 1 {
		t.Fatalf("%d connections for three streams under limit 4, want 1", conns)
	}
	id := h2ID(t, owner, up.url)
	up.setLimit(1)
	waitFor(t, 10*time.Second, "the client to acknowledge the lower limit", func() bool { _, _, a, _ := up.stats(); return a == 1 })
	ackAt := time.Now()
	waitFor(t, 2*time.Second, "the pool's capacity to follow with no stream ending", func() bool { c, _ := owner.pool.Capacity(id); return c == 1 })
	lag := time.Since(ackAt)
	if _, served, _, _ := up.stats(); served != 1 {
		t.Fatalf("%d streams ended besides the first request: the test wants none to", served-1)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := getOK(client, ctx, up.url+"/"); err != nil {
		t.Fatalf("sibling's request while the first connection is full: %v", err)
	}
	if conns, _, _, _ := up.stats(); conns != 2 {
		t.Fatalf("%d connections: want a second one for the request the first could not take", conns)
	}
	close(up.release)
	for range 3 {
		if err := <-held; err != nil {
			t.Fatalf("held stream: %v", err)
		}
	}
	_, _, _, violations := up.stats()
	for _, v := range violations {
		t.Error(v)
	}
	t.Logf("capacity followed the ACK within %v, no stream ending", lag)
}

// TestH2InterimFloodBounded: an upstream that answers with interim
// responses without end is cut off by the header limit, as net/http's
// HTTP/2 client does, locally and through a sibling; the stream is reset
// and the connection keeps serving.
func TestH2InterimFloodBounded(t *testing.T) {
	up := newFrameUpstream(t, 100, time.Millisecond)
	up.resetsOK = true
	owner, client := remotePair(t, func(tr *Transport) {
		tr.H2C = true
		tr.MaxResponseHeaderBytes = 256 << 10
	})
	if err := getOK(owner, context.Background(), up.url+"/"); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*member{owner, client} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		start := time.Now()
		err := getOK(m, ctx, up.url+"/flood")
		expired := ctx.Err() != nil
		cancel()
		if err == nil || expired {
			t.Fatalf("local %v: a flood of interim responses gave %v after %v; want an error before the deadline", m == owner, err, time.Since(start))
		}
		t.Logf("local %v: %v after %v", m == owner, err, time.Since(start))
		if err := getOK(m, context.Background(), up.url+"/"); err != nil {
			t.Fatalf("local %v: request after the flood: %v", m == owner, err)
		}
	}
	waitFor(t, 5*time.Second, "both floods to be reset", func() bool {
		up.mu.Lock()
		defer up.mu.Unlock()
		return up.resets >= 2
	})
	if conns, _, _, v := up.stats(); conns != 1 || len(v) != 0 {
		t.Fatalf("%d connections, violations %v: want the one connection kept", conns, v)
	}
}
