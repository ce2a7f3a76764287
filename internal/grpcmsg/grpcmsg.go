// Package grpcmsg frames gRPC-style messages (a flag byte, a big-endian
// 32-bit length, the payload) for the HTTP/2 tests and load of this module,
// which need gRPC's framing on the wire but not gRPC itself.
package grpcmsg

import (
	"encoding/binary"
	"io"
)

// Frame returns p as one uncompressed message.
func Frame(p []byte) []byte {
	b := make([]byte, 5, 5+len(p))
	binary.BigEndian.PutUint32(b[1:], uint32(len(p)))
	return append(b, p...)
}

// Read reads one message and returns its payload.
func Read(r io.Reader) ([]byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	p := make([]byte, binary.BigEndian.Uint32(h[1:]))
	_, err := io.ReadFull(r, p)
	return p, err
}

// Echo answers each message read from r with the same message on w,
// flushing each, until r ends or max messages (0: no limit) were echoed.
func Echo(w io.Writer, flush func(), r io.Reader, max int) {
	for n := 0; max == 0 || n < max; n++ {
		p, err := Read(r)
		if err != nil {
			return
		}
		w.Write(Frame(p))
		flush()
	}
}
