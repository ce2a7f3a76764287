package proxy

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"net/textproto"
	"strings"
	"testing"
	"time"
)

// TestAdv57PendingBoundCountsInFlight: the relay holds at most the header
// limit of 1xx heads the sibling has not read, counting those its flush
// has taken for a blocked write. Without them the read loop refilled the
// queue behind that write, to twice the limit (LOW). Here, with a 4 MiB
// limit: the read loop queues heads until refused, the sibling reads
// until the flush has taken the queue, and the read loop queues until
// refused again; what relay1xx accepted and the sibling did not read, less
// a generous 1 MiB for the socket itself, must be within the limit.
func TestAdv57PendingBoundCountsInFlight(t *testing.T) {
	const limit = 4 << 20
	a, b := unixPair(t)
	r := &relay{bw: bufio.NewWriter(a), shared: a, pendingLimit: limit}
	h := textproto.MIMEHeader{"Link": {"<" + strings.Repeat("a", 16<<10) + ">; rel=preload"}}
	var one strings.Builder
	writeInterim(&one, headProto2, http.StatusEarlyHints, h)
	headLen := int64(one.Len())

	var accepted int64
	fill := func() {
		for i := 0; ; i++ {
			if i > 10000 {
				t.Fatal("relay1xx never refused a head")
			}
			err := r.relay1xx(http.StatusEarlyHints, h)
			if errors.Is(err, errPeerNotReading) {
				return
			}
			if err != nil {
				t.Fatalf("relay1xx: %v", err)
			}
			accepted += headLen
			if i == 0 {
				accepted += int64(len(acceptFrame))
			}
		}
	}

	// The sibling reads nothing: the socket fills, then the queue.
	fill()
	// The sibling reads, 64 KiB at a time, until the flusher has taken
	// the queue for its blocking write (the heads it took first may be
	// more than 1 MiB), then stalls again.
	var read int64
	b.SetReadDeadline(time.Now().Add(3 * time.Second))
	for {
		r.mu.Lock()
		taken := len(r.pending) == 0 && r.flushing
		r.mu.Unlock()
		if taken && read >= 1<<20 {
			break
		}
		if _, err := io.CopyN(io.Discard, b, 64<<10); err != nil {
			t.Fatalf("sibling read, after %d KiB: %v", read>>10, err)
		}
		read += 64 << 10
	}
	// The read loop queues again.
	fill()

	const socketAllowance = 1 << 20
	held := accepted - read - socketAllowance
	// Let the flusher go.
	a.Close()
	b.Close()
	select {
	case <-r.flushed:
	case <-time.After(3 * time.Second):
		t.Error("the flusher did not end once the stream closed")
	}
	if held > limit {
		t.Errorf("the owner holds at least %d KiB of one exchange's interim heads (accepted %d KiB, sibling read %d KiB, socket allowance %d KiB), over the %d KiB limit pending is documented to respect",
			held>>10, accepted>>10, read>>10, socketAllowance>>10, limit>>10)
	}
}
