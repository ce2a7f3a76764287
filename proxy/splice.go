package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// spliceMinBody is the smallest response body the owner moves from a plain
// TCP upstream connection to a sibling's unix stream with splice(2) instead
// of copying it through its own memory: below it, the pipe and the extra
// system calls cost more than the copy. A variable so that tests can send
// every body through the splice path.
//
// Request bodies, from the stream to the upstream, are copied. Splicing
// them (Go's TCPConn.ReadFrom from the unix stream) cost 22% more CPU per
// MiB than copying in BenchmarkLargeBody: a unix socket's buffers are not
// page-backed, so the kernel copies them into the pipe anyway, and the copy
// path moves up to 256 KiB per system call where splice moves what one
// socket buffer holds.
var spliceMinBody int64 = 64 << 10

// spliceResponse moves the n bytes of a response body left after what the
// head's reader buffered, from the upstream connection src to the peer
// stream dst, through a pipe: the bytes go from one socket to the other
// inside the kernel. Go's own splice (TCPConn.ReadFrom) only writes to a
// TCP connection, and TCPConn.WriteTo to a unix socket copies until EOF,
// which a body on a persistent connection does not end with. The waits use
// the connections' pollers, so their deadlines and Close apply as to any
// read or write. A short body (the upstream closing early) is
// io.ErrUnexpectedEOF; an error writing to dst is wrapped in errPeerWrite.
// p is an empty pipe, which the caller closes.
func spliceResponse(dst *net.UnixConn, src *net.TCPConn, p *[2]int, n int64) (written int64, err error) {
	rs, err := src.SyscallConn()
	if err != nil {
		return 0, err
	}
	ws, err := dst.SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("%w: %w", errPeerWrite, err)
	}
	// The default pipe (64 KiB) did as well as 256 KiB and 1 MiB ones
	// in BenchmarkLargeBody.
	const size = 64 << 10
	for n > 0 {
		// The pipe is empty here, so EAGAIN means the socket has
		// nothing to read yet.
		inPipe, err := spliceStep(rs, false, p[1], int(min(n, size)))
		if err != nil {
			return written, err
		}
		if inPipe == 0 {
			return written, io.ErrUnexpectedEOF
		}
		n -= int64(inPipe)
		// The pipe holds data here, so EAGAIN means the stream's send
		// buffer is full.
		for inPipe > 0 {
			out, err := spliceStep(ws, true, p[0], inPipe)
			if err == nil && out == 0 {
				err = io.ErrShortWrite
			}
			if err != nil {
				return written, fmt.Errorf("%w: %w", errPeerWrite, err)
			}
			inPipe -= out
			written += int64(out)
		}
	}
	return written, nil
}

// spliceStep moves up to n bytes with one splice(2) between the socket
// under c and a pipe end: from the socket into the pipe, or with toSocket
// from the pipe into the socket. While the socket would block it waits on
// c's poller, for reading or for writing.
func spliceStep(c syscall.RawConn, toSocket bool, pipe, n int) (moved int, err error) {
	var serr error
	step := func(fd uintptr) bool {
		in, out := int(fd), pipe
		if toSocket {
			in, out = pipe, int(fd)
		}
		for {
			m, err := unix.Splice(in, nil, out, nil, n, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
			switch err {
			case unix.EINTR:
				continue
			case unix.EAGAIN:
				return false
			}
			moved, serr = int(m), err
			return true
		}
	}
	if toSocket {
		err = c.Write(step)
	} else {
		err = c.Read(step)
	}
	if err == nil && serr != nil {
		err = os.NewSyscallError("splice", serr)
	}
	return moved, err
}

// spliceTo relays the whole of a response body of length n, which nothing
// has read yet, to the peer stream: what the head's reader buffered through
// bw, the rest with spliceResponse. handled is false, and nothing is done,
// unless the body is spliceMinBody or more, the stream a unix socket, and
// the upstream connection plain TCP with HTTP/1.x on it. The body then ends as a Read to EOF (or a failure) would end it.
func (b *body) spliceTo(stream net.Conn, bw *bufio.Writer, n int64) (handled bool, err error) {
	c := b.x.c
	src, ok := c.nc.(*net.TCPConn)
	dst, ok2 := stream.(*net.UnixConn)
	if !ok || !ok2 || b.relayed != nil || n < spliceMinBody {
		return false, nil
	}
	// The pipe before anything goes out: a process with no descriptor to
	// spare copies the body, as it would a smaller one, rather than fail
	// the exchange after its head has gone to the peer.
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return false, nil
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	if k := min(int64(c.br.Buffered()), n); k > 0 {
		head, _ := c.br.Peek(int(k))
		bw.Write(head)
		c.br.Discard(int(k))
		n -= k
	}
	if err = bw.Flush(); err == nil {
		_, err = spliceResponse(dst, src, &p, n)
	} else {
		err = fmt.Errorf("%w: %w", errPeerWrite, err)
	}
	switch {
	case err == nil:
		b.stop(io.EOF, true)
		return true, nil
	case errors.Is(err, errPeerWrite):
		// Mid-body, the upstream connection is out of step.
		c.abort(err)
	default:
		err = b.mapErr(err)
	}
	b.stop(err, false)
	return true, err
}
