package proxy

import (
	"bufio"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv75cEveryDialedStreamAnsweredAtClose: a heavier dial storm than
// TestLeavingRefusesStreamsDialedAsItCloses (16 dialers, 150 closes, no
// pause between dials): every stream whose dial succeeded, to a server
// that closes under it, gets a frame (a refusal) before it ends, never a
// bare EOF or reset, which its sender could not tell from a request lost
// after it was acted on. Also: the socket's name is gone once close
// returns, and a listener that took the name after the unlink keeps it.
func TestAdv75cEveryDialedStreamAnsweredAtClose(t *testing.T) {
	frame, err := appendRequestFrame(nil, []byte("R"), time.Time{}, flagBodyOnAccept)
	if err != nil {
		t.Fatal(err)
	}
	frame = append(frame, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"...)
	var answered, unanswered atomic.Int64
	var firstErr atomic.Value
	for round := range 150 {
		path := SocketPath(filepath.Join(t.TempDir(), "sock"), 1)
		ln, err := listenUnix(path)
		if err != nil {
			t.Fatal(err)
		}
		srv := newServer(ln, scriptAcceptor{}, nil)
		go srv.serve()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					c, err := net.Dial("unix", path)
					if err != nil {
						continue
					}
					c.SetDeadline(time.Now().Add(5 * time.Second))
					c.Write(frame)
					if _, err := readFrame(bufio.NewReader(c), respHeaderLen, decodeResponseFrame); err != nil {
						unanswered.Add(1)
						firstErr.CompareAndSwap(nil, err.Error())
					} else {
						answered.Add(1)
					}
					c.Close()
				}
			})
		}
		time.Sleep(5 * time.Millisecond)
		// A newcomer takes the name as soon as it is gone.
		var newLn *net.UnixListener
		took := make(chan struct{})
		go func() {
			defer close(took)
			for range 20000 {
				if l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"}); err == nil {
					newLn = l
					return
				}
			}
		}()
		srv.close()
		<-took
		// The newcomer answers every stream with a refusal of its own.
		newDone := make(chan struct{})
		if newLn != nil {
			go func() {
				defer close(newDone)
				for {
					c, err := newLn.Accept()
					if err != nil {
						return
					}
					c.Write(leavingFrame)
					c.Close()
				}
			}()
		}
		if newLn != nil {
			if _, err := net.Dial("unix", path); err != nil {
				t.Errorf("round %d: the newcomer's socket, bound after the unlink, is gone once the old owner closed: %v", round, err)
			}
		}
		close(stop)
		wg.Wait()
		if newLn != nil {
			newLn.Close()
			<-newDone
		}
	}
	if answered.Load() == 0 {
		t.Fatal("no stream got through to the owner")
	}
	if n := unanswered.Load(); n > 0 {
		t.Fatalf("%d streams (of %d) dialed to a closing owner ended with no frame: first: %v", n, n+answered.Load(), firstErr.Load())
	}
}
