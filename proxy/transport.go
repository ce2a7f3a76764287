package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/orbitproxy/orbit/backpressure"
	"github.com/orbitproxy/orbit/governor"
	"github.com/orbitproxy/orbit/orbitpool"
	"go.uber.org/zap"
	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2"
)

// Transport is an http.RoundTripper for HTTP/1.1 upstreams whose connections
// are shared by every process of a fleet through its Node. Its zero value is
// not usable: Node is required. Its fields must not change after first use.
type Transport struct {
	// Node is this process's membership of the fleet. Required.
	Node *Node

	// TLSClientConfig is used for https upstreams: its certificates are the
	// client identity and go into the Key, with ServerName and
	// InsecureSkipVerify. Nothing else of it does: a request may be served
	// on a connection another Transport of the fleet (or of this process)
	// dialed and verified under its own config for the same Key. Put what
	// distinguishes how a Transport verifies its upstream (RootCAs,
	// VerifyPeerCertificate, VerifyConnection, versions, cipher suites)
	// into KeyExtra, as the Caddy module does with its TLS settings.
	// Sessions are resumed from a cache shared by the Transport's
	// connections unless it brings its own.
	TLSClientConfig *tls.Config
	// DialTimeout bounds a TCP connect plus TLS handshake. Default 10s.
	DialTimeout time.Duration
	// KeepAlive is the TCP keep-alive period. Default: the net package's.
	KeepAlive time.Duration
	// IdleConnTimeout closes a connection idle this long. Default 90s;
	// negative means never.
	IdleConnTimeout time.Duration
	// MaxConnLifetime closes a connection this old when it next goes idle.
	// Zero means no limit.
	MaxConnLifetime time.Duration
	// MaxRequestsPerConn closes a connection after this many requests. Zero
	// means no limit.
	MaxRequestsPerConn int
	// MaxConnsPerKey caps the connections to one upstream Key across the
	// whole fleet, live and being dialed. Zero means no cap. A connection
	// that leaves by its limits or a drain counts until the upstream has
	// closed its side too (at most 250ms after the half-close), so that an
	// upstream enforcing the same cap never sees its replacement early.
	MaxConnsPerKey int
	// MaxDialingPerKey caps the connections to one Key being dialed at once
	// across the fleet, so a cold upstream is not stampeded. Zero means no
	// cap for HTTP/1.1, and 1 for HTTP/2 and h2c: a request that finds no
	// stream free waits (within its deadline) for the connection being
	// dialed rather than dial its own, so a burst to a cold upstream opens
	// one connection. For https with HTTP2, that holds until a dial finds the
	// upstream choosing http/1.1 by ALPN. A connection with as many
	// reservations in flight to its owner as the pool allows
	// (orbitpool.PendingReservations) counts as full, so a burst of more
	// than that from one sibling at once may still dial a second one.
	MaxDialingPerKey int
	// RelayUnreplayable lets a request that is not replayable go through
	// a sibling's idle HTTP/1.1 connection before it dials one of its own,
	// under LocalFirst, as a replayable one does (see Policy). Default
	// false.
	RelayUnreplayable bool
	// Policy chooses between local reuse, remote reuse, creation and
	// waiting. Default orbitpool.LocalFirst. Under LocalFirst, a request
	// whose body declares 1 MiB or more goes by
	// orbitpool.CreateBeforeRemote: it opens a connection of its own
	// within the key's budget before it has a sibling relay every byte
	// (the remote path costs about 1.7 times the local path's CPU per
	// MiB, BenchmarkLargeBody), and uses a sibling's once the budget is
	// spent or when that dial fails (the admission backstop refuses it, or
	// the upstream takes no new connection). So does an HTTP/1.1 request
	// that could not be sent again if its sibling died during the exchange
	// (not replayable: a POST without an Idempotency-Key), which would fail
	// where the stock transport's would not (unless RelayUnreplayable). So
	// does, without MaxConnsPerKey, a request to an HTTP/1.1 upstream whose
	// requests this process keeps relaying (see claimDial), except that a
	// full table sends it through the sibling rather than make room. Under
	// orbitpool.CreateBeforeRemote every request goes so. Under
	// orbitpool.LocalOnly, MaxConnsPerKey is best left 0: a process whose
	// siblings hold the capped connections waits for one until its
	// requests time out (the orbit_pool app refuses the two together).
	Policy orbitpool.Policy
	// MaxResponseHeaderBytes limits the response header. On HTTP/2 it
	// bounds the header list as net/http's client does, with an allowance
	// for HPACK's per-field overhead. Default 10 MiB.
	MaxResponseHeaderBytes int64
	// ExpectContinueTimeout is how long a request with Expect: 100-continue
	// waits for the upstream's 100 before sending its body anyway. Default
	// 1s; negative means send at once.
	ExpectContinueTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait for the response head after the
	// request is written. Zero means none (the request's context still
	// applies).
	ResponseHeaderTimeout time.Duration
	// Limiter, if set, admits each request with its context's deadline
	// before it may wait on the pool, and holds the permit until the
	// exchange is over. Its near-window applies at every later claim point
	// of the request too: the wait for a worker of the Node's governor, the
	// wait on the pool (which ends that long before the deadline), a dial.
	Limiter *backpressure.Limiter
	// KeyExtra is mixed into every Key: anything else about this
	// Transport's connections that forbids sharing them with another
	// Transport's.
	KeyExtra string
	// MaxRetries bounds how often one request is sent again after a
	// retry-safe failure. Default 3. A lease refused because the owner's
	// connection is gone costs none, the first time each owner refuses
	// one for the request; nor does a stream an HTTP/2 connection of this
	// process refused as it went away (a GOAWAY), once per connection; in
	// all, no more of these than the fleet had connections to the
	// upstream when the request was first refused so, and one, or six
	// (as x/net's HTTP/2 client), whichever is more. Past those, six more
	// retries after an upstream went away cost none either, each but the
	// first after a wait, longer each time (see awayBackoff), so that a
	// restart does not refuse them all.
	MaxRetries int
	// HTTP2 offers HTTP/2 to https upstreams by ALPN (h2, then http/1.1):
	// a connection on which the upstream chooses h2 is one pool resource
	// with room for as many concurrent requests as the upstream's
	// SETTINGS_MAX_CONCURRENT_STREAMS, used by every process of the fleet.
	// Default false: HTTP/1.1 only.
	HTTP2 bool
	// H2C speaks HTTP/2 with prior knowledge (h2c) to http upstreams,
	// pooled as HTTP2 pools it. Default false: HTTP/1.1.
	H2C bool
	// DisableCompression stops the transport from asking for gzip when the
	// request names no Accept-Encoding, and from decoding gzip responses it
	// asked for. As with net/http, compression is on by default.
	DisableCompression bool

	initOnce  sync.Once
	dialer    dialer
	settings  connSettings
	remote    remoteOpts
	h2t       *http2.Transport
	upstreams sync.Map // "scheme://host" -> *upstreamEntry
	// last is the entry most recently looked up: a transport usually talks
	// to one upstream, and this spares each request a key string and a map
	// lookup.
	last atomic.Pointer[upstreamEntry]
	// fullPauseBase, set only by tests, replaces every pause of fullPause.
	fullPauseBase time.Duration
}

type upstreamEntry struct {
	u    upstream
	host string // as the request URL names it
	name string // scheme://host:port
	key  orbitpool.Key
	// spokeH1 is set while an https upstream offered h2 chooses http/1.1
	// by ALPN (as the last connection dialed here, or used here through a
	// sibling, saw it).
	spokeH1 atomic.Bool
	// relays counts this process's requests sent through a sibling's
	// HTTP/1.1 connection since it last took one of its own, each within
	// relayWindow of the one before (see claimDial): the count in its low
	// relayCountBits, and above them when the last was, in milliseconds
	// since processStart. One word, so that concurrent relays neither
	// lose counts nor reset each other's window.
	relays atomic.Uint64
	// paidFails counts the dials relays paid for (see claimDial) that
	// failed since this process last connected to e.
	paidFails atomic.Uint32
}

