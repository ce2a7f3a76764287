package caddymodule

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/headers"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/orbitproxy/orbit/orbitpool"
	"github.com/orbitproxy/orbit/proxy"
)

func init() {
	caddy.RegisterModule(Transport{})
}

// Defaults a Transport falls back on. They match Caddy's `http` transport.
const (
	DefaultDialTimeout           = 3 * time.Second
	DefaultKeepAliveProbe        = 30 * time.Second
	DefaultIdleConnTimeout       = 2 * time.Minute
	DefaultExpectContinueTimeout = 0
	DefaultMaxResponseHeaderSize = 10 << 20
)

// Transport is the `orbit_pool` reverse_proxy transport: an HTTP/1.1
// transport whose upstream connections are shared by every Caddy process of
// the fleet the `orbit_pool` app joined. A request uses a connection of this
// process with room, else a sibling's (the sibling forwards it), else dials
// one within the upstream's fleet-wide budget, else waits for one until its
// wait timeout.
//
// Failures after which nothing of the request reached the upstream are
// reported as dial errors, so reverse_proxy may retry them on another
// upstream whatever the method; refusals are caddyhttp errors: 503 when
// there is no room (with a suggested Retry-After in the placeholder
// {http.vars.orbit_pool_retry_after}), 504 when the request's deadline
// passed.
type Transport struct {
	// TLS configures TLS to the upstream, as for the `http` transport.
	// Setting it to an empty struct enables TLS with reasonable defaults.
	// A connection is shared only with requests made under the same TLS
	// settings. The server name may not hold placeholders. Default: none
	// (plain HTTP).
	TLS *reverseproxy.TLSConfig `json:"tls,omitempty"`

	// KeepAlive configures the reuse and lifetime of upstream connections.
	// Default: enabled, 30s TCP probes, 2m idle timeout.
	KeepAlive *KeepAlive `json:"keep_alive,omitempty"`

	// DialTimeout bounds connecting to an upstream; a TLS handshake gets
	// the TLS handshake timeout on top of it. Default: 3s.
	DialTimeout caddy.Duration `json:"dial_timeout,omitempty"`

	// ResponseHeaderTimeout bounds the wait for the response header once
	// the request is written, over HTTP/1.1 and HTTP/2 alike; past it the
	// request fails with 504. Default: no timeout.
	ResponseHeaderTimeout caddy.Duration `json:"response_header_timeout,omitempty"`

	// ExpectContinueTimeout is how long a request with
	// "Expect: 100-continue" waits for the upstream's 100 before sending
	// its body anyway. Default: 0, no wait: the body goes at once, as with
	// Caddy's http transport. A wait keeps the client's body unread, and
	// an upstream that refuses it (417) then reaches the client only once
	// the client sends its body anyway, at its own expect timeout: Go's
	// server drains an unread, wrapped request body before it answers.
	// It applies to HTTP/1.1 and HTTP/2 upstreams alike, through a sibling
	// too, as the http transport's does.
	ExpectContinueTimeout caddy.Duration `json:"expect_continue_timeout,omitempty"`

	// MaxResponseHeaderSize is the most bytes of response header read from
	// the upstream. Default: 10MiB.
	MaxResponseHeaderSize int64 `json:"max_response_header_size,omitempty"`

	// MaxConnsPerHost caps the connections to one upstream across the whole
	// fleet, open and being dialed. Default: the app's max_conns_per_host.
	MaxConnsPerHost int `json:"max_conns_per_host,omitempty"`

	// MaxDialingPerHost caps the connections to one upstream being dialed
	// at once across the fleet. Default: the app's max_dialing_per_host.
	MaxDialingPerHost int `json:"max_dialing_per_host,omitempty"`

	// WaitTimeout is how long a request may wait for a back-pressure permit
	// and an upstream connection together before it is refused with 503,
	// and again when it is sent again after a reused connection closed
	// before answering (see the app's wait_timeout). Default: the app's
	// wait_timeout.
	WaitTimeout caddy.Duration `json:"wait_timeout,omitempty"`

	// Timeout bounds a request's whole exchange through this transport,
	// from when the transport receives it to the end of the response body:
	// it is one of the sources of the request's deadline (see
	// DeadlineHeaders). Default: none.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// DeadlineHeaders name request headers that carry how long the client
	// will wait for its answer, in gRPC's grpc-timeout format ("30m" is 30
	// milliseconds, "5S" five seconds) or as a number of seconds
	// ("Request-Timeout: 0.5"); see ParseTimeout. A value that parses
	// gives the request a deadline that long after the transport received
	// it; one that does not is ignored. Of several values (several lines,
	// or one line of them comma-separated) the earliest counts. Default:
	// none.
	//
	// A request's deadline is the earliest of its context's deadline, these
	// headers', Timeout and the server's write_timeout; without any it has
	// none, and behaves as without this setting. With one, every claim
	// point judges it as the app's back-pressure permits do: past it the
	// request is refused with 504 at once; within deadline_near_window of
	// it, with 503 and no Retry-After, and nothing is sent upstream; a wait
	// (for a permit, a worker of the budget, a connection) ends at that
	// window or at wait_timeout, whichever is first. The deadline bounds
	// the whole exchange, travels with the request to a sibling that
	// forwards it, and shows in {http.vars.orbit_pool_deadline_source}
	// (context, header, timeout, write_timeout or none).
	DeadlineHeaders []string `json:"deadline_headers,omitempty"`

	// RelayUnreplayable lets a request that could not be sent again if a
	// sibling died during its exchange (one with a body, which
	// reverse_proxy gives the transport no way to read twice, or a POST
	// without an Idempotency-Key) go through a sibling's idle HTTP/1.1
	// connection before it dials one of its own, as other requests do:
	// the fleet then holds fewer connections for such traffic, and a
	// worker killed outright fails the siblings' requests it was relaying
	// that way, which the stock transport would have served. Default
	// false: such a request takes its own process's connection, else
	// dials, and goes through a sibling only when max_conns_per_host or
	// max_dialing_per_host leaves no dial, or the dial fails.
	RelayUnreplayable bool `json:"relay_unreplayable,omitempty"`

	// Versions are the HTTP versions spoken to the upstream, as the stock
	// `http` transport names them: "1.1"; "2", HTTP/2 to TLS upstreams by
	// ALPN (h2, falling back to http/1.1); "h2c", HTTP/2 with prior
	// knowledge to cleartext upstreams (instead of HTTP/1.1), and HTTP/2 by
	// ALPN to TLS ones. Any combination of the three is accepted; "3"
	// (HTTP/3) is not supported. An HTTP/2 connection is one pool resource
	// whose capacity is the upstream's SETTINGS_MAX_CONCURRENT_STREAMS:
	// every worker's requests share its streams, and max_conns_per_host
	// still counts connections. HTTP/1.1 and HTTP/2 connections to one
	// upstream are pooled apart. Default: ["1.1"] (stock's default is
	// ["1.1", "2"]: name "2" to get HTTP/2 to TLS upstreams).
	Versions []string `json:"versions,omitempty"`

	app       *App
	logger    *zap.Logger
	tlsConfig *tls.Config
	keyExtra  string
	limits    orbitpool.Limits
	wait      time.Duration
	st        *transportState
}

