package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// adv68bOwner serves len(answers) GET exchanges on own, one after the
// other: it reads each request frame and head, then writes that answer. A
// nil answer closes the stream at once; an answer ending in stall holds
// the stream open (unwritten) until the test ends.
func adv68bOwner(t *testing.T, own *net.UnixConn, answers ...[]byte) <-chan error {
	done := make(chan error, 1)
	go func() {
		defer own.Close()
		br := bufio.NewReader(own)
		for _, a := range answers {
			if _, err := readFrame(br, reqHeaderLen, decodeRequestFrame); err != nil {
				done <- err
				return
			}
			if _, err := http.ReadRequest(br); err != nil {
				done <- err
				return
			}
			if a == nil {
				done <- nil
				return
			}
			if _, err := own.Write(a); err != nil {
				done <- err
				return
			}
		}
		// Hold the stream until the caller closes it.
		io.Copy(io.Discard, br)
		done <- nil
	}()
	return done
}

const adv68bOK = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

func adv68bAccept(flags uint16, waited time.Duration) []byte {
	return appendResponseFrame(nil, responseFrame{typ: frameAccept, flags: flags, waited: waited})
}

// adv68bAcceptRaw is an accept frame with flagAcceptWaited whose field is
// exactly w, as a hostile owner may write it.
func adv68bAcceptRaw(flags uint16, w uint64) []byte {
	b := appendResponseFrame(nil, responseFrame{typ: frameAccept, flags: flags &^ flagAcceptWaited})
	binary.BigEndian.PutUint16(b[4:], flags)
	return binary.BigEndian.AppendUint64(b, w)
}

func adv68bGet(t *testing.T, p *peers, lane int, w WaitWatcher, timeout time.Duration) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if w != nil {
		ctx = WithWaitWatcher(ctx, w)
	}
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://upstream.test/x", nil)
	resp, err := p.roundTrip(req, lane, orbitpool.Lease{}, &remoteOpts{}, 1, nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// TestAdv68bWaitedAcceptKeepsTheStreamInStep: an owner's accepts with
// flagAcceptWaited (alone, and with flagAcceptH2) carry 8 bytes more; the
// caller reads exactly them, tells its watcher each wait once, and the
// stream carries the next exchanges in step (a plain accept after, which
// tells of no wait).
func TestAdv68bWaitedAcceptKeepsTheStreamInStep(t *testing.T) {
	sib, own := streamPair(t)
	const lane = 3
	answers := [][]byte{
		append(appendHead(adv68bAccept(flagAcceptWaited, 7*time.Millisecond), 0), adv68bOK...),
		append(appendHead(adv68bAccept(flagAcceptWaited|flagAcceptH2, time.Nanosecond), 0), adv68bOK...),
		append(appendHead(adv68bAcceptRaw(flagAcceptWaited, maxFrameWait), 0), adv68bOK...),
		append(appendHead(adv68bAccept(0, 0), 0), adv68bOK...),
	}
	want := []time.Duration{7 * time.Millisecond, time.Nanosecond, maxFrameWait, 0}
	done := adv68bOwner(t, own, answers...)
	p := oneStream(t, sib, lane)
	defer p.close()
	for i, wd := range want {
		w := &recordWaits{}
		body, err := adv68bGet(t, p, lane, w, 3*time.Second)
		if err != nil || body != "ok" {
			t.Fatalf("exchange %d: %q, %v", i, body, err)
		}
		if got := w.ownerWait(); got != wd {
			t.Errorf("exchange %d: watcher told the owner waited %v, want %v", i, got, wd)
		}
		if n := len(p.idle[lane]); n != 1 {
			t.Fatalf("exchange %d: %d idle streams after it, want the one stream kept", i, n)
		}
	}
	p.close()
	sib.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("owner: %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Error("owner goroutine did not end")
	}
}

// TestAdv68bBadWaitedFieldDropsTheStream: a waited field of 0, past 1<<62,
// negative as int64, or all ones is a bad frame: the request fails
// promptly with ErrBadFrame, the watcher is told nothing of the owner's
// wait, and the stream, out of step, is not kept.
func TestAdv68bBadWaitedFieldDropsTheStream(t *testing.T) {
	for name, w := range map[string]uint64{"zero": 0, "past 1<<62": maxFrameWait + 1, "negative": 1 << 63, "all ones": ^uint64(0)} {
		t.Run(name, func(t *testing.T) {
			sib, own := streamPair(t)
			const lane = 3
			adv68bOwner(t, own, append(appendHead(adv68bAcceptRaw(flagAcceptWaited|flagAcceptH2, w), 0), adv68bOK...))
			p := oneStream(t, sib, lane)
			defer p.close()
			rw := &recordWaits{}
			start := time.Now()
			_, err := adv68bGet(t, p, lane, rw, 3*time.Second)
			if !errors.Is(err, ErrBadFrame) {
				t.Fatalf("got %v, want ErrBadFrame", err)
			}
			if d := time.Since(start); d > time.Second {
				t.Errorf("took %v", d)
			}
			if got := rw.ownerWait(); got != 0 {
				t.Errorf("watcher told of an owner's wait of %v from a bad frame", got)
			}
			if n := len(p.idle[lane]); n != 0 {
				t.Errorf("%d streams kept after a bad accept", n)
			}
		})
	}
}

// adv68bCutOwner is an owner on a stream of its own that reads a request's
// frame and head, answers with answer (an accept cut short), then reads
// what more comes for stay and closes the stream. done waits for it and
// returns how many bytes it read past the head.
func adv68bCutOwner(t *testing.T, answer []byte, lane int, stay time.Duration) (sib *net.UnixConn, p *peers, done func() int64) {
	sib, own := streamPair(t)
	p = oneStream(t, sib, lane)
	var got atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		defer own.Close()
		br := bufio.NewReader(own)
		if _, err := readFrame(br, reqHeaderLen, decodeRequestFrame); err != nil {
			return
		}
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		own.Write(answer)
		if stay > 0 {
			own.SetReadDeadline(time.Now().Add(stay))
			n, _ := io.Copy(io.Discard, br)
			got.Store(n)
		}
	})
	return sib, p, func() int64 { wg.Wait(); return got.Load() }
}