// relayWindow is how close together relays must come to add up (see
// owesDial): a process short of connections for its own load relays many
// times a second; one whose siblings' idle connections absorb a burst now
// and then relays a few, which cost less than connections of its own.
const relayWindow = time.Second

// Relays per dial: how many requests a process sends through a sibling's
// connection, within relayWindow of each other, before its next one
// dials a connection of its own instead (see claimDial). A relay costs the
// fleet about 36µs of CPU more than the same exchange on a connection of
// the process's own (BenchmarkThroughput, orbit-remote against
// orbit-local), every time; a dial costs once, a TCP handshake, and over
// TLS a handshake that costs the upstream too.
const (
	relaysPerDial    = 4
	relaysPerTLSDial = 32
)

const relayCountBits = 16

// relayState splits upstreamEntry.relays.
func relayState(w uint64) (lastMs, count uint64) {
	return w >> relayCountBits, w & (1<<relayCountBits - 1)
}

// relayedAt counts a request sent through a sibling's connection at now
// (sinceStart).
func (e *upstreamEntry) relayedAt(now int64) {
	nowMs := sinceStartMs(now)
	for {
		w := e.relays.Load()
		last, n := relayState(w)
		switch {
		case nowMs > last+uint64(relayWindow/time.Millisecond):
			n = 0
		case nowMs < last:
			nowMs = last // a concurrent relay's later clock
		}
		if e.relays.CompareAndSwap(w, nowMs<<relayCountBits|min(n+1, 1<<relayCountBits-1)) {
			return
		}
	}
}

func (e *upstreamEntry) relayed() { e.relayedAt(sinceStart(time.Now())) }

// sinceStartMs is now (sinceStart) in the milliseconds relays counts in.
func sinceStartMs(now int64) uint64 { return uint64(max(now, 0) / int64(time.Millisecond)) }

// tookOwn counts a connection of e's that this process took as its own
// (dialed, or adopted from its spares): the relays are paid, and a failed
// paid dial before it forgotten.
func (e *upstreamEntry) tookOwn() {
	if e.relays.Load() != 0 {
		e.relays.Store(0)
	}
	if e.paidFails.Load() != 0 {
		e.paidFails.Store(0)
	}
}

// claimDial reports whether this process has relayed enough of e's requests,
// close enough together, that its next request that finds no idle connection
// of its own should dial one rather than relay again, and takes the relays
// for the one request it reports true for: a burst of requests that find
// them owed buys one dial with them, not one each. Ski rental, which
// rents (relays) until the rent paid is about what buying (dialing) costs,
// and so pays at most about twice what the better of the two would have,
// whether the shortage lasts or not. Without it, a process with more clients
// than connections (a cold start, clients spread anew by a reload or a kill)
// relayed a share of its requests for as long as its siblings' connections
// went idle between their own requests: at a cold start under the fast demo,
// the relays cost a tenth of the workers' CPU in the first second. A capped
// key keeps its connections where the balancer puts them, and an HTTP/2 one
// carries every process's streams; neither dials for this.
func (e *upstreamEntry) claimDial(capped bool) bool {
	if capped || e.speaksH2() {
		return false
	}
	n := e.relaysOwed()
	w := e.relays.Load()
	last, count := relayState(w)
	return count >= uint64(n) && sinceStartMs(sinceStart(time.Now())) <= last+uint64(relayWindow/time.Millisecond) &&
		e.relays.CompareAndSwap(w, 0)
}

// unclaimDial gives back the relays claimDial took, for a dial that was not
// tried: the fleet had no creation budget for it, and its request went
// through a sibling.
func (e *upstreamEntry) unclaimDial() {
	owed := uint64(e.relaysOwed())
	nowMs := sinceStartMs(sinceStart(time.Now()))
	for {
		w := e.relays.Load()
		last, count := relayState(w)
		if count >= owed || e.relays.CompareAndSwap(w, max(nowMs, last)<<relayCountBits|owed) {
			return
		}
	}
}

// relaysOwed is how many relays buy a dial to e: relaysPerDial (or
// relaysPerTLSDial), doubled for each paid dial that failed since the last
// connected, up to maxPaidBackoff times. An upstream whose new connections
// fail (refused, or a handshake that hangs) while its established ones
// serve costs the requests that try it ever fewer of them, and half their
// time each for a hung handshake, rather than one in every few.
func (e *upstreamEntry) relaysOwed() int {
	n := relaysPerDial
	if e.u.Scheme == "https" {
		n = relaysPerTLSDial
	}
	return n << min(e.paidFails.Load(), maxPaidBackoff)
}

// maxPaidBackoff bounds relaysOwed's doublings: 256 relays over plain
// HTTP, 2048 over TLS.
const maxPaidBackoff = 6

// sawProto records what an https upstream offered h2 chose on a connection
// this process dialed or used through a sibling: a process that only ever
// uses its siblings' connections learns it too, and stops taking an
// HTTP/1.1 upstream for an HTTP/2 one (see once).
func (e *upstreamEntry) sawProto(h2 bool) {
	if e.u.Proto == protoHTTP2 && e.spokeH1.Load() == h2 {
		e.spokeH1.Store(!h2)
	}
}

// speaksH2 reports whether e's connections speak HTTP/2: h2c, or https
// unless the upstream chose http/1.1 by ALPN on the last one dialed here.
func (e *upstreamEntry) speaksH2() bool {
	switch e.u.Proto {
	case protoH2C:
		return true
	case protoHTTP2:
		return !e.spokeH1.Load()
	}
	return false
}

func (t *Transport) init() {
	t.dialer = dialer{timeout: t.DialTimeout, keepAlive: t.KeepAlive, sessions: tls.NewLRUClientSessionCache(256)}
	idle := t.IdleConnTimeout
	switch {
	case idle == 0:
		idle = 90 * time.Second
	case idle < 0:
		idle = 0
	}
	ect := t.ExpectContinueTimeout
	switch {
	case ect == 0:
		ect = time.Second
	case ect < 0:
		ect = 0
	}
	mh := t.MaxResponseHeaderBytes
	if mh <= 0 {
		mh = defaultMaxHeaderBytes
	}
	t.settings = connSettings{
		idleTimeout:           idle,
		maxLifetime:           t.MaxConnLifetime,
		maxRequests:           t.MaxRequestsPerConn,
		maxHeaderBytes:        mh,
		expectContinueTimeout: ect,
		responseHeaderTimeout: t.ResponseHeaderTimeout,
	}
	t.h2t = t.newH2Transport()
	t.remote = remoteOpts{maxHeaderBytes: mh, expectContinueTimeout: ect, responseHeaderTimeout: t.ResponseHeaderTimeout}
}

