package proxy

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
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
// "<name> |<value>|", in order, and the reader of the head puts them back
// (unwrapPadded). The bars keep the value's ends from the trim. A field
// value has no CR or LF (HTTP/2 refuses them, and HTTP/1.1's reader ends
// the line there), so the value needs no escaping.
const paddedField = "Orbit-Padded"

// isPadded reports whether HTTP/1.1's text would trim v.
func isPadded(v string) bool {
	return v != "" && (isSpaceOrTab(v[0]) || isSpaceOrTab(v[len(v)-1]))
}

func isSpaceOrTab(b byte) bool { return b == ' ' || b == '\t' }

// wrapPadded returns h, or, if a field of h needs it (see paddedField), a
// copy of h in which that field's values have moved to paddedField. Fields
// named in except stay: the writer of the head takes them from elsewhere
// (see requestWriteFields). h is not changed: it is the caller's, or the
// response the owner's exchange holds.
func wrapPadded(h http.Header, except map[string]bool) http.Header {
	var names []string
	for k, vs := range h {
		// Any spelling of the leg's own name: the reader canonicalizes
		// the field's name before it looks for paddedField.
		if strings.EqualFold(k, paddedField) || !except[k] && slices.ContainsFunc(vs, isPadded) {
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
		for _, v := range h[k] {
			moved = append(moved, k+" |"+v+"|")
		}
		delete(out, k)
	}
	out[paddedField] = moved
	return out
}

// requestWriteFields are the fields http.Request.Write takes from the
// request's other fields, never from its header map.
var requestWriteFields = map[string]bool{"Host": true, "Content-Length": true, "Transfer-Encoding": true, "Trailer": true}

// wrapRequest returns r, or a shallow copy of it whose header wrapPadded
// changed. http.Request.Write writes a default User-Agent when the header
// has none: one that moved stays as an empty value, which it writes as
// none, and the owner takes the moved one.
func wrapRequest(r *http.Request) *http.Request {
	h := wrapPadded(r.Header, requestWriteFields)
	if h[paddedField] == nil {
		return r
	}
	if _, ok := r.Header["User-Agent"]; ok {
		if _, kept := h["User-Agent"]; !kept {
			h["User-Agent"] = []string{""}
		}
	}
	wr := *r
	wr.Header = h
	return &wr
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
		if !ok || k == "" || len(v) < 2 || v[0] != '|' || v[len(v)-1] != '|' {
			return fmt.Errorf("malformed %s field %q", paddedField, m)
		}
		h[k] = append(h[k], v[1:len(v)-1])
	}
	return nil
}