// TestAdv68bPostAcceptCutInTheField: a long POST (flagBodyOnAccept) whose
// owner's accept is cut inside its waited field, then the stream closes:
// the body is held back (the accept never came whole), so none of it goes
// out, and the failure is as retry-safe as an accept cut in its header.
func TestAdv68bPostAcceptCutInTheField(t *testing.T) {
	full := adv68bAccept(flagAcceptWaited, 5*time.Millisecond)
	body := bytes.Repeat([]byte("b"), 64<<10)
	outcome := func(cut int) (safe bool, bodyBytes int64, err error) {
		const lane = 3
		_, p, done := adv68bCutOwner(t, full[:cut], lane, 100*time.Millisecond)
		defer p.close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		rw := &recordWaits{}
		req, _ := http.NewRequestWithContext(WithWaitWatcher(ctx, rw), "POST", "http://upstream.test/x", bytes.NewReader(body))
		resp, err := p.roundTrip(req, lane, orbitpool.Lease{}, &remoteOpts{}, 1, nil)
		if err == nil {
			resp.Body.Close()
			t.Fatalf("cut at %d: succeeded", cut)
		}
		if rw.ownerWait() != 0 {
			t.Errorf("cut at %d: watcher told %v", cut, rw.ownerWait())
		}
		return IsRetrySafe(err), done(), err
	}
	refSafe, refN, refErr := outcome(5)
	for cut := respHeaderLen; cut < len(full); cut++ {
		safe, n, err := outcome(cut)
		if safe != refSafe || n != refN {
			t.Errorf("cut at %d: retry-safe %v, %d body bytes sent (%v); cut in the header: %v, %d (%v)", cut, safe, n, err, refSafe, refN, refErr)
		}
		if n != 0 {
			t.Errorf("cut at %d: %d body bytes went to an owner whose accept never came whole", cut, n)
		}
	}
}

// TestAdv68bAcceptCutInTheField: an accept cut inside its waited field,
// then the owner gone, fails like an accept cut inside its header (the
// owner died after taking the request up, before its answer was out): the
// same retry-safety, no watcher call, no stream kept. Cut and stalled, the
// request ends by its context, promptly.
func TestAdv68bAcceptCutInTheField(t *testing.T) {
	full := adv68bAccept(flagAcceptWaited, 5*time.Millisecond)
	outcome := func(t *testing.T, cut int, stall bool) (retrySafe bool, err error) {
		const lane = 3
		stay := time.Duration(0)
		if stall {
			stay = 3 * time.Second
		}
		sib, p, done := adv68bCutOwner(t, full[:cut], lane, stay)
		defer p.close()
		rw := &recordWaits{}
		start := time.Now()
		timeout := 3 * time.Second
		if stall {
			timeout = 300 * time.Millisecond
		}
		_, err = adv68bGet(t, p, lane, rw, timeout)
		if err == nil {
			t.Fatalf("cut at %d: request succeeded", cut)
		}
		if d := time.Since(start); d > timeout+time.Second {
			t.Errorf("cut at %d: took %v", cut, d)
		}
		if got := rw.ownerWait(); got != 0 {
			t.Errorf("cut at %d: watcher told %v", cut, got)
		}
		if n := len(p.idle[lane]); n != 0 {
			t.Errorf("cut at %d: %d streams kept", cut, n)
		}
		sib.Close()
		done()
		return IsRetrySafe(err), err
	}
	refSafe, refErr := outcome(t, 5, false)
	for cut := respHeaderLen; cut < len(full); cut++ {
		safe, err := outcome(t, cut, false)
		if safe != refSafe {
			t.Errorf("accept cut at %d of %d: retry-safe %v (%v); cut in its header: %v (%v)", cut, len(full), safe, err, refSafe, refErr)
		}
	}
	for _, cut := range []int{respHeaderLen, respHeaderLen + 4, len(full) - 1} {
		if _, err := outcome(t, cut, true); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("cut at %d and stalled: %v, want the context's deadline", cut, err)
		}
	}
}