// upstream resolves the request's upstream identity and Key, cached per
// scheme and address.
func (t *Transport) upstream(req *http.Request) (*upstreamEntry, error) {
	scheme := strings.ToLower(req.URL.Scheme)
	if scheme != "http" && scheme != "https" {
		return nil, &Error{Op: "request", RetrySafe: true, Err: fmt.Errorf("unsupported protocol scheme %q", req.URL.Scheme)}
	}
	host := req.URL.Host
	if host == "" {
		return nil, &Error{Op: "request", RetrySafe: true, Err: errors.New("no Host in request URL")}
	}
	// A WebSocket upgrade cannot go over HTTP/2 (x/net refuses its
	// Upgrade header): as net/http's Transport does (requiresHTTP1), it
	// goes on an HTTP/1.1 connection, under the upstream's HTTP/1.1 Key.
	// Such entries never become last.
	h1only := (scheme == "https" && t.HTTP2 || scheme == "http" && t.H2C) && requiresHTTP1(req)
	if e := t.last.Load(); e != nil && !h1only && e.host == host && e.u.Scheme == scheme {
		return e, nil
	}
	id := scheme + "://" + host
	if h1only {
		id = "h1 " + id
	}
	if e, ok := t.upstreams.Load(id); ok {
		if !h1only {
			t.last.Store(e.(*upstreamEntry))
		}
		return e.(*upstreamEntry), nil
	}
	addr := host
	if req.URL.Port() == "" {
		port := "80"
		if scheme == "https" {
			port = "443"
		}
		addr = net.JoinHostPort(req.URL.Hostname(), port)
	}
	u := upstream{Scheme: scheme, Addr: addr, TLS: t.TLSClientConfig}
	switch {
	case h1only:
	case scheme == "http" && t.H2C:
		u.Proto = protoH2C
	case scheme == "https" && t.HTTP2:
		u.Proto = protoHTTP2
	}
	e := &upstreamEntry{u: u, host: host, name: scheme + "://" + addr, key: keyFor(&u, effectiveServerName(&u), t.KeyExtra)}
	if t.Node != nil {
		t.Node.setCap(e.key, t.MaxConnsPerKey, addr)
	}
	v, _ := t.upstreams.LoadOrStore(id, e)
	if !h1only {
		t.last.Store(v.(*upstreamEntry))
	}
	return v.(*upstreamEntry), nil
}

// requiresHTTP1 reports whether req is a WebSocket upgrade, which net/http's
// Transport sends only over HTTP/1.1.
func requiresHTTP1(req *http.Request) bool {
	return httpguts.HeaderValuesContainsToken(req.Header["Connection"], "upgrade") &&
		strings.EqualFold(req.Header.Get("Upgrade"), "websocket")
}

// Upstream names the upstream req goes to (scheme://host:port, with the
// scheme's default port filled in) and the pool Key its connections are
// filed under, so that an embedder can label what it sees in the pool table.
func (t *Transport) Upstream(req *http.Request) (name string, key orbitpool.Key, err error) {
	e, err := t.upstream(req)
	if err != nil {
		return "", orbitpool.Key{}, err
	}
	return e.name, e.key, nil
}

// RoundTrip implements http.RoundTripper. It takes a local connection with
// room, else reserves a sibling's and sends the request to its owner, else
// dials within the fleet-wide budget, else waits on the pool until the
// request's context ends. Errors are *Error where the transport classified
// them; IsRetrySafe tells those after which nothing could have reached the
// upstream.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.initOnce.Do(t.init)
	var tb *trackBody // req.Body, once wrapped: it closes the body once
	closeBody := func() {
		switch {
		case tb != nil:
			tb.closeNow()
		case req.Body != nil:
			req.Body.Close()
		}
	}
	if t.Node == nil {
		closeBody()
		return nil, errors.New("proxy: Transport has no Node")
	}
	if req.URL == nil {
		closeBody()
		return nil, errors.New("proxy: nil Request.URL")
	}
	if req.Header == nil {
		closeBody()
		return nil, errors.New("proxy: nil Request.Header")
	}
	if req.RequestURI != "" {
		closeBody()
		return nil, errors.New("proxy: Request.RequestURI can't be set in client requests")
	}
	// As net/http's Transport: Request.Write writes the method as it is,
	// so that one with a space or CRLF in it would put a request line, or
	// a whole request, of the caller's making on the connection; it would
	// drop a field of an invalid name, and send a value with control bytes
	// as it is, to the upstream, or to an owner whose parser refuses it.
	if req.Method != "" && !httpguts.ValidHeaderFieldName(req.Method) { // a token, as a field name is
		closeBody()
		return nil, fmt.Errorf("proxy: invalid method %q", req.Method)
	}
	// Request.Write refuses a request line with control bytes, but only once
	// a connection or a stream is taken, which the failed write then tears
	// down, on every retry. They can come only from the URL's opaque part
	// or its query: RequestURI escapes the path (a RawPath with them is not
	// valid, and not used), so these two are checked without building it.
	if hasCTL(req.URL.Opaque) || hasCTL(req.URL.RawQuery) {
		closeBody()
		return nil, errors.New("proxy: can't write control character in Request.URL")
	}
	if msg := invalidField(req.Header); msg != "" {
		closeBody()
		return nil, fmt.Errorf("proxy: invalid header %s", msg)
	}
	// Trailers too: a sibling's unix leg would otherwise carry a name with
	// a space in it as another field (see paddedField).
	if msg := invalidField(req.Trailer); msg != "" {
		closeBody()
		return nil, fmt.Errorf("proxy: invalid trailer %s", msg)
	}
	e, err := t.upstream(req)
	if err != nil {
		closeBody()
		return nil, err
	}
	r := req
	if req.Body != nil && req.Body != http.NoBody {
		tb = &trackBody{rc: req.Body, log: t.Node.log}
		r = shallowWithBody(req, tb)
		if ReadsAhead(req) {
			// Before anything is held: no connection, lease or permit
			// waits on the client's body.
			if err := tb.readAhead(req.ContentLength); err != nil {
				closeBody()
				return nil, err
			}
		}
	}
	ctx := req.Context()
	b, err := t.budget(ctx, req)
	if err != nil {
		closeBody()
		return nil, err
	}
	var release func()
	returned := false
	if b != nil {
		release = b.release
		defer func() {
			if !returned {
				// A panic out of an attempt (a Policy's, say) goes to
				// the caller, which may recover it and serve on: the
				// permit and worker must not go with it, for nothing
				// else would give them back.
				b.release()
			}
		}()
	}
	gz := !t.DisableCompression && wantsGzip(req)
	if gz {
		r = withGzip(r)
	}
	maxRetries := t.MaxRetries
	if maxRetries <= 0 {
		maxRetries = 3
	}
	var avoid avoided // owners that rejected this request
	for paid, away := 0, 0; ; {
		onDone, delivered := attemptRelease(release)
		resp, err := t.once(r, e, b, &avoid, onDone)
		if err == nil {
			delivered()
			if tb != nil {
				tb.settle()
			}
			if resp.Request == r && r != req {
				resp.Request = req
			}
			if gz {
				ungzip(resp)
			}
			returned = true
			return resp, nil
		}
		free := avoid.freeRetry(err, func() int { return t.freeRetries(e.key) })
		gone := !free && wentAway(err) && away < maxAwayRetries
		if (free || gone || paid < maxRetries) && ctx.Err() == nil && !isRefusal(err) {
			next, ok := rewind(req, r, tb, err)
			if ok && gone && !t.awayBackoff(ctx, away, b) {
				ok = false
			} else if w := waitWatcher(ctx); ok && w != nil {
				w.Retrying(refusedUnserved(err))
				// A refused attempt that spent what was left of the
				// wait fails the request with what refused it (an
				// owner busy, say), not with a retry that could only
				// find the context done.
				ok = ctx.Err() == nil
			}
			if !ok && next != nil {
				dropRetry(next, r)
			}
			if ok {
				switch {
				case gone:
					away++
				case !free:
					paid++
				}
				t.Node.stats.retries.Add(1)
				if nb, ok := next.Body.(*trackBody); ok && next != r {
					tb = nb
				} else if tb != nil && next == r {
					tb.again()
				}
				if gz && next != r {
					next = withGzip(next)
				}
				r = next
				continue
			}
		}
		if release != nil {
			release()
		}
		if tb != nil {
			// The body panicked or failed (a client that sent too much,
			// say, http.MaxBytesReader's *MaxBytesError): that, rather
			// than what it did to the exchange, is the request's error,
			// as net/http returns it.
			if p := tb.failure.Load(); p != nil {
				err = &Error{Op: "write", Err: *p}
			}
		}
		closeBody()
		if cerr := ctx.Err(); cerr != nil && !isContextErr(err) {
			// Keep what the attempt saw (a wait's reason, say) behind
			// the context's error.
			err = fmt.Errorf("%w: %w", cerr, err)
		}
		returned = true
		return nil, err
	}
}

