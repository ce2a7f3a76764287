// Package h2frame is an HTTP/2 upstream for tests, written at the frame
// level with golang.org/x/net/http2's Framer and hpack, so that a test
// decides when SETTINGS go out and sees when the client acknowledges them.
// It is test support: nothing outside tests imports it.
package h2frame

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Upstream is an h2c upstream written at the frame level with
// x/net/http2's Framer, so that a test decides when SETTINGS go out and sees
// when the client acknowledges them. It checks the client against the limit
// the client has acknowledged: every HEADERS that opens a stream is counted
// against SETTINGS_MAX_CONCURRENT_STREAMS as of the client's latest ACK.
// A stream's response is sent after hold, or, for /hold, when Release is
// closed; /reset-head resets the stream at once, /reset-body after a head
// and part of the body. A stream stops counting just before its END_STREAM
// (or RST_STREAM) is written, so the count here never exceeds the client's
// own.
type Upstream struct {
	t       testing.TB
	ln      net.Listener
	URL     string
	hold    time.Duration
	Release chan struct{}

	mu        sync.Mutex
	limit     uint32 // announced last
	conns     []*conn
	served    int // responses ended
	acked     int // SETTINGS changes (after the first) acknowledged, all connections
	violation []string
	resets    int  // RST_STREAM frames from clients
	ResetsOK  bool // set before use: resets are expected
	wg        sync.WaitGroup
	done      chan struct{}
}

type conn struct {
	u    *Upstream
	c    net.Conn
	wmu  sync.Mutex // the framer's writes and the encoder
	fr   *http2.Framer
	henc *hpack.Encoder
	hbuf bytes.Buffer

	// guarded by u.mu
	sent     []uint32 // limits announced and not yet acknowledged, in order
	enforced uint32   // the limit the client acknowledged last; 0: none yet
	open     int
	closed   bool // serve returned
	peak     int  // streams open when one opened, at most, since the last ACK
	reqEnded map[uint32]bool
}

func New(t testing.TB, limit uint32, hold time.Duration) *Upstream {
	return NewTLS(t, limit, hold, nil)
}

// NewTLS is New over TLS with cfg (ALPN h2), or
// h2c for a nil cfg.
func NewTLS(t testing.TB, limit uint32, hold time.Duration, cfg *tls.Config) *Upstream {
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
	u := &Upstream{t: t, ln: ln, URL: url, hold: hold, limit: limit,
		Release: make(chan struct{}), done: make(chan struct{})}
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fc := &conn{u: u, c: c, reqEnded: map[uint32]bool{}}
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

func (u *Upstream) close() {
	close(u.done)
	u.ln.Close()
	u.mu.Lock()
	for _, fc := range u.conns {
		fc.c.Close()
	}
	u.mu.Unlock()
	u.wg.Wait()
}

func (u *Upstream) fail(format string, args ...any) {
	u.violation = append(u.violation, fmt.Sprintf(format, args...))
}

// SetLimit announces a new SETTINGS_MAX_CONCURRENT_STREAMS on every
// connection.
func (u *Upstream) SetLimit(limit uint32) {
	u.mu.Lock()
	u.limit = limit
	conns := append([]*conn(nil), u.conns...)
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

func (u *Upstream) Stats() (conns, served, acked int, violations []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.conns), u.served, u.acked, append([]string(nil), u.violation...)
}

// PeakSinceAck is the most streams open on any connection when a stream
// opened since that connection's last acknowledged SETTINGS (of a closed
// connection, only if it acknowledged every SETTINGS sent on it).
func (u *Upstream) PeakSinceAck() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	p := 0
	for _, fc := range u.conns {
		if fc.closed && len(fc.sent) > 0 {
			continue // gone before it acknowledged the last SETTINGS
		}
		p = max(p, fc.peak)
	}
	return p
}

// Unacked is how many open connections have not acknowledged every
// SETTINGS sent on them.
func (u *Upstream) Unacked() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, fc := range u.conns {
		if !fc.closed && len(fc.sent) > 0 {
			n++
		}
	}
	return n
}

func (fc *conn) serve() {
	u := fc.u
	defer func() {
		u.mu.Lock()
		fc.closed = true
		u.mu.Unlock()
	}()
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
			if !u.ResetsOK {
				u.fail("stream %d reset by the client: %v", f.StreamID, f.ErrCode)
			}
			u.mu.Unlock()
		}
	}
}

// respond answers stream id after the hold (or the release, for /hold).
func (fc *conn) respond(id uint32, path string) {
	u := fc.u
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		switch path {
		case "/flood":
			u.flood(fc, id)
			return
		case "/reset-head", "/reset-body":
			u.reset(fc, id, path == "/reset-body")
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
			wait, rel = nil, u.Release
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

// reset resets stream id with INTERNAL_ERROR: at once, or after a head and
// the first part of a body ("partial", of a declared 100 bytes).
func (u *Upstream) reset(fc *conn, id uint32, head bool) {
	u.mu.Lock()
	fc.open--
	u.mu.Unlock()
	fc.wmu.Lock()
	defer fc.wmu.Unlock()
	if head {
		fc.hbuf.Reset()
		fc.henc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
		fc.henc.WriteField(hpack.HeaderField{Name: "content-type", Value: "text/plain"})
		fc.henc.WriteField(hpack.HeaderField{Name: "content-length", Value: "100"})
		fc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: fc.hbuf.Bytes(), EndHeaders: true})
		fc.fr.WriteData(id, false, []byte("partial"))
	}
	fc.fr.WriteRSTStream(id, http2.ErrCodeInternal)
}

// flood answers stream id with interim responses (103, a 1 KiB field
// each) until 16 MiB went out or the client reset the stream or left, and
// never a final one. The stream stops counting as open either way.
func (u *Upstream) flood(fc *conn, id uint32) {
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

// Resets is how many RST_STREAM frames clients sent.
func (u *Upstream) Resets() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.resets
}
