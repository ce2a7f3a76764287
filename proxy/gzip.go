package proxy

import (
	"compress/gzip"
	"io"
	"net/http"
	"strings"
	"sync"
)

// Transparent gzip, exactly as net/http's Transport does it unless
// DisableCompression is set: a request that names no Accept-Encoding (and is
// no HEAD or Range request) asks for gzip, and a gzip response is decoded,
// with Content-Encoding and Content-Length removed and Uncompressed set.

// wantsGzip reports whether the transport should ask for gzip on req.
func wantsGzip(req *http.Request) bool {
	return req.Header.Get("Accept-Encoding") == "" && req.Header.Get("Range") == "" && req.Method != http.MethodHead
}

// withGzip returns a shallow copy of req asking for gzip. The caller's
// header map is not touched.
func withGzip(req *http.Request) *http.Request {
	r := *req
	r.Header = req.Header.Clone()
	r.Header.Set("Accept-Encoding", "gzip")
	return &r
}

// ungzip decodes resp's body in place if the transport asked for gzip and
// got it.
func ungzip(resp *http.Response) {
	if !strings.EqualFold(resp.Header.Get("Content-Encoding"), "gzip") {
		return
	}
	head := resp.Request != nil && resp.Request.Method == http.MethodHead
	if head || resp.ContentLength == 0 || resp.Body == http.NoBody || resp.StatusCode == http.StatusSwitchingProtocols {
		return
	}
	resp.Body = &gzipBody{body: resp.Body}
	resp.Header.Del("Content-Encoding")
	resp.Header.Del("Content-Length")
	resp.ContentLength = -1
	resp.Uncompressed = true
}

var gzipReaders sync.Pool

// gzipBody decodes lazily, on the first Read, so that a caller that closes
// without reading pays nothing.
type gzipBody struct {
	body io.ReadCloser
	mu   sync.Mutex
	zr   *gzip.Reader
	err  error
}

func (g *gzipBody) Read(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return 0, g.err
	}
	if g.zr == nil {
		zr, _ := gzipReaders.Get().(*gzip.Reader)
		var err error
		if zr == nil {
			zr, err = gzip.NewReader(g.body)
		} else {
			err = zr.Reset(g.body)
		}
		if err != nil {
			g.err = err
			return 0, err
		}
		g.zr = zr
	}
	return g.zr.Read(p)
}

// Close closes the underlying body at once, which unblocks a Read in
// progress, then returns the decoder to the pool.
func (g *gzipBody) Close() error {
	err := g.body.Close()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.zr != nil {
		gzipReaders.Put(g.zr)
		g.zr = nil
	}
	g.err = errReadOnClosedBody
	return err
}