// invalidField names the first field of h whose name or value a request may
// not carry, or is empty. Not the value, which may be sensitive.
func invalidField(h http.Header) string {
	for k, vv := range h {
		if !httpguts.ValidHeaderFieldName(k) {
			return fmt.Sprintf("field name %q", k)
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return fmt.Sprintf("field value for %q", k)
			}
		}
	}
	return ""
}

// exchangeBudget is what a request holds for its exchange: a permit of the
// Limiter, from the start, and a worker of the Node's governor with the
// exchange buffers it wants (several for a large body, fewer when memory is
// short, never none), from the moment an attempt has a plan. A request that
// waits for the pool holds no worker: on an owner, the workers its own
// waiting requests held would be missing to the siblings' exchanges on its
// connections, whose leases it would then refuse as busy.
type exchangeBudget struct {
	t      *Transport
	req    *http.Request
	permit *backpressure.Permit
	ls     *governor.LeaseSet
	done   atomic.Bool
}

// budget admits req through the Limiter, if there is one. Without a Limiter
// or a governor there is nothing to hold, and the budget is nil.
func (t *Transport) budget(ctx context.Context, req *http.Request) (*exchangeBudget, error) {
	if t.Limiter == nil && t.Node.gov == nil {
		return nil, nil
	}
	b := &exchangeBudget{t: t, req: req}
	if t.Limiter != nil {
		p, err := t.Limiter.Acquire(ctx)
		if err != nil {
			return nil, &Error{Op: "admit", RetrySafe: true, Err: err}
		}
		b.permit = p
	}
	return b, nil
}

// workers takes the governor's worker and buffers; the wait ends near the
// request's deadline. It returns how many exchange buffers the request may
// use. An attempt that goes back to the pool gives them up first (see
// idle).
func (b *exchangeBudget) workers(ctx context.Context) (int, error) {
	if b == nil || b.t.Node.gov == nil {
		return 1, nil
	}
	if b.ls != nil {
		return b.ls.Workers(), nil
	}
	hasBody := b.req.Body != nil && b.req.Body != http.NoBody
	want := bufsFor(hasBody, b.req.ContentLength)
	// Free workers are the common case: taken without the wait's
	// context, whose deadline and timer cost more than the take.
	if ls, ok := b.t.Node.gov.TryAcquireMany(want, exchangeBuf); ok {
		b.ls = ls
		return ls.Workers(), nil
	}
	wctx, cancel := waitContext(ctx, b.t.nearWindow())
	ls, err := b.t.Node.gov.AcquireManyContext(wctx, want, exchangeBuf)
	cancel()
	if err != nil {
		return 0, &Error{Op: "budget", RetrySafe: true, Err: waitEnd(ctx, err)}
	}
	b.ls = ls
	return ls.Workers(), nil
}

// idle gives back the worker and buffers before the request waits on the
// pool again (a retry, or a plan that fell through): holding a worker while
// waiting for a connection is hold-and-wait, which deadlocks against a
// request that holds the connection's unit and waits for the worker. The
// permit is kept: it is the request's admission, not its exchange's.
func (b *exchangeBudget) idle() {
	if b != nil && b.ls != nil {
		b.ls.Release()
		b.ls = nil
	}
}

// release gives back what the request holds, once.
func (b *exchangeBudget) release() {
	if b.done.CompareAndSwap(false, true) {
		b.permit.Release()
		b.ls.Release()
	}
}

// nearWindow is how close to its deadline a request may still start work.
func (t *Transport) nearWindow() time.Duration {
	if t.Limiter != nil {
		return t.Limiter.NearWindow()
	}
	return 0
}

// attemptRelease ties the admission permit to the attempt that delivers a
// response: it is released when that exchange ends, and a failed attempt
// (which the caller may retry) leaves it held. onDone is the exchange's end;
// delivered is called when the attempt returns a response. Either may come
// first: a response without a body ends its exchange before it is returned.
func attemptRelease(release func()) (onDone, delivered func()) {
	if release == nil {
		return nil, func() {}
	}
	var state atomic.Uint32 // 0 running, 1 delivered, 2 exchange ended first
	onDone = func() {
		if !state.CompareAndSwap(0, 2) {
			release()
		}
	}
	delivered = func() {
		if !state.CompareAndSwap(0, 1) {
			release()
		}
	}
	return onDone, delivered
}

