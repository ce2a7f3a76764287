package proxy

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

func TestRequestFrameRoundTrip(t *testing.T) {
	lease := bytes.Repeat([]byte{7}, 32)
	dl := time.Unix(1700000000, 123456789)
	b, err := appendRequestFrame(nil, lease, dl, 0)
	if err != nil {
		t.Fatal(err)
	}
	f, n, err := decodeRequestFrame(b)
	if err != nil || n != len(b) {
		t.Fatalf("decode: n=%d err=%v", n, err)
	}
	if !bytes.Equal(f.leaseBytes(), lease) {
		t.Errorf("lease %x", f.leaseBytes())
	}
	if got, ok := f.deadlineTime(); !ok || !got.Equal(dl) {
		t.Errorf("deadline %v %v", got, ok)
	}
	// Every strict prefix is short, never accepted.
	for i := range len(b) {
		if _, _, err := decodeRequestFrame(b[:i]); !errors.Is(err, errShort) {
			t.Fatalf("prefix %d: %v", i, err)
		}
	}
	if _, err := appendRequestFrame(nil, nil, dl, 0); err == nil {
		t.Error("empty lease encoded")
	}
	if _, err := appendRequestFrame(nil, make([]byte, maxLeaseLen+1), dl, 0); err == nil {
		t.Error("oversized lease encoded")
	}
}