// TestAdv68bIdleClosedBitOnErrorFrameHasNoField: flagAcceptWaited's bit on
// an error frame is flagIdleClosed, which carries no field: an owner's
// error frame in place of its accept (nothing sent, idle closed) leaves the
// stream in step, and the next exchange on it, whose accept does carry a
// wait, is served. The same bit on a reject frame is a bad frame.
func TestAdv68bIdleClosedBitOnErrorFrameHasNoField(t *testing.T) {
	sib, own := streamPair(t)
	const lane = 3
	errFrame := appendResponseFrame(nil, responseFrame{typ: frameError, flags: flagNothingSent | flagIdleClosed, code: errCodeConnBroken, msg: "closed"})
	adv68bOwner(t, own,
		errFrame,
		append(appendHead(adv68bAccept(flagAcceptWaited, 9*time.Millisecond), 0), adv68bOK...),
		append(appendHead(adv68bAccept(0, 0), 0), adv68bOK...),
	)
	p := oneStream(t, sib, lane)
	defer p.close()
	rw := &recordWaits{}
	_, err := adv68bGet(t, p, lane, rw, 3*time.Second)
	if err == nil || !IsRetrySafe(err) {
		t.Fatalf("error frame: %v, want a retry-safe error", err)
	}
	if rw.ownerWait() != 0 {
		t.Errorf("watcher told %v by an error frame", rw.ownerWait())
	}
	if n := len(p.idle[lane]); n != 1 {
		t.Fatalf("%d streams kept after an error frame before the accept, want 1", n)
	}
	for i, wd := range []time.Duration{9 * time.Millisecond, 0} {
		rw := &recordWaits{}
		body, err := adv68bGet(t, p, lane, rw, 3*time.Second)
		if err != nil || body != "ok" {
			t.Fatalf("exchange %d after the error frame: %q %v", i, body, err)
		}
		if rw.ownerWait() != wd {
			t.Errorf("exchange %d: told %v, want %v", i, rw.ownerWait(), wd)
		}
	}

	// A reject with the bit.
	sib2, own2 := streamPair(t)
	rej := appendResponseFrame(nil, responseFrame{typ: frameReject, code: rejectOverload, msg: "busy"})
	binary.BigEndian.PutUint16(rej[4:], flagAcceptWaited)
	rej = binary.BigEndian.AppendUint64(rej, uint64(time.Millisecond))
	adv68bOwner(t, own2, rej)
	p2 := oneStream(t, sib2, lane)
	defer p2.close()
	if _, err := adv68bGet(t, p2, lane, nil, 3*time.Second); !errors.Is(err, ErrBadFrame) {
		t.Errorf("reject with flag bit 2: %v, want ErrBadFrame", err)
	}
	if n := len(p2.idle[lane]); n != 0 {
		t.Errorf("%d streams kept after a bad reject", n)
	}

	// An error frame in place of the head, after a waited accept, with
	// the bit: the caller reads no field after it, and reports the
	// owner's error (not a bad frame).
	sib3, own3 := streamPair(t)
	after := append(adv68bAccept(flagAcceptWaited, 3*time.Millisecond),
		appendResponseFrame(nil, responseFrame{typ: frameError, flags: flagIdleClosed, code: errCodeConnBroken, msg: "gone"})...)
	adv68bOwner(t, own3, after, nil)
	p3 := oneStream(t, sib3, lane)
	defer p3.close()
	rw3 := &recordWaits{}
	_, err = adv68bGet(t, p3, lane, rw3, 3*time.Second)
	if err == nil || errors.Is(err, ErrBadFrame) || !errors.Is(err, ErrConnBroken) {
		t.Errorf("error frame after a waited accept: %v, want the owner's ErrConnBroken", err)
	}
	if got := rw3.ownerWait(); got != 3*time.Millisecond {
		t.Errorf("told %v, want 3ms (the accept came whole)", got)
	}
}