// once runs one attempt: acquire a plan and carry it out, on the worker and
// buffers. An owner that rejects the request for want of room in time
// (ErrOwnerBusy), or because it is leaving the fleet, is added to avoid, and
// later attempts do not reuse its connections.
//
// Each claim point judges the request's deadline as the Limiter did (see
// claimVerdict): before the pool is asked, and before a dial; the wait on
// the pool ends when the deadline comes within the near-window. A dial is
// also put to the admission backstop.
func (t *Transport) once(req *http.Request, e *upstreamEntry, b *exchangeBudget, avoid *avoided, release func()) (*http.Response, error) {
	n := t.Node
	ctx := req.Context()
	lim := orbitpool.Limits{MaxResources: t.MaxConnsPerKey, MaxCreating: t.MaxDialingPerKey}
	policy := t.Policy
	if policy == nil {
		policy = orbitpool.LocalFirst{}
	}
	// A request with a large body prefers a connection of its own to a
	// sibling relaying every byte of it, as every request does under
	// CreateBeforeRemote; so does an HTTP/1.1 request that could not be
	// sent again if the sibling died with its exchange under way (see
	// isReplayable): on a connection of its own, only the death of its own
	// process fails it, as with the stock transport. (An HTTP/2 upstream's
	// one connection carries every process's streams, whatever their
	// method.) That dial is only a preference: without budget for it the
	// request takes a sibling's connection, and a dial that fails (refused
	// by admission or by the upstream) goes back to LocalFirst, which may
	// find a sibling's.
	var fallback orbitpool.Policy
	relaysPaid := false // the dial preferred is one relays paid for
	switch policy.(type) {
	case orbitpool.LocalFirst:
		switch {
		case req.ContentLength >= largeBody || !t.RelayUnreplayable && !e.speaksH2() && !isReplayable(req):
			fallback, policy = policy, orbitpool.CreateBeforeRemote{}
		case e.claimDial(t.MaxConnsPerKey > 0):
			fallback, policy = policy, orbitpool.CreateBeforeRemote{}
			relaysPaid = true
		}
	case orbitpool.CreateBeforeRemote:
		fallback = orbitpool.LocalFirst{}
	}
	// A request of the default policy may leave its dial to a sibling
	// that holds fewer of a capped key's connections (see dialToward): it
	// then waits behind that sibling's requests. It does so once, and
	// again only while its process is past its share (see maxPasses).
	_, mayPass := policy.(orbitpool.LocalFirst)
	passes := 0
	avoiding := false
	// evicted is the connection this request last retired to make room
	// (see evictIdle), and mayEvict whether it may retire another: once
	// per ask of the pool, and not while that one still holds its slot
	// (a capped key's leaves in good order).
	var evicted orbitpool.ResourceID
	mayEvict := true
	var full error // the table's, once the request paused for room
	fullPauses := 0
	// room is its place among the requests paused for room; a wake it
	// leaves with, unused, goes to the next.
	room := roomWait{key: e.key}
	defer func() {
		if room.woken {
			n.room.passOn(room.by)
		}
		if room.fleet != nil {
			n.fleetRoom.unwatch(room.fleet)
		}
	}()
	near := t.nearWindow()
	for {
		if !avoiding && avoid.any() {
			// Set up here, not before the loop: a local connection found
			// gone below is kept off by the next turn.
			avoiding = true
			policy = &avoidPolicy{inner: policy, avoid: avoid, pool: n.pool}
			if fallback != nil {
				fallback = &avoidPolicy{inner: fallback, avoid: avoid, pool: n.pool}
			}
		}
		if err := claimVerdict(ctx, near); err != nil {
			if full != nil {
				// What it waited for. A wait for room that reached
				// the deadline (or its near-window) ran out, as a
				// wait for a connection does.
				if errors.Is(err, backpressure.ErrDeadlineNear) || errors.Is(err, backpressure.ErrDeadlineElapsed) {
					err = ErrNoCapacity
				}
				err = fmt.Errorf("%w: %w", err, full)
			}
			return nil, &Error{Op: "acquire", RetrySafe: true, Err: err}
		}
		if n.isStopped() {
			return nil, &Error{Op: "acquire", Err: ErrClosed}
		}
		lim.MaxCreating = t.MaxDialingPerKey
		// Unless MaxDialingPerKey says otherwise, requests to an HTTP/2
		// upstream that find no capacity wait for a connection being
		// dialed anywhere in the fleet rather than dial their own: one
		// connection carries many streams, so a burst to a cold upstream
		// needs one, as x/net/http2 dials one per authority. An HTTP/1.1
		// connection carries one exchange at a time, so its dials are not
		// held back.
		if lim.MaxCreating <= 0 && e.speaksH2() {
			lim.MaxCreating = 1
		}
		b.idle()
		n.room.asking(&room)
		wctx, cancel := waitContext(ctx, near)
		plan, err := n.pool.Acquire(wctx, e.key, policy, lim)
		cancel()
		if err != nil {
			if errors.Is(err, orbitpool.ErrFull) && relaysPaid && fallback != nil {
				// The dial that relays paid for has no room: the
				// request relays again rather than retire one of this
				// process's connections. (One that must not go through
				// a sibling makes room, as below.)
				policy, fallback, relaysPaid = fallback, nil, false
				continue
			}
			if errors.Is(err, orbitpool.ErrFull) {
				// Room first, from this process's idle connection
				// that has waited longest; else, if nothing must
				// count it, a connection outside the table. One kept
				// there for the key comes before room: with more
				// upstreams than keys, room made for one upstream
				// would be taken from another's next request.
				unpooled := t.mayGoUnpooled(e)
				looked := false // for an idle connection to evict
				if mayEvict && !n.leaving(evicted) && !(unpooled && n.spares.has(e.key)) {
					looked = true
					if evicted = n.evictIdle(); evicted != 0 {
						mayEvict = false
						room.woken = false // the room it was woken for
						continue
					}
				}
				if unpooled {
					resp, uerr := t.unpooled(req, e, b, release, err)
					if uerr == nil || !errors.Is(uerr, orbitpool.ErrFull) {
						return resp, uerr
					}
					// The upstream chose HTTP/2.
				}
				// Else (a capped key's connections are counted only in
				// the table, and an HTTP/2 one carries many streams)
				// it asks the pool again after a pause, until its
				// deadline: for one of the key's connections, or room
				// in the table. It pauses out of the key's queue of
				// waiters, in which it would hold up requests that
				// could dial.
				n.tableFull(err, "requests to a capped or HTTP/2 upstream wait for room or a connection of theirs")
				room.stuck = !looked
				if t.mayRelay() {
					// A sibling's connection of the key that gets room
					// wakes it too (see fleetRoom).
					var armed bool
					if room.fleet, armed = n.fleetRoom.watch(n, e.key, room.fleet); armed {
						continue
					}
				}
				if t.fullPause(ctx, fullPauses, b, &room) {
					full = err
					fullPauses++
					mayEvict = true
					continue
				}
				if n.isStopped() {
					return nil, &Error{Op: "acquire", Err: ErrClosed}
				}
				return nil, &Error{Op: "acquire", RetrySafe: true, Err: fmt.Errorf("%w: %w", ErrNoCapacity, err)}
			}
			err = waitEnd(ctx, err)
			if isContextErr(err) {
				return nil, &Error{Op: "acquire", RetrySafe: true, Err: fmt.Errorf("%w: %w", ErrNoCapacity, err)}
			}
			return nil, &Error{Op: "acquire", RetrySafe: true, Err: err}
		}
		bufs, err := b.workers(ctx)
		if err != nil {
			if plan.Execution != nil {
				plan.Execution.Complete()
				// An HTTP/2 connection an eviction passed over for
				// this request may be idle again.
				n.room.signalKey(e.key, 1, true)
			}
			if plan.Permit != nil {
				n.dropPermit(plan.Permit) // wakes the next waiter
				room.woken = false
			}
			if plan.Kind == orbitpool.PlanReuseRemote {
				n.pool.Withdraw(plan.Lease)
			}
			return nil, err
		}
		switch plan.Kind {
		case orbitpool.PlanReuseLocal:
			id := plan.Execution.ID()
			var oc *owned
			hc := n.lookupH2(id)
			if hc == nil {
				if oc = n.lookup(id); oc == nil {
					// An HTTP/2 connection is in the pool before it is
					// here (see awaitH2); an HTTP/1.1 one that is in
					// neither has left this process and is leaving the
					// pool.
					hc = n.awaitH2(id)
				}
			}
			if hc != nil {
				if !n.usableH2(hc) {
					plan.Execution.Complete()
					continue
				}
				if room.by.event == roomStream || room.by == (roomWake{roomIdle, e.key}) {
					room.woken = false // a stream was what it was woken for
				}
				n.stats.reusedLocal.Add(1)
				resp, err := n.useH2(hc, plan.Execution, req, release)
				if err != nil {
					avoid.goneOnce(err, hc.id)
				}
				return resp, err
			}
			if !n.takeFor(oc, plan.Execution) {
				avoid.keepOff(id)
				continue
			}
			room.woken = false // an idle connection was what it was woken for
			n.stats.reusedLocal.Add(1)
			return n.use(oc, plan.Execution, req, bufs, release, nil)

		case orbitpool.PlanReuseRemote:
			if relaysPaid {
				// No budget for the dial: the next request tries it.
				e.unclaimDial()
				relaysPaid = false
			}
			if n.peers == nil {
				return nil, &Error{Op: "lease", RetrySafe: true, Err: errors.New("remote plan on a pool without siblings")}
			}
			n.stats.reusedRemote.Add(1)
			lane := plan.Lease.ID.Lane()
			resp, err := n.peers.roundTrip(req, lane, plan.Lease, &t.remote, bufs, release)
			if err != nil {
				// Not delivered, or refused: the unit is free again now
				// rather than when the owner ages it out. An accepted
				// lease has no ticket left to withdraw.
				n.pool.Withdraw(plan.Lease)
				avoid.goneOnce(err, plan.Lease.ID)
			}
			switch {
			case err == nil:
				e.sawProto(resp.ProtoMajor == 2)
				if resp.ProtoMajor == 1 {
					// Counted by what the upstream spoke: one offered
					// h2 may choose http/1.1 on the sibling's connection.
					e.relayed()
				}
			case errors.Is(err, ErrOwnerBusy):
				avoid.busy = append(avoid.busy, lane)
			case errors.Is(err, errOwnerLeaving), ownerDown(err):
				avoid.leaving = append(avoid.leaving, leftOwner{lane, plan.Lease.Owner})
			}
			if err != nil && errors.Is(err, ErrOwnerGone) {
				// Let the pool learn of a dead sibling now rather than at
				// its next reconcile.
				n.peers.dropLane(lane)
				n.pool.Reconcile()
			}
			return resp, err

		case orbitpool.PlanCreate:
			// The room is this request's: if it makes no connection, the
			// permit given back wakes the next waiter.
			room.woken = false
			// From the choice to dial here until the pool holds the
			// connection (or the dial failed), it counts as one of this
			// process's connections of the key (see dialToward).
			kc := n.capOf(e.key)
			if mayPass && passes < maxPasses {
				if lane := n.dialToward(ctx, kc, e.key, passes == 0); lane >= 0 {
					passes++
					plan.Permit.CloseToward(lane)
					n.room.signal(roomWake{event: roomFree}) // its slot is free
					continue
				}
			} else {
				kc.dialBegins()
			}
			if err := claimVerdict(ctx, near); err != nil {
				kc.dialEnds()
				n.dropPermit(plan.Permit)
				return nil, &Error{Op: "dial", RetrySafe: true, Err: err}
			}
			// A connection kept outside the table for the key (see
			// spares) takes the room instead of a new one: no dial, and
			// siblings may use it from now on. It keeps the limits of the
			// transport that dialed it.
			if c, s := n.spares.take(e.key, n.log, n.spareClosed); c != nil {
				oc, exec, err := t.pool(e.key, kc, plan.Permit, c, s)
				n.spareClosed() // counted in the table instead, or closed
				if err != nil {
					return nil, err
				}
				e.tookOwn()
				return n.use(oc, exec, req, bufs, release, nil)
			}
			if !n.admitDial() {
				kc.dialEnds()
				n.dropPermit(plan.Permit)
				if fallback != nil && ctx.Err() == nil {
					policy, fallback, relaysPaid = fallback, nil, false
					continue
				}
				return nil, &Error{Op: "dial", RetrySafe: true, Err: ErrNotAdmitted}
			}
			dialStart := time.Now()
			c, err := func() (c *conn, err error) {
				n.dialing.Add(1)
				defer n.dialing.Add(-1)
				defer func() {
					if c != nil {
						return // counted until it is registered
					}
					kc.dialEnds()
					if err == nil {
						// A panic out of the dial (a callback of
						// TLSClientConfig's) goes to the caller: the
						// dial is over, and its creation unit with it.
						n.dropPermit(plan.Permit)
					}
				}()
				dctx, cancel := n.dialContext(ctx)
				defer cancel()
				if relaysPaid {
					dctx, cancel = paidDialContext(dctx)
					defer cancel()
				}
				return t.dialer.dial(dctx, &e.u, func(a netip.AddrPort) { n.sawRemote(e.key, kc, a) })
			}()
			if err != nil {
				if n.isStopped() {
					n.dropPermit(plan.Permit)
					return nil, &Error{Op: "dial", Err: ErrClosed}
				}
				if relaysPaid {
					e.paidFails.Add(1)
				}
				if n.dialRefused(e.key, kc, dialStart, err) {
					n.holdRefusedUnit(e.key, kc, func() { n.dropPermit(plan.Permit) })
				} else {
					n.dropPermit(plan.Permit)
				}
				if fallback != nil && ctx.Err() == nil {
					policy, fallback, relaysPaid = fallback, nil, false
					continue
				}
				return nil, err
			}
			// Its first request could have gone through a sibling: if
			// the upstream closes it before answering, a replayable one
			// goes again (see Error.idleClosed), as after a reused
			// connection's close, and finds the sibling's connection.
			c.relayPaid = relaysPaid
			h2 := h2Wanted(&e.u, c)
			e.sawProto(h2)
			if h2 {
				return t.createH2(req, e, c, plan.Permit, kc, release)
			}
			oc, exec, err := t.pool(e.key, kc, plan.Permit, c, &t.settings)
			if err != nil {
				return nil, err
			}
			n.stats.created.Add(1)
			if relaysPaid {
				n.stats.relayDials.Add(1)
			}
			e.tookOwn()
			return n.use(oc, exec, req, bufs, release, nil)

		default:
			return nil, &Error{Op: "acquire", RetrySafe: true, Err: fmt.Errorf("unknown plan kind %v", plan.Kind)}
		}
	}
}

