// Package proxy is the HTTP client side (HTTP/1.1, HTTP/2 and h2c upstreams)
// of an orbit fleet: several
// processes on one Linux host that share their upstream connections through
// an [orbitpool.Pool] in shared memory. [Transport] is an [http.RoundTripper]
// that any Go program can use; the Caddy transport wraps it.
//
// # A request's path
//
// Transport computes the request's pool Key (a SHA-256 digest, truncated to
// 128 bits, of the scheme, dial address, TLS server name, verification mode,
// client certificates and [Transport.KeyExtra]) and asks the pool for a plan
// under its policy ([orbitpool.LocalFirst] by default):
//
//   - reuse a connection this process owns: the exchange runs on it here;
//   - reserve a sibling's connection: the request goes over a unix stream to
//     the owner, which accepts the lease, runs the exchange on its connection
//     and streams the response back;
//   - create one within the key's fleet-wide budget: dial (TCP or TLS with
//     session resumption) under the creation permit and register it with
//     capacity 1, in use by its creator;
//   - or wait on the pool until capacity returns anywhere in the fleet or the
//     request's context ends.
//
// A request whose body is 1 MiB or more, and an HTTP/1.1 request that is not
// replayable (one a sibling's death during its exchange would fail where a
// connection of its own process would not), creates before it reserves a
// sibling's connection ([orbitpool.CreateBeforeRemote]), unless
// [Transport.RelayUnreplayable] lets the latter go as any other.
//
// Failures are [*Error] values, but a request whose own context ended may
// get that context's error as it is, as from net/http. A closed
// transport's [ErrClosed] is not retry-safe: the same transport would
// refuse the request again. [IsRetrySafe] tells those after which nothing
// of the request can have reached the upstream (a dial, a refused lease, an
// admission refusal, a write that the kernel took no byte of): the caller may
// send the request anywhere again; the transport does so itself, whatever
// the method, when no attempt has read the body yet. Like net/http, a reused
// connection that closes before answering is retried here for replayable
// requests; so is a new one that a capped upstream closes at once while it
// still holds connections closed here early (it refuses it, full), and the
// retry waits for a connection the upstream has room for. RoundTrip
// returns an error only once the attempt's request writer has stopped, so
// the caller may close or reuse the body at once. After an answer the writer
// may still be sending the body, or making net/http's read past its
// declared length, as net/http's does: an upstream may answer before it has
// read the whole request.
//
// # The owner's side
//
// Each process ([Node]) listens on its own unix stream socket,
// [SocketPath]([SocketDir](segment), lane): directory 0700, socket 0600, and
// every peer's credentials checked with SO_PEERCRED (same uid only). Streams
// between processes are persistent: each process keeps idle streams per
// sibling. On a stream, a request frame (magic, version, flags, the lease,
// the deadline in unix nanoseconds) is followed by the HTTP/1.1 request; the
// owner answers with a frame (accept, reject with a reason, or error with the
// failure's class and whether anything was sent upstream) and, after an
// accept, the HTTP/1.1 response(s), each head preceded by a two-byte marker
// carrying what the relay changed (a close-delimited body is re-framed as
// chunked so the stream can persist: its Trailer header, if any, crosses
// renamed Orbit-Trailer, and an upstream header of that name is dropped;
// an HTTP/1.0 upstream is relayed as 1.1).
// A response body of declared length, 64 KiB or more, from a plain TCP
// upstream goes from the upstream socket to the stream with splice(2), so
// its bytes never enter the owner (counted in NodeStats.SplicedBodies);
// TLS and HTTP/2 bodies, and request bodies, are copied (BenchmarkLargeBody
// measures both ways: splicing from a unix socket costs more than copying).
// The caller holds the request body back until the accept, which the owner
// sends when its writer first needs the body (or with the first response):
// a reject, or an error before the upstream took anything, then leaves the
// body unsent, so the transport sends the request again on a fresh plan
// whatever its method, and the stream in step, so both ends keep it (the
// owner reads past the head). A short request body (at most 4 KiB, of
// declared length, no 100-continue, no trailers) is read ahead by RoundTrip
// before it takes anything (no connection, lease or permit waits on the
// client): one read, which returns what the client has sent, or waits for
// its first bytes. If that is the whole body, it goes with the frame and the
// head in one write, without waiting for the accept; the owner reads it
// before it answers, so a refusal or an error frame leaves the stream in
// step, and the kept body goes on the next plan. On the local path the same
// body is written with its head, without the writer goroutine a streamed
// body needs. Part of a body streams as it comes. Unlike net/http, and like
// nginx's request buffering, the upstream sees the head of such a request
// only once the client has sent some of its body. The owner takes up no
// worker or lease until a head of up to 64 KiB, and the short body sent with
// it, are in (a larger head is read once they are taken). It reads a head no
// further than the header limit (1 MiB at least, net/http's server default)
// and no later than the frame's deadline, and caps the idle streams of each
// sibling process: a stream over the cap that brings no frame within 100ms
// is refused (as busy, unasked) and closed.
// Interim responses are relayed as they arrive (only a 100 to a caller that
// reads none: flagNoInterim); a 101 that switches protocols (Upgrade, and
// Connection naming it, as net/http requires) turns the stream into a
// tunnel with half-close passed both ways, and both the stream and the
// upstream connection leave their pools. Any other 101 is a final answer
// without a body, after which neither is used again. A stream that sends a frame that
// does not decode, or a request that does not parse, is closed; nothing else
// is affected. A request head over the limit, or that does not parse, is
// first answered with an error frame (ErrRequestHeaderTooLarge for the
// first), which the sibling reads when its write fails as the stream
// closes: it fails at once, not retry-safe, rather than take the owner for
// gone, and does not keep the stream. While a response is being produced the owner keeps a read
// pending on the stream (after a short delay, so fast exchanges never pay for
// it): if the peer goes, the exchange is cancelled and the upstream connection
// closed rather than held. While the peer sends the body that read cannot
// run, so every 20 ms a poll asks whether the peer has closed the stream: a
// writer blocked on an upstream that reads none of the body is cancelled
// then, as a local request's cancel closes its connection. A caller looks at
// a pooled stream (one non-blocking peek) before it reuses it, as at an
// upstream connection: anything that came on it while idle closes it.
// An owner leaving (Node.Shutdown, Node.Close) first shuts its socket to
// new streams (a dial is refused at once), so none queues to be reset by
// the close; it refuses, unasked and retry-safe, the streams queued on the
// socket and those that carry no exchange (each refusal one write that
// waits for nothing, so one peer that reads nothing costs the others
// nothing), and cancels the exchanges still running, each of which answers
// its peer before its stream closes: retry-safe if the kernel had taken no
// byte of the request, so that even a POST goes elsewhere. An owner that dies
// closes its streams, so a caller reading a response from it gets an error
// at once. A panic in an exchange's
// goroutines (request writer, response reader, relay, tunnel) fails that
// exchange and is logged with its stack; the process keeps serving, as
// net/http's server does when a handler panics.
//
// # Deadlines and budgets
//
// A [backpressure.Limiter] admits requests with their context's deadline
// before they may wait on the pool, and its near-window applies at every
// later claim point of the request: the wait for a worker of the Node's
// [governor.Governor] and the wait on the pool end when the deadline comes
// within it (ErrDeadlineNear), and a dial is not started past it. The
// deadline travels in the frame to the owner, which judges it the same way
// (NodeOptions.DeadlineNearWindow), waits for a worker of its own budget no
// longer than that or NodeOptions.MaxLeaseWait, and otherwise rejects the
// lease, retry-safe, taking it up and giving it back at once so that the
// pool does not have to age it out. The caller then tries another plan
// without that owner (ErrOwnerBusy if none is left).
//
// The Node's governor is the process's one budget: every exchange, through a
// Transport or forwarded for a sibling, holds one worker for as long as it
// runs and exchange buffers of 32 KiB charged to its memory limit. A request
// takes its worker once it has a connection, a lease or a permit to dial,
// not while it waits on the pool: an owner's waiting requests would otherwise
// hold the workers its siblings' exchanges on its connections need. The
// buffers are the request body copy buffer and, on the owner, the relay
// buffer and the stream's buffers. A request body of 1 MiB or more, or of unknown length,
// asks for 8 buffers and goes out in writes that large; when memory is short
// it gets fewer, never fewer than one. A [governor.Admission] is asked before
// a dial (in flight: the connections the process owns and is dialing) and
// before a lease is taken up (in flight: the siblings' exchanges running);
// a refusal is ErrNotAdmitted, or a rejected lease.
//
// # Codec
//
// Every leg uses net/http's own HTTP/1.1 codec: [http.Request.Write] plus a
// 100-continue gate for requests, [http.ReadResponse] with net/http's loop
// over interim responses for responses, and [http.ReadRequest] on the owner.
// The design named fasthttp for the unix leg; it is not used, because the
// unix leg must give the caller exactly the *http.Response that net/http's
// Transport (Caddy's stock transport) would: the same header map and
// canonicalisation, ContentLength, TransferEncoding, Close, Trailer filled in
// at EOF, interim responses through httptrace's Got1xxResponse, the
// Expect: 100-continue decision taken by the upstream and relayed, and
// streaming chunk by chunk. fasthttp has no hook for interim responses, its
// server answers Expect: 100-continue itself, and it models trailers and
// streamed bodies differently; every difference would have to be patched
// over by hand and proven field by field. Parsing both ends with the same
// code makes the remote response the local one by construction, and the
// differential test checks it. The cost, measured by BenchmarkUnixLegCodec,
// is about 6 µs and 30 allocations per remote exchange for the extra
// serialise-and-parse of a small request and response; the remote path's
// added latency is dominated by the two extra socket wake-ups, not by parsing.
// Like net/http's, the transport asks for gzip when a request names no
// Accept-Encoding and decodes what it asked for, unless DisableCompression is
// set. On the remote path the response's TLS field is nil: the connection
// state belongs to the owner's connection.
//
// # Upstream connections
//
// A connection costs no goroutine while idle. Before each reuse, and in a
// periodic sweep, a check finds connections the upstream closed, or sent
// anything to, while idle: bufio's buffer, a non-blocking MSG_PEEK of the
// socket, and for TLS a read with a deadline in the past, which sees the
// plaintext crypto/tls has already decrypted and holds (an upstream that sent
// a second response in the record of the first). An unsolicited response is
// logged, as net/http logs it. Those and the ones past their idle
// timeout, lifetime or request count are closed and unregistered, which
// invalidates every outstanding lease on them and gives the budget back. A
// connection broken by an exchange leaves the pool at once.
//
// A response whose Content-Length body, at most 4 KiB, is already in the
// connection's buffer with its head is read into memory before RoundTrip
// returns, and the connection is free before the caller writes anything to
// its client; under a cap each waiting request gains that time. Its body
// reads as net/http's would. Under a cap, a process that holds at least two
// more of a key's connections than a sibling waiting for one retires one in
// good order toward that sibling, which dials the replacement (see
// balanceEvery in balance.go): ownership evens out, then stays. A dial
// goes the same way before it costs a move: a process about to dial leaves
// the unit to such a sibling, and one that already holds its share of the
// cap holds its dial back for a moment for a sibling about to wait, which
// spares a cold start most of its moves (see dialToward).
//
// # HTTP/2 upstreams
//
// With [Transport.HTTP2] (https, by ALPN) or [Transport.H2C] (http, prior
// knowledge), an upstream connection that speaks HTTP/2 is one pool
// resource whose capacity is the upstream's SETTINGS_MAX_CONCURRENT_STREAMS
// (at most orbitpool.MaxCapacity): a request anywhere in the fleet reserves
// one stream unit of it, and MaxConnsPerKey still counts connections, so the
// fleet's concurrent streams to a Key are bounded by the sum of its
// connections' capacities. The owner runs each stream with
// golang.org/x/net/http2's ClientConn, made on the connection it dialed (as
// net/http does), after a PING whose ack proves the peer's SETTINGS were
// read. A sibling's request crosses the unix leg as HTTP/1.1 (chunked, with
// its trailers) and its response comes back chunked with trailers
// (grpc-status included) and a head flag that restores what net/http's
// HTTP/2 client returns (Proto HTTP/2.0, no transfer coding, the declared
// Content-Length); request and response bodies flow at the same time, so
// bidirectional gRPC streams work through a sibling. Cancelling a request,
// here or in the sibling, closes its stream, and x/net/http2 resets it
// upstream (RST_STREAM). The pool capacity follows the peer's later
// SETTINGS: the ClientConn's state is read when a stream starts or ends, at
// every sweep, and whenever the connection's read loop goes back to the
// socket (so before it reads anything after the SETTINGS frame), and the
// pool told with [orbitpool.Pool.SetCapacity]. x/net/http2 reads it under
// the connection's write lock, which a write blocked in the socket holds,
// so one read per connection is in flight at a time, and the sweep's and
// the follower's run on goroutines of their own: a connection whose
// upstream stopped reading holds up no other connection's checks. A limit
// of 0 leaves the connection no room, so a request dials another within
// the budget, as
// net/http's HTTP/2 client does. Grants taken in between may
// exceed a lowered limit; they wait in the ClientConn for a stream to end
// (StrictMaxConcurrentStreams) and never put more streams on the
// connection than the peer allows. A
// GOAWAY drains the connection (capacity 0: nothing new is reserved, the
// streams in flight finish) and it leaves the pool when its last stream
// ends; a stream refused or never started because of it is retried on a
// fresh plan. A connection that leaves by policy (a drain, its idle timeout,
// which the sweep enforces rather than the ClientConn, its lifetime, the
// cap) leaves in good order, as an HTTP/1.1 one does: its unit comes back
// once the upstream has closed its socket, or after closeWait.
// CloseIdleConnections retires only a connection with no stream running and
// no unit in use or reserved anywhere in the fleet: its capacity goes to 0
// before the pool's count is read, so a request that races it is refused,
// retry-safe, and plans again. HTTP/1.1 and HTTP/2 connections of one upstream have
// different Keys. The unix leg has a version of its own (frame.go says what
// each added); a sibling of another version is refused with an error naming
// both. A stream the upstream resets mid-body (RST_STREAM)
// ends the relayed body with a trailer of the unix leg's own
// (Orbit-Stream-Reset, dropped from what the upstream sends) naming the
// stream and error code, and the sibling's reader gets http2.StreamError
// with that code, as from a local exchange; the unix stream stays in step.
// A reset before the response head fails the sibling's request as the
// owner's failure (ErrOwnerFailed wrapping ErrConnBroken, with the stream
// error's text), not as http2.StreamError.
// A response that ends with its HEADERS (gRPC's trailers-only answer, a
// 204) has length 0 and an empty body, here and in a sibling, and its
// stream's unit comes back before RoundTrip returns, as for an answer to
// HEAD. One whose body is empty but whose stream goes on (a declared length
// of 0, a 204 or a 304 before its trailers) crosses the unix leg with an
// empty chunked body, so that its trailers arrive too; a 204 or a 304 crosses
// as a 200 whose head tells the real status (headStatus).
// A request that declares both a Content-Length and trailers crosses the
// unix leg chunked, with its length in the request frame, so that an HTTP/2
// upstream gets both, as from a local exchange. Interim responses are
// bounded as on HTTP/1.1: by the header limit, unless the caller sees them
// through httptrace's Got1xxResponse and bounds them itself. The owner
// relays them from the read loop of an HTTP/2 connection, which the whole
// fleet's exchanges on it share, so it never waits there for a sibling to
// read: heads the stream has no room for queue, up to the header limit, and
// go out behind it. With the queue full, the read loop waits for the
// sibling to read some, as a slow hook would hold it on the local path; a
// sibling that reads none for 250ms fails that exchange, told why in an
// error frame.
// HTTP/2 field values may begin or end with spaces or tabs, which
// HTTP/1.1's text trims: the fields that hold one cross the unix leg in a
// field of its own (Orbit-Padded; one the client or the upstream sent under
// that name crosses in it too), in request heads and in response heads and
// trailers, and in request trailers, wrapped as the body ends (the caller
// may set them until then), so that they arrive as sent. The owner holds a
// request head to its limit as the caller wrote it, before the wrap. An
// HTTP/2 response's trailers cross after its chunked body, as a block
// bounded as a head is, for net/http's chunked reader takes trailers only
// up to its 4 KiB read buffer; for the same reason the owner reads a
// sibling's chunked request body itself, and its trailers bounded as the
// head is. A request without a User-Agent field gets the owner's client's
// default, HTTP/2's to an HTTP/2 upstream.
//
// Known differences from a local HTTP/2 exchange, for a sibling's: the unix
// stream of an exchange whose response head went out before its request
// body ended (any bidirectional stream) is closed afterwards rather than
// reused, because the owner tells the stream's fate in the head.
//
// The package is Linux-only (SO_PEERCRED, MSG_PEEK through x/sys/unix).
//
// # Tests and benchmarks
//
//	go test ./proxy/...                      # differential, failures, multi-process, kill -9
//	go test -race ./proxy/...
//	go test -run '^$' -fuzz FuzzDecodeFrame ./proxy/
//	go test -run '^$' -bench . -benchmem ./proxy/
//
// BenchmarkThroughput compares the local and remote paths with
// net/http.Transport (same upstream, in another process): requests/s, CPU
// time of this process per request, and allocations per request.
// BenchmarkRemoteAddedLatency reports p50/p99 of the local and remote paths
// and their difference, and times a bare round trip on a unix stream in the
// same loop: what the hop adds over that (added-over-rtt-p50-us) is its own
// work, which a loaded machine inflates less than the difference itself.
// It times too a round trip that carries a TCP connection's descriptor
// back (SCM_RIGHTS) and makes it a net.Conn (fd-rtt-p50-us): the floor of a
// hop that would lend the owner's connection to the sibling for one
// exchange rather than relay it.
// Built with -tags orbithopclock it also reports the median of each stage
// of a remote exchange (hopclock.go names them: the caller's write and the
// owner's wake-up, the owner's admission, lease and head parse, the
// upstream exchange, the relay, the caller's wake-up and parse):
//
//	go test -tags orbithopclock -run '^$' -bench RemoteAddedLatency ./proxy/
//
// BenchmarkMemoryPerIdleConn and
// BenchmarkMemoryPerRemoteStream report bytes per idle connection and per
// in-flight remote stream (both ends). BenchmarkUnixLegCodec measures the
// codec work of the unix leg.
package proxy
