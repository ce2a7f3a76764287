package proxy

import (
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// paddedField carries across the unix leg the header fields whose values
// HTTP/1.1's text would change. HTTP/2 gives a field value as a string, and
// one may begin or end with spaces or tabs: x/net/http2 hands such a value
// to the caller as it came, and sends one a caller set as it is. Written as
// an HTTP/1.1 line, net/http's writer and reader both trim it, so a request
// or response through a sibling would carry other bytes than through the
// owner's own exchange, or through net/http's HTTP/2 transport.
//
// Each value of such a field, and each value of a field the upstream or the
// client itself named paddedField, crosses as one value of paddedField:
// "<name> |<value>|", in order, or "<name>" for a field without a value,
// and the reader of the head puts them back (unwrapPadded). The bars keep
// the value's ends from the trim. A field value has no CR or LF (HTTP/2
// refuses them, and HTTP/1.1's reader ends the line there), so the value
// needs no escaping.
const paddedField = "Orbit-Padded"

// isPadded reports whether HTTP/1.1's text would trim v.
func isPadded(v string) bool {
	return v != "" && (isSpaceOrTab(v[0]) || isSpaceOrTab(v[len(v)-1]))
}

func isSpaceOrTab(b byte) bool { return b == ' ' || b == '\t' }

// wrapPadded returns h, or, if move says a field of h needs it, a copy of h
// in which the values of the fields it names have moved to paddedField. h
// is not changed: it is the caller's, or the response the owner's exchange
// holds.
func wrapPadded(h http.Header, move func(name string, values []string) bool) http.Header {
	var names []string
	for k, vs := range h {
		if move(k, vs) {
			names = append(names, k)
		}
	}
	if names == nil {
		return h
	}
	slices.Sort(names)
	out := h.Clone()
	var moved []string
	for _, k := range names {
		if len(h[k]) == 0 {
			// Named, without a value: a trailer announced and not sent.
			moved = append(moved, k)
		}
		for _, v := range h[k] {
			moved = append(moved, k+" |"+v+"|")
		}
		delete(out, k)
	}
	out[paddedField] = moved
	return out
}

// responseMoves says which fields of a response head or trailers cross in
// paddedField: those with a padded value, and any spelling of the leg's
// own name, for the reader canonicalizes a name before it looks for
// paddedField.
func responseMoves(name string, values []string) bool {
	return strings.EqualFold(name, paddedField) || slices.ContainsFunc(values, isPadded)
}

// requestMoves says which fields of a request head cross in paddedField:
// as responseMoves, but for the fields http.Request.Write takes from the
// request's other fields, never from its header map; and any spelling of
// User-Agent but the canonical one, which Request.Write writes as any
// other field and x/net/http2 takes for the User-Agent, so that the owner
// sees it spelled as the caller did.
func requestMoves(name string, values []string) bool {
	switch name {
	case "Host", "Content-Length", "Transfer-Encoding", "Trailer":
		return false
	case "User-Agent":
	default:
		if strings.EqualFold(name, "User-Agent") {
			return true
		}
	}
	return responseMoves(name, values)
}

// wrapRequest returns r, or a shallow copy of it whose header wrapPadded
// changed, or whose trailers it wraps as the body ends. http.Request.Write
// writes a default User-Agent when the header has none: one that moved
// stays as an empty value, which it writes as none, and the owner takes the
// moved one.
func wrapRequest(r *http.Request) *http.Request {
	h := wrapPadded(r.Header, requestMoves)
	wrapHead := h[paddedField] != nil
	wrapTrailer := len(r.Trailer) > 0 && r.Body != nil && r.Body != http.NoBody
	if !wrapHead && !wrapTrailer {
		return r
	}
	wr := *r
	if wrapHead {
		if _, ok := r.Header["User-Agent"]; ok {
			if _, kept := h["User-Agent"]; !kept {
				h["User-Agent"] = []string{""}
			}
		}
		wr.Header = h
	}
	if wrapTrailer {
		// The caller may fill its trailers in until its body ends, and
		// Request.Write reads them once it has: the copy announces the
		// same keys, and takes their wrapped values at the body's end.
		wr.Trailer = make(http.Header, len(r.Trailer))
		for k := range r.Trailer {
			wr.Trailer[k] = nil
		}
		wr.Body = &trailerWrapBody{ReadCloser: r.Body, from: r.Trailer, to: wr.Trailer, probed: probedBody(&wr)}
	}
	return &wr
}

// trailerWrapBody is a request body that, at its end, sets to the trailers
// from, wrapped.
type trailerWrapBody struct {
	io.ReadCloser
	from, to http.Header
	// probed: Request.Write's first read is its probe (see probedBody),
	// on a goroutine of its own, while the writer may be reading the
	// trailers' keys for the head. The trailers are set at a later read
	// of the end: if the probe found the body empty, nothing sends them.
	probed bool
	reads  int
}

func (b *trailerWrapBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.reads++
	if err == io.EOF && (!b.probed || b.reads > 1) {
		clear(b.to)
		maps.Copy(b.to, wrapPadded(b.from, trailerMoves))
	}
	return n, err
}

// probedBody reports whether http.Request.Write probes r's body for whether
// it is empty, reading its first byte on a goroutine of its own: a body of
// unknown length whose method usually has none.
func probedBody(r *http.Request) bool {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength > 0 || len(r.TransferEncoding) > 0 {
		return false
	}
	switch r.Method {
	case "", "GET", "HEAD", "DELETE", "OPTIONS", "PROPFIND", "SEARCH":
		return true
	}
	return false
}

// trailerMoves is responseMoves for a request's trailers, which the caller
// may set until its body ends, after RoundTrip checked them: a name that
// is not a field's, which Request.Write drops, stays out of paddedField,
// where the owner would read a name with a space in it as another field.
func trailerMoves(name string, values []string) bool {
	return httpguts.ValidHeaderFieldName(name) && responseMoves(name, values)
}

// wrapGrowth is how many bytes of an HTTP/1.1 head the moved values of
// paddedField take beyond what their fields would have taken unwrapped: a
// value's line "Orbit-Padded: <name> |<value>|" against "<name>: <value>",
// and all of a bare name's line.
func wrapGrowth(moved []string) int64 {
	var n int64
	for _, m := range moved {
		if strings.Contains(m, " ") {
			n += int64(len(paddedField) + 3)
		} else {
			n += int64(len(paddedField) + 4 + len(m))
		}
	}
	return n
}

// unwrapPadded puts back in h the fields wrapPadded moved. A value of
// paddedField it cannot read is an error: the peer is not a build of this
// unix leg, or its head was damaged.
func unwrapPadded(h http.Header) error {
	moved := h[paddedField]
	if len(moved) == 0 {
		return nil
	}
	delete(h, paddedField)
	for _, m := range moved {
		k, v, ok := strings.Cut(m, " ")
		switch {
		case k == "":
		case !ok:
			if _, ok := h[k]; !ok {
				h[k] = nil
			}
			continue
		case len(v) >= 2 && v[0] == '|' && v[len(v)-1] == '|':
			h[k] = append(h[k], v[1:len(v)-1])
			continue
		}
		return fmt.Errorf("malformed %s field %q", paddedField, m)
	}
	return nil
}