// paidDialContext bounds a dial that relays paid for (see
// upstreamEntry.claimDial) to half the time the request has left, if it has
// a deadline: the sibling whose connection it relayed through can still
// serve it if the dial hangs (an upstream that accepts and never completes
// a TLS handshake), as it could have served it at once.
func paidDialContext(ctx context.Context) (context.Context, context.CancelFunc) {
	d, ok := ctx.Deadline()
	if !ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, time.Until(d)/2)
}

// pool registers c, an HTTP/1.1 connection to key with settings s, under
// permit, and installs it, busy for the caller; on an error c is closed.
func (t *Transport) pool(key orbitpool.Key, kc *keyCap, permit *orbitpool.CreationPermit, c *conn, s *connSettings) (*owned, *orbitpool.Execution, error) {
	n := t.Node
	exec, err := kc.register(permit, 1, kc.dialEnds)
	if err != nil {
		n.dropPermit(permit)
		c.close()
		return nil, nil, &Error{Op: "register", RetrySafe: true, Err: err}
	}
	oc, err := n.install(exec.ID(), key, c, s)
	if err != nil {
		c.close()
		n.pool.Unregister(exec.ID())
		exec.Complete()
		return nil, nil, &Error{Op: "register", RetrySafe: true, Err: err}
	}
	return oc, exec, nil
}

// mayRelay reports whether the transport's requests may go through a
// sibling's connection: all but those of policy LocalOnly.
func (t *Transport) mayRelay() bool {
	_, localOnly := t.Policy.(orbitpool.LocalOnly)
	return !localOnly
}

// mayGoUnpooled reports whether a request to e that finds the table full
// may go on a connection outside it (see unpooled): one of a key under no
// fleet-wide cap, which nothing must count, whose upstream has not been
// seen to speak HTTP/2 (an https one offered it may choose HTTP/1.1).
func (t *Transport) mayGoUnpooled(e *upstreamEntry) bool {
	return t.MaxConnsPerKey <= 0 && t.MaxDialingPerKey <= 0 && e.u.Proto != protoH2C && !e.speaksH2()
}

// fullPause waits before a request that found the table full asks the pool
// again, for the nth time: 5ms, doubling up to 80ms, a tenth more at most
// at random (t.fullPauseBase, if set, every time). It waits as pause does,
// woken early, oldest first, when one of this process's connections may
// have made room, or a sibling's connection of its key got room (see
// roomWaiters).
func (t *Transport) fullPause(ctx context.Context, n int, b *exchangeBudget, w *roomWait) bool {
	d := fullPauseBase << min(n, 4)
	if t.fullPauseBase > 0 {
		d = t.fullPauseBase
	}
	room := &t.Node.room
	if w.woken {
		// It was woken and found no room. If the room was an idle
		// connection of another key and it could not look for one to
		// evict (its last eviction still leaves), the next waiter may;
		// else the room is gone.
		w.woken = false
		if w.stuck && w.by.event == roomIdle && w.by.key != w.key {
			room.passOn(w.by)
		}
	}
	wake := room.add(w)
	if wake == nil {
		return true // room may have come since it asked
	}
	ok := t.pause(ctx, d+rand.N(d/10), b, wake, t.Node.stop)
	if ok {
		select {
		case <-wake:
			w.woken, w.by, w.w = true, w.w.by, nil
			return true
		default:
		}
	}
	room.remove(w)
	return ok
}

// fullPauseBase is fullPause's first wait.
const fullPauseBase = 5 * time.Millisecond