// transportState is the proxy transport a Transport drives and what it
// learnt of its upstreams.
type transportState struct {
	mu        sync.Mutex
	rt        atomic.Pointer[proxy.Transport]
	upstreams sync.Map     // scheme://host:port -> *upstreamInfo
	tracked   atomic.Int64 // entries in upstreams
}

// maxTrackedUpstreams bounds the upstreams a transport keeps an entry, a
// metrics series and a name in the fleet's records for. A dynamic upstream
// (an address taken from a header, SRV or A records) could otherwise grow
// all three with every address it was ever asked for. Past it, a request's
// upstream is described afresh each time, its wait observed under the
// upstream label "other", and its name not recorded.
var maxTrackedUpstreams int64 = 1024

// KeepAlive configures how long upstream connections live and how often
// they are reused.
type KeepAlive struct {
	// Enabled is whether connections are kept for more than one request.
	// Turned off, every request dials its own connection and closes it
	// afterwards, and nothing is shared. Default: true.
	Enabled *bool `json:"enabled,omitempty"`

	// ProbeInterval is the TCP keep-alive probe interval of upstream
	// connections; negative turns the probes off. Default: 30s.
	ProbeInterval caddy.Duration `json:"probe_interval,omitempty"`

	// IdleConnTimeout closes a connection nobody in the fleet has used for
	// this long. Default: 2m.
	IdleConnTimeout caddy.Duration `json:"idle_timeout,omitempty"`

	// MaxLifetime closes a connection this old when it next goes idle.
	// Default: no limit.
	MaxLifetime caddy.Duration `json:"max_lifetime,omitempty"`

	// MaxRequests closes a connection after this many requests. Default: no
	// limit.
	MaxRequests int `json:"max_requests,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (Transport) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.transport.orbit_pool",
		New: func() caddy.Module { return new(Transport) },
	}
}

// Provision sets the transport's defaults, builds its TLS client config and
// finds the `orbit_pool` app (which runs with its defaults when the config
// does not name it).
func (t *Transport) Provision(ctx caddy.Context) error {
	t.logger = ctx.Logger()
	t.st = new(transportState)
	appIface, err := ctx.App("orbit_pool")
	if err != nil {
		return fmt.Errorf("getting orbit_pool app: %w", err)
	}
	t.app = appIface.(*App)

	if t.DialTimeout == 0 {
		t.DialTimeout = caddy.Duration(DefaultDialTimeout)
	}
	if t.KeepAlive == nil {
		t.KeepAlive = new(KeepAlive)
	}
	if t.KeepAlive.ProbeInterval == 0 {
		t.KeepAlive.ProbeInterval = caddy.Duration(DefaultKeepAliveProbe)
	}
	if t.KeepAlive.IdleConnTimeout == 0 {
		t.KeepAlive.IdleConnTimeout = caddy.Duration(DefaultIdleConnTimeout)
	}
	if len(t.Versions) == 0 {
		t.Versions = []string{"1.1"}
	}
	if t.WaitTimeout == 0 {
		t.WaitTimeout = t.app.WaitTimeout
	}
	t.wait = time.Duration(t.WaitTimeout)
	if err := t.checkHandler(ctx); err != nil {
		return err
	}
	t.limits = t.app.limits()
	if t.MaxConnsPerHost != 0 {
		t.limits.MaxResources = t.MaxConnsPerHost
	}
	if t.MaxDialingPerHost != 0 {
		t.limits.MaxCreating = t.MaxDialingPerHost
	}

	if t.TLS != nil {
		if strings.Contains(t.TLS.ServerName, "{") {
			return fmt.Errorf("tls_server_name %q: placeholders are not supported by the orbit_pool transport", t.TLS.ServerName)
		}
		// Taken before MakeTLSClientConfig, which loads the CA module and
		// clears CARaw (as Caddy's LoadModule does every raw module).
		caRaw := append(json.RawMessage(nil), t.TLS.CARaw...)
		cfg, err := t.TLS.MakeTLSClientConfig(ctx)
		if err != nil {
			return fmt.Errorf("making TLS client config: %w", err)
		}
		t.tlsConfig = cfg
		// Connections made under other TLS settings (trusted CAs, client
		// identity, verification) must not serve this transport's requests.
		sums, err := tlsFileSums(caRaw, t.TLS.RootCAPEMFiles, t.TLS.ClientCertificateFile)
		if err != nil {
			return fmt.Errorf("reading TLS files: %w", err)
		}
		b, err := json.Marshal(tlsIdentity{caRaw, t.TLS.RootCAPool, t.TLS.RootCAPEMFiles,
			t.TLS.ClientCertificateFile, t.TLS.ClientCertificateKeyFile, t.TLS.ClientCertificateAutomate,
			t.TLS.InsecureSkipVerify, t.TLS.ServerName, t.TLS.Renegotiation, t.TLS.Curves, sums})
		if err != nil {
			return fmt.Errorf("encoding TLS settings: %w", err)
		}
		sum := sha256.Sum256(b)
		t.keyExtra = "tls:" + hex.EncodeToString(sum[:16])
	}
	return nil
}

// tlsFileSums digests the contents of the files the TLS settings load
// trusted CAs (root_ca_pem_files, tls_trust_pool file) and the client
// certificate from: a file replaced in place, and a reload, must not leave
// requests on connections verified, or identified, under what it held
// before, as the stock transport's new connections would not be.
func tlsFileSums(caRaw json.RawMessage, caFiles []string, certFile string) ([]string, error) {
	files := slices.Clone(caFiles)
	var src struct {
		Provider string   `json:"provider"`
		PEMFiles []string `json:"pem_files"`
	}
	if len(caRaw) > 0 && json.Unmarshal(caRaw, &src) == nil && src.Provider == "file" {
		files = append(files, src.PEMFiles...)
	}
	if certFile != "" {
		files = append(files, certFile)
	}
	sums := make([]string, len(files))
	for i, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(b)
		sums[i] = hex.EncodeToString(sum[:])
	}
	return sums, nil
}

// tlsIdentity is what of a TLS config changes which connections a request
// may use.
type tlsIdentity struct {
	CA            json.RawMessage
	RootCAPool    []string
	RootCAFiles   []string
	CertFile      string
	KeyFile       string
	Automate      string
	Insecure      bool
	ServerName    string
	Renegotiation string
	Curves        []string
	FileSums      []string // see tlsFileSums
}

// Validate rejects settings the transport cannot honour.
func (t *Transport) Validate() error {
	if err := checkVersions(t.Versions); err != nil {
		return err
	}
	switch {
	case t.DialTimeout < 0:
		return fmt.Errorf("dial_timeout must be positive, got %s", time.Duration(t.DialTimeout))
	case t.ResponseHeaderTimeout < 0:
		return fmt.Errorf("response_header_timeout must not be negative, got %s", time.Duration(t.ResponseHeaderTimeout))
	case t.ExpectContinueTimeout < 0:
		return fmt.Errorf("expect_continue_timeout must not be negative, got %s", time.Duration(t.ExpectContinueTimeout))
	case t.MaxResponseHeaderSize < 0:
		return fmt.Errorf("max_response_header must not be negative, got %d", t.MaxResponseHeaderSize)
	case t.MaxConnsPerHost < 0:
		return fmt.Errorf("max_conns_per_host must not be negative, got %d", t.MaxConnsPerHost)
	case t.MaxDialingPerHost < 0:
		return fmt.Errorf("max_dialing_per_host must not be negative, got %d", t.MaxDialingPerHost)
	case t.WaitTimeout < 0:
		return fmt.Errorf("wait_timeout must be positive, got %s", time.Duration(t.WaitTimeout))
	case t.Timeout < 0:
		return fmt.Errorf("timeout must not be negative, got %s", time.Duration(t.Timeout))
	case t.KeepAlive.IdleConnTimeout < 0:
		return fmt.Errorf("keepalive idle timeout must be positive, got %s", time.Duration(t.KeepAlive.IdleConnTimeout))
	case t.KeepAlive.MaxLifetime < 0:
		return fmt.Errorf("keepalive_max_lifetime must not be negative, got %s", time.Duration(t.KeepAlive.MaxLifetime))
	case t.KeepAlive.MaxRequests < 0:
		return fmt.Errorf("keepalive_max_requests must not be negative, got %d", t.KeepAlive.MaxRequests)
	}
	if err := t.app.checkCap(t.limits.MaxResources); err != nil {
		return err
	}
	for _, h := range t.DeadlineHeaders {
		if !validHeaderName(h) {
			return fmt.Errorf("deadline header %q is not a valid header name", h)
		}
	}
	return nil
}

// validHeaderName reports whether s is an HTTP header field name (a token).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// inner returns the proxy transport bound to the fleet f, building it on
// first use: the fleet is opened in the app's Start, which may run after
// this transport's server has started.
func (t *Transport) inner(f *fleet) *proxy.Transport {
	st := t.st
	if rt := st.rt.Load(); rt != nil && rt.Node == f.node {
		return rt
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if rt := st.rt.Load(); rt != nil && rt.Node == f.node {
		return rt
	}
	ka := t.KeepAlive
	ect := time.Duration(t.ExpectContinueTimeout)
	if ect == 0 {
		ect = -1 // proxy.Transport: send at once (its zero is a 1s wait)
	}
	rt := &proxy.Transport{
		Node:                   f.node,
		Limiter:                f.limiter,
		Policy:                 t.app.policy,
		TLSClientConfig:        t.tlsConfig,
		DialTimeout:            time.Duration(t.DialTimeout),
		KeepAlive:              time.Duration(ka.ProbeInterval),
		IdleConnTimeout:        time.Duration(ka.IdleConnTimeout),
		MaxConnLifetime:        time.Duration(ka.MaxLifetime),
		MaxRequestsPerConn:     ka.MaxRequests,
		MaxConnsPerKey:         t.limits.MaxResources,
		MaxDialingPerKey:       t.limits.MaxCreating,
		MaxResponseHeaderBytes: t.MaxResponseHeaderSize,
		ExpectContinueTimeout:  ect,
		ResponseHeaderTimeout:  time.Duration(t.ResponseHeaderTimeout),
		KeyExtra:               t.keyExtra,
		RelayUnreplayable:      t.RelayUnreplayable,
		HTTP2:                  slices.Contains(t.Versions, "2") || slices.Contains(t.Versions, "h2c"),
		H2C:                    slices.Contains(t.Versions, "h2c"),
	}
	if t.TLS != nil && t.TLS.HandshakeTimeout > 0 {
		rt.DialTimeout += time.Duration(t.TLS.HandshakeTimeout)
	}
	if ka.Enabled != nil && !*ka.Enabled {
		rt.MaxRequestsPerConn = 1
	}
	st.rt.Store(rt)
	return rt
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.setScheme(req)
	if di, ok := reverseproxy.GetDialInfo(req.Context()); ok && di.Network != "" && !strings.HasPrefix(di.Network, "tcp") {
		closeBody(req)
		return nil, fmt.Errorf("orbit_pool transport dials TCP upstreams only, not %s (%s)", di.Network, di.Address)
	}
	f, err := t.app.begin()
	if err != nil {
		closeBody(req)
		return nil, reverseproxy.NewDialError(fmt.Errorf("orbit_pool: %w", err))
	}
	rt := t.inner(f)
	up, err := t.upstream(f, rt, req)
	if err != nil {
		t.app.end()
		closeBody(req)
		return nil, reverseproxy.NewDialError(err)
	}

	body := req.Body
	if proxy.ReadsAhead(req) {
		if body, err = keptBodyFor(req); err != nil {
			t.app.end()
			closeBody(req)
			return nil, err
		}
	}
	start := time.Now()
	dl, src := t.deadline(req, start)
	caddyhttp.SetVar(req.Context(), VarDeadlineSource, src)
	countDeadline(src)
	dctx, dcancel := withDeadline(req.Context(), dl)
	end := func() {
		dcancel()
		t.app.end()
	}
	wg := newWaitGuard(dctx, t.wait, up, start)
	out := req.WithContext(wg.ctx)
	out.Body = body
	// reverse_proxy leaves the server-side RequestURI on the request it
	// hands to the transport; net/http's transport ignores it, the proxy
	// transport refuses it.
	out.RequestURI = ""
	resp, err := rt.RoundTrip(out)
	if ab, ok := body.(*attemptBody); ok {
		ab.ended(err)
	}
	if err != nil {
		wg.end(false)
		wg.cancel()
		end()
		return nil, t.classify(req, up, wg, dl, err)
	}
	wg.end(true)
	resp.Request = req
	resp.Body = trackBody(resp.Body, end)
	return resp, nil
}

// checkHandler looks at the reverse_proxy handler the transport serves, if
// it is one: a static upstream the transport cannot dial (a unix socket)
// is an error now rather than a 502 on every request, and passive health
// checks that count failures are told of what they will count.
func (t *Transport) checkHandler(ctx caddy.Context) error {
	var h *reverseproxy.Handler
	mods := ctx.Modules()
	for i := len(mods) - 1; i >= 0 && h == nil; i-- {
		h, _ = mods[i].(*reverseproxy.Handler)
	}
	if h == nil {
		return nil
	}
	for _, u := range h.Upstreams {
		if strings.Contains(u.Dial, "{") {
			continue // a placeholder: known per request
		}
		if na, err := caddy.ParseNetworkAddress(u.Dial); err == nil && !strings.HasPrefix(na.Network, "tcp") {
			return fmt.Errorf("upstream %q: the orbit_pool transport dials TCP upstreams only; use the http transport for a %s upstream", u.Dial, na.Network)
		}
	}
	if p := h.HealthChecks; p != nil && p.Passive != nil && p.Passive.FailDuration > 0 && t.wait > 0 {
		t.logger.Warn("passive health checks count every error of a transport as a failure of its upstream, orbit_pool's refusals too (no connection within wait_timeout, an owner busy): under a cap, a burst of them can mark a healthy upstream down for fail_duration; set max_fails above the refusals a burst may bring, or wait_timeout long enough",
			zap.Duration("fail_duration", time.Duration(p.Passive.FailDuration)),
			zap.Int("max_fails", p.Passive.MaxFails),
			zap.Duration("wait_timeout", t.wait))
	}
	return nil
}

// setScheme sets the scheme of req, which reverse_proxy leaves empty, as the
// `http` transport does.
func (t *Transport) setScheme(req *http.Request) {
	if req.URL.Scheme != "" {
		return
	}
	if t.TLS != nil && !slices.Contains(t.TLS.ExceptPorts, req.URL.Port()) {
		req.URL.Scheme = "https"
	} else {
		req.URL.Scheme = "http"
	}
}

// upstreamInfo is what the transport knows about one upstream it has sent
// requests to: its name and pool key, and its metrics.
type upstreamInfo struct {
	name  string
	key   orbitpool.Key
	label string                   // of its metrics series: name, or "other" past maxTrackedUpstreams
	wait  atomic.Pointer[waitSink] // its wait_duration_seconds series, once it had a connection
	named atomic.Pointer[keyNames] // the names this upstream was recorded in
}

// waitSink holds a metrics series, for an atomic pointer.
type waitSink struct{ waitObserver }

// Observe observes a wait of the upstream's, creating its series on the
// first: an upstream that never gave a request its connection (an
// address that refuses every dial) leaves none.
func (u *upstreamInfo) Observe(v float64) {
	s := u.wait.Load()
	if s == nil {
		s = &waitSink{localMetrics.wait.WithLabelValues(u.label)}
		u.wait.Store(s)
	}
	s.Observe(v)
}

// upstream is what the transport knows of req's upstream, named and keyed
// as the proxy transport files its connections, with its name recorded in
// f's names.
func (t *Transport) upstream(f *fleet, rt *proxy.Transport, req *http.Request) (*upstreamInfo, error) {
	name, key, err := rt.Upstream(req)
	if err != nil {
		return nil, err
	}
	v, ok := t.st.upstreams.Load(name)
	if !ok {
		u := &upstreamInfo{name: name, key: key, label: name}
		if t.st.tracked.Load() >= maxTrackedUpstreams {
			u.label = "other"
			return u, nil
		}
		var loaded bool
		if v, loaded = t.st.upstreams.LoadOrStore(name, u); !loaded {
			t.st.tracked.Add(1)
		}
	}
	u := v.(*upstreamInfo)
	if u.named.Load() != f.names {
		if err := f.names.add(key, name); err != nil {
			f.logger().Warn("recording an upstream's name for the fleet", zap.String("upstream", name), zap.Error(err))
		}
		u.named.Store(f.names)
	}
	return u, nil
}

// TLSEnabled reports whether TLS to the upstream is configured.
func (t *Transport) TLSEnabled() bool { return t.TLS != nil }

// EnableTLS turns on TLS to the upstream, with base as its settings.
func (t *Transport) EnableTLS(base *reverseproxy.TLSConfig) error {
	t.TLS = base
	return nil
}

// EnableH2C makes the transport speak h2c to cleartext upstreams (and
// HTTP/2 to TLS ones), as stock does for an h2c:// upstream.
func (t *Transport) EnableH2C() error {
	t.Versions = []string{"h2c", "2"}
	return nil
}

// checkVersions accepts the versions stock's `http` transport accepts, but
// HTTP/3.
func checkVersions(vs []string) error {
	for _, v := range vs {
		switch v {
		case "1.1", "2", "h2c":
		case "3":
			return errors.New(`unsupported HTTP version "3": the orbit_pool transport does not speak HTTP/3 (supported: 1.1, 2, h2c)`)
		default:
			return fmt.Errorf("unsupported HTTP version %q (supported: 1.1, 2, h2c)", v)
		}
	}
	return nil
}

// OverrideHealthCheckScheme makes active health checks use HTTPS when TLS is
// enabled and the port is not excepted, as the `http` transport does.
func (t *Transport) OverrideHealthCheckScheme(base *url.URL, port string) {
	if t.TLSEnabled() && !slices.Contains(t.TLS.ExceptPorts, port) {
		base.Scheme = "https"
	}
}

// RequestHeaderOps sets the Host header to the upstream's address when TLS
// is enabled, as the `http` transport does.
func (t *Transport) RequestHeaderOps() *headers.HeaderOps {
	if t.TLS == nil {
		return nil
	}
	return &headers.HeaderOps{
		Set: http.Header{
			"Host": []string{"{http.reverse_proxy.upstream.hostport}"},
		},
	}
}

// Cleanup does not close idle connections: they belong to the process's
// membership of the fleet, which a reloaded config keeps using.
func (t *Transport) Cleanup() error { return nil }

func (t *Transport) logf(lvl zapcore.Level, msg string, fields ...zap.Field) {
	if t.logger == nil {
		return
	}
	if c := t.logger.Check(lvl, msg); c != nil {
		c.Write(fields...)
	}
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// trackBody calls done once, when the response body is closed. A 101
// response's body is the upgraded connection and stays writable.
func trackBody(body io.ReadCloser, done func()) io.ReadCloser {
	if body == nil {
		done()
		return nil
	}
	tb := trackedBody{ReadCloser: body, done: done}
	if rwc, ok := body.(io.ReadWriteCloser); ok {
		if cw, ok := body.(interface{ CloseWrite() error }); ok {
			return &halfClosableBody{trackedRWBody{&tb, rwc}, cw}
		}
		return &trackedRWBody{&tb, rwc}
	}
	return &tb
}

type trackedBody struct {
	io.ReadCloser
	once sync.Once
	done func()
}

func (b *trackedBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(b.done)
	return err
}

type trackedRWBody struct {
	*trackedBody
	w io.Writer
}

func (b *trackedRWBody) Write(p []byte) (int, error) { return b.w.Write(p) }

type halfClosableBody struct {
	trackedRWBody
	cw interface{ CloseWrite() error }
}

func (b *halfClosableBody) CloseWrite() error { return b.cw.CloseWrite() }

// Interface guards
var (
	_ caddy.Provisioner                                = (*Transport)(nil)
	_ caddy.Validator                                  = (*Transport)(nil)
	_ caddy.CleanerUpper                               = (*Transport)(nil)
	_ http.RoundTripper                                = (*Transport)(nil)
	_ reverseproxy.TLSTransport                        = (*Transport)(nil)
	_ reverseproxy.H2CTransport                        = (*Transport)(nil)
	_ reverseproxy.HealthCheckSchemeOverriderTransport = (*Transport)(nil)
	_ reverseproxy.RequestHeaderOpsTransport           = (*Transport)(nil)
	_ io.ReadWriteCloser                               = (*trackedRWBody)(nil)
)
