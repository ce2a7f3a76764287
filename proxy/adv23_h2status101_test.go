package proxy

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// adv23Serve101Then200 serves HTTP/2 (h2c, prior knowledge) answering every
// request with HEADERS :status 101 (no END_STREAM, which HTTP/2 does not
// have: RFC 9113 8.6), then a 200 with body "ok".
func adv23Serve101Then200(c net.Conn) {
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c, preface); err != nil {
		return
	}
	fr := http2.NewFramer(c, c)
	fr.WriteSettings(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 100})
	fr.WriteWindowUpdate(0, 1<<30)
	var mu sync.Mutex
	enc := func(fields ...string) []byte {
		var b bytes.Buffer
		e := hpack.NewEncoder(&b)
		for i := 0; i+1 < len(fields); i += 2 {
			e.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
		}
		return b.Bytes()
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		mu.Lock()
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				fr.WritePing(true, f.Data)
			}
		case *http2.HeadersFrame:
			id := f.StreamID
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true,
				BlockFragment: enc(":status", "101", "upgrade", "websocket", "connection", "upgrade")})
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true,
				BlockFragment: enc(":status", "200", "content-length", "2")})
			fr.WriteData(id, true, []byte("ok"))
		}
		mu.Unlock()
	}
}

// TestAdv23H2Status101IsNotAnUpgradeForSibling: an HTTP/2 upstream sends a
// 101 (which HTTP/2 does not have) before its 200. x/net hands it to the
// request's Got1xxResponse, as any 1xx, and goes on to the 200, which a
// local exchange returns. The owner's relay wrote it onto the unix leg as an
// interim head, "HTTP/1.1 101", which the sibling, reading HTTP/1.1, takes
// for the final answer: an upgrade, with the owner's framing of the real
// 200 as the tunnel's bytes.
func TestAdv23H2Status101IsNotAnUpgradeForSibling(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveConns(t, ln, func(c net.Conn, _ int) { adv23Serve101Then200(c) })
	url := "http://" + ln.Addr().String()
	owner, client := remotePair(t, h2cConf)

	get := func(m *member) (int, string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
			Got1xxResponse: func(int, textproto.MIMEHeader) error { return nil },
		})
		req, _ := http.NewRequestWithContext(ctx, "GET", url+"/", nil)
		resp, err := m.tr.RoundTrip(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		done := make(chan struct{})
		var b []byte
		go func() { b, _ = io.ReadAll(io.LimitReader(resp.Body, 4096)); close(done) }()
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			resp.Body.Close()
			<-done
		}
		return resp.StatusCode, string(b), nil
	}
	code, body, err := get(owner)
	if err != nil || code != 200 || body != "ok" {
		t.Fatalf("local exchange: %d %q %v, want 200 \"ok\" as x/net returns it", code, body, err)
	}
	code, body, err = get(client)
	if owner.node.Stats().ServedRemote == 0 {
		t.Fatal("the sibling's request did not go through the owner: the test shows nothing")
	}
	if err != nil || code != 200 || body != "ok" {
		t.Fatalf("sibling's exchange: %d %q %v, want 200 \"ok\" as the local exchange", code, body, err)
	}
}