// unpooled runs req on a connection of this process outside the table (see
// spares), one kept idle there or one it dials: the table had no room for
// another of this process's connections (conns_per_process) or for another
// upstream (keys), full. Such a connection is not shared with siblings,
// but the request is served: long-lived exchanges (server-sent events,
// long polls) hold a connection each, and a process may hold more of them
// than its table has room for. full is the table's error, for the log, and
// what it returns if the upstream chose HTTP/2.
func (t *Transport) unpooled(req *http.Request, e *upstreamEntry, b *exchangeBudget, release func(), full error) (*http.Response, error) {
	n := t.Node
	ctx := req.Context()
	if err := claimVerdict(ctx, t.nearWindow()); err != nil {
		return nil, &Error{Op: "dial", RetrySafe: true, Err: err}
	}
	bufs, err := b.workers(ctx)
	if err != nil {
		return nil, err
	}
	// A kept connection keeps the limits of the transport that dialed it,
	// as one in the table does.
	done := func(s *connSettings) func(*conn, outcome) {
		return func(c *conn, o outcome) {
			switch {
			case o == outcomeHijacked:
			case o == outcomeReusable && !n.draining.Load() && n.spares.put(e.key, c, s, len(n.slots)):
				return
			default:
				c.close()
			}
			n.open.Add(-1)
		}
	}
	warn := func() {
		n.stats.unpooled.Add(1)
		n.tableFull(full, "requests go on connections of this process outside it, not shared with its siblings")
	}
	if c, s := n.spares.take(e.key, n.log, n.spareClosed); c != nil {
		warn()
		return n.exchange(c, s, req, bufs, release, nil, done(s))
	}
	if !n.admitDial() {
		return nil, &Error{Op: "dial", RetrySafe: true, Err: ErrNotAdmitted}
	}
	c, err := func() (*conn, error) {
		n.dialing.Add(1)
		defer n.dialing.Add(-1) // a panic out of the dial too
		return t.dialer.dial(ctx, &e.u, nil)
	}()
	if err != nil {
		return nil, err
	}
	if h2Wanted(&e.u, c) {
		// ALPN chose HTTP/2, which this path does not run: its
		// connection carries many streams, and belongs in the table.
		// Known now, its requests wait for room there.
		e.sawProto(true)
		c.close()
		return nil, &Error{Op: "acquire", RetrySafe: true, Err: full}
	}
	n.open.Add(1)
	warn()
	return n.exchange(c, &t.settings, req, bufs, release, nil, done(&t.settings))
}

// freeRetries is how many retries one request may have for free (see
// Error.freeRetry), counted when it is first refused so: one for each
// connection of key the fleet holds then, and one for the connection that
// refused it, which may be out of the table already, and minFreeRetries at
// the least. Once per connection or owner alone is no bound: an upstream
// that GOAWAYs every connection after its first stream, while other
// requests keep dialing, offers the request a connection it has not met on
// every attempt.
func (t *Transport) freeRetries(key orbitpool.Key) int {
	c, _ := t.Node.pool.Candidates(key, nil)
	return max(len(c)+1, minFreeRetries)
}

// wentAway reports whether the upstream refused an attempt as it went
// away: a stream an HTTP/2 connection refused so (connGone), a lease its
// owner refused as the connection left the pool (errLeaseGone), or a new
// connection's GOAWAY before its first stream.
func wentAway(err error) bool {
	var pe *Error
	return errors.As(err, &pe) && pe.connGone || errors.Is(err, errLeaseGone) || errors.Is(err, errGoAwayAtStart)
}

// maxAwayRetries is how many retries after an upstream went away a request
// has once its free ones are spent, besides MaxRetries: as many as x/net's
// HTTP/2 client has for a stream a GOAWAY left out. net/http sends such a
// request again, on a new connection, for as long as its context lasts.
const maxAwayRetries = 6

// awayBackoff waits before the request's nth retry after an upstream went
// away (past the free ones): not at all before the first, then 25ms,
// doubling (a tenth more at most, at random); 0.78s in all. An upstream
// restarting faster than a busy machine sends a stream refuses retries sent
// at once until the request has none left; spread out, they outlast a
// restart. It waits as pause does.
func (t *Transport) awayBackoff(ctx context.Context, n int, b *exchangeBudget) bool {
	if n == 0 {
		return true
	}
	d := awayBackoffBase << min(n-1, 5)
	return t.pause(ctx, d+rand.N(d/10), b, nil, nil)
}

// pause waits d, holding none of b's workers, as a request waits for the
// pool, or until wake (if not nil) is closed. It reports false, at once, if
// the wait would come within the near-window of the request's deadline
// (what follows could not start), or when ctx ends or stop (if not nil)
// is closed. A wait that may be woken is cut short to end before that
// window instead.
func (t *Transport) pause(ctx context.Context, d time.Duration, b *exchangeBudget, wake, stop <-chan struct{}) bool {
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl) - t.nearWindow()
		if wake != nil {
			d = min(d, left)
		}
		if d <= 0 || left < d {
			return false
		}
	}
	b.idle()
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-wake:
		return true
	case <-ctx.Done():
		return false
	case <-stop:
		return false
	}
}

// awayBackoffBase is awayBackoff's first wait.
const awayBackoffBase = 25 * time.Millisecond

// minFreeRetries is the fewest free retries a request has: as many as
// x/net's HTTP/2 client sends a request again that a connection refused as
// it went away. An upstream restarting under load may refuse several
// connections in a row while the fleet holds only one or two.
const minFreeRetries = 6

// ownerDown reports whether err says the owner could not be reached (see
// Error.ownerDown).
func ownerDown(err error) bool {
	var pe *Error
	return errors.As(err, &pe) && pe.ownerDown
}

// CloseIdleConnections closes every idle connection this process owns.
func (t *Transport) CloseIdleConnections() {
	n := t.Node
	if n == nil {
		return
	}
	for i := range n.slots {
		if oc := n.slots[i].Load(); oc != nil {
			n.retireIdle(oc)
		}
	}
	n.closeIdleH2(false)
	n.spares.closeAll(false, n.spareClosed)
}

// trackBody records whether a request body has been touched, so a failed
// attempt knows whether it can be sent again as it is. An attempt that gives
// the body up without reading any of it (Request.Write closes the body on
// every failure, a write that failed before the body was reached included)
// does not close it: nothing of it went anywhere, so a retry may send it
// whatever the method. RoundTrip closes it when it is done with it.
type trackBody struct {
	rc     io.ReadCloser
	used   atomic.Bool
	closed atomic.Bool
	// log receives the stack of a panic in rc's Read. failure is rc's
	// first failure (see read): a panic, as an error, or a Read error
	// other than io.EOF before the body was closed.
	log     *zap.Logger
	failure atomic.Pointer[error]
	// ahead is what readAhead took of the body before any attempt read
	// it; attempts read it first (from off), then rc. whole: it is all of
	// the body, rc is closed, and every attempt may send it again.
	ahead []byte
	off   int
	whole bool
	tried bool // readAhead ran: it never reads a second time
	// nudged is closed once the zero-length read nudge started has
	// returned; reads of rc wait for it.
	nudged chan struct{}

	mu      sync.Mutex
	pending bool // an attempt closed the body without reading it
	settled bool // RoundTrip returned a response: closes are real now
	attempt int  // attempts the body was handed to before this one (see again)
}

// Read marks the body used only when it asks for bytes: a zero-length read
// (the one that tells a client waiting on Expect: 100-continue to send)
// takes nothing, and leaves the body whole for another attempt.
func (b *trackBody) Read(p []byte) (int, error) {
	if len(p) > 0 {
		b.used.Store(true)
	}
	if b.off < len(b.ahead) {
		n := copy(p, b.ahead[b.off:])
		b.off += n
		if b.whole && b.off == len(b.ahead) {
			return n, io.EOF
		}
		return n, nil
	}
	if b.whole {
		return 0, io.EOF
	}
	if b.nudged != nil {
		<-b.nudged
	}
	return b.read(p)
}

// nudge makes, once, the zero-length read that tells a client waiting on
// Expect: 100-continue to send its body, on a goroutine of its own: a body
// whose data comes only once the client has the response (a pipe, an HTTP/2
// stream) blocks in it until then, and the exchange must go on meanwhile.
// A body takes one Read at a time, so Read waits for it; closing rc ends it
// on such bodies.
func (b *trackBody) nudge() {
	if b.nudged != nil || b.whole {
		return
	}
	done := make(chan struct{})
	b.nudged = done
	go func() {
		defer close(done)
		b.read(nil)
	}()
}