// TestRequestFrameWaitLeft: the caller's wait left travels with the frame,
// after the length when there is one, and a frame that says it carries one
// but carries 0 is refused.
func TestRequestFrameWaitLeft(t *testing.T) {
	for _, length := range []int64{-1, 0, 1 << 20} {
		b, err := appendRequestFrameWait(nil, []byte("lease"), time.Time{}, flagBodyOnAccept, length, 1500*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		f, n, err := decodeRequestFrame(b)
		if err != nil || n != len(b) {
			t.Fatalf("length %d: n=%d of %d, err %v", length, n, len(b), err)
		}
		if f.waitLeft != int64(1500*time.Millisecond) || f.length != length || f.flags != flagBodyOnAccept|flagWaitLeft|map[bool]uint16{true: flagLength}[length >= 0] {
			t.Errorf("length %d: decoded %+v", length, f)
		}
		for i := range len(b) {
			if _, _, err := decodeRequestFrame(b[:i]); !errors.Is(err, errShort) {
				t.Fatalf("length %d, prefix %d: %v", length, i, err)
			}
		}
		zero := append([]byte(nil), b...)
		clear(zero[len(zero)-8:])
		if _, _, err := decodeRequestFrame(zero); !errors.Is(err, ErrBadFrame) {
			t.Errorf("length %d: a wait left of 0 decoded: %v", length, err)
		}
	}
	if b, _ := appendRequestFrameWait(nil, []byte("lease"), time.Time{}, flagWaitLeft, -1, 0); len(b) != reqHeaderLen+len("lease") {
		t.Errorf("no wait left: %d bytes, want %d without the field", len(b), reqHeaderLen+len("lease"))
	}
}

func TestResponseFrameRoundTrip(t *testing.T) {
	for _, f := range []responseFrame{
		{typ: frameAccept},
		{typ: frameAccept, flags: flagAcceptH2},
		{typ: frameAccept, flags: flagAcceptWaited, waited: 3 * time.Millisecond},
		{typ: frameAccept, flags: flagAcceptH2 | flagAcceptWaited, waited: time.Nanosecond},
		{typ: frameReject, code: rejectStale, msg: "stale"},
		{typ: frameError, flags: flagNothingSent | flagIdleClosed, code: errCodeBadResponse, msg: "bad ünïcode"},
		{typ: frameError, msg: strings.Repeat("é", maxMessageLen)}, // truncated to a rune boundary
	} {
		b := appendResponseFrame(nil, f)
		got, n, err := decodeResponseFrame(b)
		if err != nil || n != len(b) {
			t.Fatalf("%+v: n=%d err=%v", f, n, err)
		}
		if got.typ != f.typ || got.flags != f.flags || got.code != f.code || got.waited != f.waited || !strings.HasPrefix(f.msg, got.msg) {
			t.Errorf("got %+v want %+v", got, f)
		}
	}
}

// TestAcceptFrameWaited: the owner's wait travels after the accept's
// header, clamped to what a decoder takes; a frame that says it carries
// one but carries 0, or more than the bound, is refused, and one cut
// inside the field is short.
func TestAcceptFrameWaited(t *testing.T) {
	b := appendResponseFrame(nil, responseFrame{typ: frameAccept, flags: flagAcceptWaited, waited: 1500 * time.Millisecond})
	if len(b) != respHeaderLen+8 {
		t.Fatalf("%d bytes, want the header and the field's 8", len(b))
	}
	for i := range len(b) {
		if _, _, err := decodeResponseFrame(b[:i]); !errors.Is(err, errShort) {
			t.Fatalf("prefix %d: %v", i, err)
		}
	}
	for name, w := range map[string]uint64{"zero": 0, "past the bound": maxFrameWait + 1, "negative": 1 << 63} {
		bad := binary.BigEndian.AppendUint64(append([]byte(nil), b[:respHeaderLen]...), w)
		if _, _, err := decodeResponseFrame(bad); !errors.Is(err, ErrBadFrame) {
			t.Errorf("%s: decoded: %v", name, err)
		}
	}
	for _, w := range []time.Duration{-time.Second, 0, 1<<63 - 1} {
		f, _, err := decodeResponseFrame(appendResponseFrame(nil, responseFrame{typ: frameAccept, flags: flagAcceptWaited, waited: w}))
		if err != nil || f.waited < 1 || f.waited > maxFrameWait {
			t.Errorf("waited %v encoded as %v, %v: want it clamped to what decodes", w, f.waited, err)
		}
	}
}

func TestFrameRejectsGarbage(t *testing.T) {
	valid, _ := appendRequestFrame(nil, []byte("lease"), time.Now(), 0)
	bad := map[string][]byte{
		"magic":      append([]byte("XX"), valid[2:]...),
		"version":    append([]byte{'O', 'R', frameVersion + 1}, valid[3:]...),
		"type":       append([]byte{'O', 'R', 1, byte(frameAccept)}, valid[4:]...),
		"flags":      append(append([]byte{}, valid[:4]...), append([]byte{0x80, 0}, valid[6:]...)...),
		"lease zero": append(append([]byte{}, valid[:6]...), append([]byte{0, 0}, valid[8:]...)...),
		"lease big":  append(append([]byte{}, valid[:6]...), append([]byte{0, 65}, valid[8:]...)...),
		"negative":   append(append([]byte{}, valid[:8]...), append([]byte{0x80, 0, 0, 0, 0, 0, 0, 0}, valid[16:]...)...),
	}
	for name, b := range bad {
		if _, _, err := decodeRequestFrame(b); err == nil || errors.Is(err, errShort) {
			t.Errorf("%s: accepted or short: %v", name, err)
		}
	}
	resp := map[string][]byte{
		"accept payload":    {'O', 'R', frameVersion, byte(frameAccept), 0, 0, 0, 1, 0, 0},
		"accept error flag": {'O', 'R', frameVersion, byte(frameAccept), 0, byte(flagConnGone), 0, 0, 0, 0},
		"reject code":       {'O', 'R', frameVersion, byte(frameReject), 0, 0, 0xff, 0, 0, 0},
		"error flags":       {'O', 'R', frameVersion, byte(frameError), 0x40, 0, 0, 0, 0, 0},
		"bad utf8":          {'O', 'R', frameVersion, byte(frameError), 0, 0, 0, 0, 0, 1, 0xff},
		"long msg":          {'O', 'R', frameVersion, byte(frameError), 0, 0, 0, 0, 0xff, 0xff},
		"request type":      {'O', 'R', frameVersion, byte(frameRequest), 0, 0, 0, 0, 0, 0},
	}
	for name, b := range resp {
		if _, _, err := decodeResponseFrame(b); err == nil || errors.Is(err, errShort) {
			t.Errorf("%s: accepted or short: %v", name, err)
		}
		if _, _, err := decodeResponseFrame(b); err != nil && strings.Contains(err.Error(), "version") {
			t.Errorf("%s: refused for its version, not its fault: %v", name, err)
		}
	}
}

func TestReadFrameFromStream(t *testing.T) {
	b, _ := appendRequestFrame(nil, []byte("0123456789"), time.Time{}, 0)
	b = append(b, "GET / HTTP/1.1\r\n"...)
	br := bufio.NewReaderSize(iotest.OneByteReader(bytes.NewReader(b)), 32)
	f, err := readFrame(br, reqHeaderLen, decodeRequestFrame)
	if err != nil {
		t.Fatal(err)
	}
	if string(f.leaseBytes()) != "0123456789" {
		t.Errorf("lease %q", f.leaseBytes())
	}
	rest, _ := br.ReadString('\n')
	if rest != "GET / HTTP/1.1\r\n" {
		t.Errorf("rest %q", rest)
	}
}

// FuzzDecodeFrame: decoding never panics, never reads past what it claims,
// and whatever decodes re-encodes to the same bytes.
func FuzzDecodeFrame(f *testing.F) {
	req, _ := appendRequestFrame(nil, bytes.Repeat([]byte{1}, 32), time.Unix(0, 42), 0)
	f.Add(req)
	req, _ = appendRequestFrameWait(nil, bytes.Repeat([]byte{1}, 32), time.Unix(0, 42), 0, 9, time.Second)
	f.Add(req)
	f.Add(appendResponseFrame(nil, responseFrame{typ: frameAccept}))
	f.Add(appendResponseFrame(nil, responseFrame{typ: frameAccept, flags: flagAcceptH2}))
	f.Add(appendResponseFrame(nil, responseFrame{typ: frameAccept, flags: flagAcceptH2 | flagAcceptWaited, waited: time.Second}))
	f.Add(appendResponseFrame(nil, responseFrame{typ: frameReject, code: rejectGone, msg: "gone"}))
	f.Add(appendResponseFrame(nil, responseFrame{typ: frameError, flags: flagNothingSent, code: errCodeConnBroken, msg: "x"}))
	f.Add([]byte("OR"))
	f.Add([]byte{'H', 3})
	f.Add(appendHeadFields(appendHead(nil, headProto2), headProto2|headLength|headStatus, 0, 204))
	f.Fuzz(func(t *testing.T, b []byte) {
		if rf, n, err := decodeRequestFrame(b); err == nil {
			if n > len(b) {
				t.Fatalf("request n=%d > %d", n, len(b))
			}
			var dl time.Time
			if rf.deadline != 0 {
				dl = time.Unix(0, rf.deadline)
			}
			enc, err := appendRequestFrameWait(nil, rf.leaseBytes(), dl, rf.flags, rf.length, time.Duration(rf.waitLeft))
			if err != nil || !bytes.Equal(enc, b[:n]) {
				t.Fatalf("request re-encodes to %x, want %x (%v)", enc, b[:n], err)
			}
		} else if !errors.Is(err, ErrBadFrame) {
			t.Fatalf("request error %v is not ErrBadFrame", err)
		}
		if rf, n, err := decodeResponseFrame(b); err == nil {
			if n > len(b) {
				t.Fatalf("response n=%d > %d", n, len(b))
			}
			if enc := appendResponseFrame(nil, rf); !bytes.Equal(enc, b[:n]) {
				t.Fatalf("response re-encodes to %x, want %x", enc, b[:n])
			}
		} else if !errors.Is(err, ErrBadFrame) {
			t.Fatalf("response error %v is not ErrBadFrame", err)
		}
		src := bytes.NewReader(b)
		br := bufio.NewReaderSize(src, 16)
		for off := 0; ; {
			f, length, status, err := readHead(br)
			if err != nil {
				break
			}
			end := len(b) - src.Len() - br.Buffered()
			if enc := appendHeadFields(nil, f, length, status); !bytes.Equal(enc, b[off:end]) {
				t.Fatalf("head re-encodes to %x, want %x", enc, b[off:end])
			}
			off = end
		}
		br = bufio.NewReaderSize(bytes.NewReader(b), 128)
		readFrame(br, respHeaderLen, decodeResponseFrame)
	})
}

// TestFrameRefusesVersion2Peer: a sibling of the build before the reset
// trailer (frame version 2) is refused in both directions with an error
// that names both versions, not misread.
func TestFrameRefusesVersion2Peer(t *testing.T) {
	req, _ := appendRequestFrame(nil, []byte("lease"), time.Now(), 0)
	req[2] = 2
	resp := appendResponseFrame(nil, responseFrame{typ: frameAccept})
	resp[2] = 2
	_, _, rerr := decodeRequestFrame(req)
	_, _, perr := decodeResponseFrame(resp)
	for _, err := range []error{rerr, perr} {
		if !errors.Is(err, ErrBadFrame) || !strings.Contains(err.Error(), "version 2") || !strings.Contains(err.Error(), fmt.Sprintf("version %d", frameVersion)) {
			t.Errorf("version 2 frame: %v; want ErrBadFrame naming versions 2 and %d", err, frameVersion)
		}
	}
}

// TestErrorFrameInPlaceOfHead: after its accept, an owner reports a failed
// exchange with an error frame where the next head would be; any other
// frame there is garbage.
func TestErrorFrameInPlaceOfHead(t *testing.T) {
	b := appendHead(nil, 0)
	b = append(b, "HTTP/1.1 103 Early Hints\r\n\r\n"...)
	b = appendResponseFrame(b, responseFrame{typ: frameError, flags: flagIdleClosed, code: errCodeHeaderTooLarge, msg: ErrHeaderTooLarge.Error()})
	br := bufio.NewReader(bytes.NewReader(b))
	if _, _, _, err := readHead(br); err != nil {
		t.Fatalf("the 1xx's head: %v", err)
	}
	if _, err := br.Discard(len("HTTP/1.1 103 Early Hints\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	_, _, _, err := readHead(br)
	var pe *Error
	if !errors.As(err, &pe) || !errors.Is(err, ErrHeaderTooLarge) || pe.beforeAccept || !pe.idleClosed || pe.RetrySafe || errors.Is(err, ErrBadFrame) {
		t.Fatalf("error frame in place of a head: %#v (%v); want the owner's ErrHeaderTooLarge, after the accept", pe, err)
	}
	if br.Buffered() != 0 {
		t.Fatalf("%d bytes left unread after the error frame", br.Buffered())
	}
	for _, typ := range []frameType{frameAccept, frameReject} {
		b := appendResponseFrame(nil, responseFrame{typ: typ})
		if _, _, _, err := readHead(bufio.NewReader(bytes.NewReader(b))); !errors.Is(err, ErrBadFrame) {
			t.Errorf("frame type %d in place of a head: %v, want ErrBadFrame", typ, err)
		}
	}
}