// read is rc's Read with a panic turned into its error, logged once with its
// stack: the body is read by goroutines that recover nothing, net/http's
// probe of a body of unknown length in a GET-like request among them, and a
// panic there would end the process rather than the exchange.
func (b *trackBody) read(p []byte) (n int, err error) {
	defer func() {
		if r := recover(); r != nil {
			perr := recovered(b.log, "request body", r)
			b.failure.CompareAndSwap(nil, &perr)
			n, err = 0, perr
		}
	}()
	n, err = b.rc.Read(p)
	if err != nil && err != io.EOF && !b.closed.Load() {
		b.failure.CompareAndSwap(nil, &err)
	}
	return n, err
}

// unread gives back p, which an attempt read of the body and sent nowhere
// (see acceptBody): the next Read returns it first, and the body counts as
// used only if it did before that attempt read p.
func (b *trackBody) unread(p []byte, used bool) {
	b.ahead = append(append([]byte(nil), p...), b.ahead[b.off:]...)
	b.off = 0
	b.used.Store(used)
}

func (b *trackBody) Close() error { return b.closeFor(-1) }

// closeFor is Close asked by attempt n (see attemptNo), or by the attempt
// under way if n < 0: once the body has gone to a later attempt, an earlier
// one's close, which may come late from a goroutine of its own (see
// peers.roundTrip), is not the later one's to suffer. An attempt that ended
// has nothing of the body to stop.
func (b *trackBody) closeFor(n int) error {
	b.mu.Lock()
	switch {
	case n >= 0 && n != b.attempt:
		b.mu.Unlock()
		return nil
	case !b.used.Load() && !b.settled:
		b.pending = true
		b.mu.Unlock()
		return nil
	}
	b.mu.Unlock()
	return b.closeNow()
}

func (b *trackBody) attemptNo() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.attempt
}

// again hands the body, unread, to another attempt: what the attempts
// before asked of it no longer applies. A close one of them left pending
// would otherwise happen as the new attempt's response arrives (settle),
// under a body still being sent: a bidirectional stream's.
func (b *trackBody) again() {
	b.mu.Lock()
	b.attempt++
	b.pending = false
	b.mu.Unlock()
}

// settle is RoundTrip returning a response: a close that an attempt asked
// for, or asks for from now on, happens.
func (b *trackBody) settle() {
	b.mu.Lock()
	b.settled = true
	pending := b.pending
	b.mu.Unlock()
	if pending {
		b.closeNow()
	}
}

// maxBodyWithHead is the longest request body sent in the write of its
// head: what fits a connection's write buffer with it.
const maxBodyWithHead = writeBufSize

// ReadsAhead reports whether RoundTrip reads req's body before it takes a
// connection (see ReadAhead): a short body (at most 4 KiB) of declared
// length, which nothing (100-continue, trailers) asks to wait or to go
// chunked. A caller that counts the time a request waits for its turn
// should read it first, as the Caddy module does: that time is the
// client's, sending its body.
func ReadsAhead(req *http.Request) bool {
	return req.ContentLength > 0 && req.ContentLength <= maxBodyWithHead && len(req.TransferEncoding) == 0 &&
		len(req.Trailer) == 0 && !expectsContinue(req)
}

// ReadAhead takes what it can of a body of declared length n, with one
// Read, as RoundTrip does before it takes a connection, and reports whether
// that was all of it: exactly n bytes. That Read returns what the client has
// sent so far, or waits for its first bytes; a client that sends the rest
// only once the response has begun is not waited for (only one that sends
// nothing of its body until then is), nor one that keeps its stream open
// after its last byte (HTTP/2's END_STREAM). A server's request body never
// holds more than it declared: net/http's servers enforce the length. A body
// that returns more goes as it would have, streamed.
func ReadAhead(r io.Reader, n int64) (b []byte, whole bool, err error) {
	b = make([]byte, n+1)
	k, err := r.Read(b)
	if err != nil && err != io.EOF {
		return b[:k], false, err
	}
	return b[:k], int64(k) == n, nil
}

// withBodyAhead returns req with its body in memory, and true, if RoundTrip
// read all of it ahead: Request.Write then sends it in the head's write,
// without the writer goroutine a streamed body needs, and on the unix leg
// without waiting for the owner's accept (a round trip less; a refusal is
// still retry-safe, as the body is kept for the next attempt). Otherwise
// req is returned as it is, and its body streams as it comes.
func withBodyAhead(req *http.Request) (*http.Request, bool) {
	tb, ok := req.Body.(*trackBody)
	if !ok || !tb.whole {
		return req, false
	}
	r := *req
	r.Body = io.NopCloser(bytes.NewReader(tb.ahead))
	return &r, true
}

// wholeBody is a body read ahead in full, b.
func wholeBody(b []byte) *trackBody {
	return &trackBody{rc: http.NoBody, ahead: b, whole: true, tried: true}
}

// readAhead is ReadAhead on the body, once: a whole body is closed, as
// Request.Write would have closed it once sent.
func (b *trackBody) readAhead(n int64) error {
	if b.tried {
		return nil
	}
	b.tried = true
	var err error
	b.ahead, b.whole, err = ReadAhead(b.rc, n)
	if b.whole {
		b.closeNow()
	}
	return err
}

func (b *trackBody) closeNow() error {
	if b.closed.CompareAndSwap(false, true) {
		return b.rc.Close()
	}
	return nil
}

func shallowWithBody(req *http.Request, body io.ReadCloser) *http.Request {
	r := *req
	r.Body = body
	return &r
}

// hasCTL reports whether s has an ASCII control byte, which net/http refuses
// in a request line.
func hasCTL(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return r < ' ' || r == 0x7f })
}

// rewind decides whether a failed attempt may be sent again and returns the
// request to send. Like net/http: a failure after which nothing could have
// reached the upstream is retried whatever the method; a reused connection
// that closed before answering only for a replayable request (no body or
// GetBody, and an idempotent method or an Idempotency-Key). A body already
// read is replaced through GetBody, or the request is not retried.
func rewind(orig, cur *http.Request, tb *trackBody, err error) (*http.Request, bool) {
	var pe *Error
	if !errors.As(err, &pe) {
		return nil, false
	}
	switch {
	case pe.RetrySafe:
	case pe.idleClosed && isReplayable(orig):
	default:
		return nil, false
	}
	if tb == nil || (!tb.used.Load() && !tb.closed.Load()) {
		return cur, true
	}
	if tb.whole {
		return shallowWithBody(orig, wholeBody(tb.ahead)), true
	}
	if orig.GetBody == nil {
		return nil, false
	}
	body, gerr := orig.GetBody()
	if gerr != nil {
		return nil, false
	}
	return shallowWithBody(orig, &trackBody{rc: body, log: tb.log}), true
}

// dropRetry closes the body rewind made for a retry (next) that is not sent,
// unless it is the one the failed attempt (r) had, which the round trip
// closes. GetBody's body goes in a trackBody that nothing has read, whose
// Close would only leave itself pending for an exchange that never comes.
func dropRetry(next, r *http.Request) {
	switch tb, ok := next.Body.(*trackBody); {
	case next == r:
	case ok:
		tb.closeNow()
	default:
		next.Body.Close()
	}
}

func isReplayable(r *http.Request) bool {
	if r.Body == nil || r.Body == http.NoBody || r.GetBody != nil {
		switch r.Method {
		case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
			return true
		}
		if _, ok := r.Header["Idempotency-Key"]; ok {
			return true
		}
		if _, ok := r.Header["X-Idempotency-Key"]; ok {
			return true
		}
	}
	return false
}

var _ http.RoundTripper = (*Transport)(nil)
