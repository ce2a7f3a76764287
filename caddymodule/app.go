package caddymodule

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/orbitproxy/orbit/backpressure"
	"github.com/orbitproxy/orbit/governor"
	"github.com/orbitproxy/orbit/orbitpool"
	"github.com/orbitproxy/orbit/proxy"
)

func init() {
	caddy.RegisterModule(App{})
}

// Policies an App can name.
const (
	PolicyLocalFirst = "local_first"
	PolicyLocalOnly  = "local_only"
)

// Defaults an App falls back on.
const (
	// DefaultWaitTimeout is how long a request may wait for an upstream
	// connection, and for a back-pressure permit, before it is refused.
	DefaultWaitTimeout = 5 * time.Second
	// DefaultReconcileInterval is how often a process checks for dead
	// siblings and ages the reservations nobody presented.
	DefaultReconcileInterval = 250 * time.Millisecond
	// DefaultReservationTimeout is how long a reservation on one of this
	// process's connections may go unpresented before it is dropped.
	DefaultReservationTimeout = time.Second
	// DefaultDrainTimeout is how long a leaving process runs the exchanges
	// siblings started on its connections (see App.DrainTimeout).
	DefaultDrainTimeout = 10 * time.Second
	// DefaultForwardingWorkers is how many exchanges (its own requests' and
	// those it forwards for siblings) a process runs at once unless
	// configured: far above what connection caps produce, and above the
	// long-lived exchanges a process holds open (server-sent events, long
	// polls and slow downloads hold theirs until their body ends), so
	// that it only ever stops a runaway. The name is kept from when only
	// forwarded exchanges counted.
	DefaultForwardingWorkers = 16384
	// DefaultMaxInFlight is the back-pressure cap unless configured: as
	// high as the workers, for the same reason.
	DefaultMaxInFlight = DefaultForwardingWorkers
	// DefaultOrderWindow is how many tickets a waiter may be passed by, so
	// that a connection that comes free stays with its own process's
	// waiter (see App.OrderWindow).
	DefaultOrderWindow = 64
	// DefaultReclaimHold is how long a dead process's share of a capped
	// upstream's connections stays out of the fleet's budget (see
	// App.ReclaimHold).
	DefaultReclaimHold = time.Second
)

// App is the `orbit_pool` app: this process's membership of a fleet of Caddy
// processes that share their upstream connections through one pool table in
// shared memory. It owns the table, the forwarding socket on which siblings
// send requests for the connections this process owns, the process's one
// budget of exchange workers and buffer memory (its own requests' and its
// siblings'), the admission backstop, and the back-pressure permits every
// request through an `orbit_pool` transport takes.
//
// All of it is opened as the config loads (see Provision) and kept in a
// process-wide usage pool: a config reload (whose new config loads before the
// old one stops) reuses it and drops nothing in flight, and it is closed once the last config
// using it has stopped and its last in-flight request has finished.
//
// Every process of a fleet must name the same segment with the same table
// sizes. The per-request settings (policy, caps, wait timeout) may differ
// between processes and may change on a reload.
type App struct {
	// Segment is the shared-memory file holding the fleet's pool table.
	// Processes that name the same file form one fleet. Default:
	// /dev/shm/orbit-pool.
	Segment string `json:"segment,omitempty"`

	// SocketDir is the directory of the fleet's forwarding sockets, one per
	// process; every process of the fleet must use the same directory.
	// It is created 0700 and each socket 0600, and only processes of the
	// same user may connect. Default: the segment's path with ".sock"
	// appended (or, when that path is too long for a unix socket, a
	// directory in the system temp directory named after the segment).
	SocketDir string `json:"socket_dir,omitempty"`

	// Processes is how many processes can be members of the fleet at once,
	// counting old and new ones overlapping during an upgrade. Part of the
	// table's size: every process must use the same value. Default: 64;
	// at most 256, room for a fleet of 128 handing over to another.
	Processes int `json:"processes,omitempty"`

	// Keys is how many distinct upstreams (scheme, address and TLS
	// identity) the table can track at once. Part of the table's size.
	// A request to an upstream past it, while every entry holds
	// connections, goes as when the process's connections are full (see
	// ConnsPerProcess). Default: 1024.
	Keys int `json:"keys,omitempty"`

	// ConnsPerProcess is how many upstream connections one process can own
	// at once. Part of the table's size. With all of them taken, a request
	// makes room by closing the process's connection idle longest
	// (connections_evicted_total counts them). With all of them in use
	// (each long-lived exchange, a server-sent event stream say, holds
	// one), a request to an upstream under no max_conns_per_host or
	// max_dialing_per_host goes on an HTTP/1.1 connection of the process
	// outside the table, kept idle for the next such request, and
	// unpooled_requests_total counts it; one to a capped or HTTP/2
	// upstream waits up to wait_timeout for one of its connections or for
	// room, and is refused (table_full) if neither comes. Default: 1024.
	ConnsPerProcess int `json:"conns_per_process,omitempty"`

	// Policy decides where a request's connection comes from. "local_first"
	// takes one of this process's connections with room, else a sibling's
	// (least loaded first), else dials one within the budget, else waits;
	// a request whose body declares 1 MiB or more dials before it takes a
	// sibling's, which would relay every byte of it, and so does a request
	// to an HTTP/1.1 upstream without max_conns_per_host once its process
	// has relayed 4 of the upstream's requests (32 over TLS), each within a
	// second of the last, since it dialed one. "local_only" never
	// uses a sibling's connection, and so takes no max_conns_per_host (a
	// worker whose siblings held the capped connections would wait for
	// one until its requests time out). Default: local_first.
	Policy string `json:"policy,omitempty"`

	// MaxConnsPerHost caps the connections to one upstream across the whole
	// fleet, open and being dialed. A request finding the cap reached waits
	// for a connection to come free anywhere in the fleet. A transport may
	// set its own. Default: 0, no cap.
	MaxConnsPerHost int `json:"max_conns_per_host,omitempty"`

	// MaxDialingPerHost caps the connections to one upstream being dialed at
	// once across the fleet, so that a cold upstream is warmed gradually
	// rather than stampeded by every process at once. A transport may set
	// its own. Default: 0, no cap for HTTP/1.1, and 1 for an HTTP/2 or h2c
	// upstream, whose one connection carries many streams: requests that
	// find no stream free wait for the connection being dialed.
	MaxDialingPerHost int `json:"max_dialing_per_host,omitempty"`

	// WaitTimeout is how long a request may wait for a back-pressure permit
	// and an upstream connection together; past it the request is refused
	// with 503. The time a sibling held a request it then refused (busy,
	// leaving, its connection gone) counts; a request sent again after a reused connection
	// closed before answering may wait as long again. A transport may set
	// its own. Default: 5s.
	WaitTimeout caddy.Duration `json:"wait_timeout,omitempty"`

	// DeadlineNearWindow is how close to its deadline a request with one
	// may still start upstream work: closer than this it is refused with
	// 503 at once instead of failing late with 504. Default: 50ms.
	DeadlineNearWindow caddy.Duration `json:"deadline_near_window,omitempty"`

	// MaxInFlight is the back-pressure cap: how many requests this process
	// sends upstream through orbit_pool transports at once; more wait, in
	// arrival order, within their wait timeout. 0 drains the process: every
	// new request is refused with 503 and Retry-After at once, in-flight
	// ones finish. A request holds its permit until its response body
	// ends, so a long-lived one (server-sent events) holds it while it is
	// open. Default: 16384.
	MaxInFlight *int `json:"max_in_flight,omitempty"`

	// Workers is the process budget's worker count: how many exchanges
	// this process runs at once, its own requests' and those it forwards
	// on its connections for siblings together. An exchange holds its
	// worker (more than one for a large body, when free) for its whole
	// run, mostly waiting on the upstream, so this is a backstop against
	// pathological fan-out, not a CPU budget: sized by CPU count it would
	// let a slow upstream's requests queue behind two exchanges. A
	// request waits for a worker within its wait_timeout and deadline; a
	// sibling's lease waits at most half the reservation_timeout, and no
	// longer than what is left of the sibling's wait_timeout, then is
	// rejected so the sibling tries another plan. Default: 16384, like
	// max_in_flight.
	Workers int `json:"workers,omitempty"`

	// MemoryLimit is the process budget's memory, in bytes, for the
	// buffers exchanges hold (32KiB each: request body copy and relay
	// buffers, the forwarding streams' buffers). An exchange with a large
	// or unknown-length body asks for up to 8 buffers and streams in
	// larger writes; when the limit is reached it gets one, so every
	// exchange progresses and the total can pass the limit by one buffer
	// per running exchange (bounded by workers). Default: from the
	// machine (a quarter of the smaller of the cgroup memory limit and
	// GOMEMLIMIT, else 256MiB).
	MemoryLimit uint64 `json:"memory_limit,omitempty"`

	// AdmissionCeiling is the admission backstop: this process dials no
	// new upstream connection while it owns and is dialing this many, and
	// takes up no sibling's lease while it runs this many siblings'
	// exchanges; such a request is refused with 503 (reason admission) or
	// sent elsewhere. It never blocks and is meant to decide nothing in
	// ordinary operation. Default: 32768.
	AdmissionCeiling int `json:"admission_ceiling,omitempty"`

	// ReconcileInterval is how often this process checks for dead siblings,
	// reclaims what they held and ages reservations nobody presented.
	// Default: 250ms.
	ReconcileInterval caddy.Duration `json:"reconcile_interval,omitempty"`

	// ReservationTimeout is how long a reservation on one of this process's
	// connections may wait to be presented before it is dropped. Default:
	// 1s.
	ReservationTimeout caddy.Duration `json:"reservation_timeout,omitempty"`

	// DrainTimeout is how long a process leaving the fleet (it stops, or a
	// reload moves it to a membership of other settings) keeps running the
	// exchanges siblings started on its connections, once its own servers
	// have drained, before it closes those connections: a sibling's
	// request still running then fails, where without the fleet its own
	// connection would have served it. Set it above the longest response a
	// sibling may relay (a download, a long poll) when workers are
	// restarted one at a time. Default: 10s.
	DrainTimeout caddy.Duration `json:"drain_timeout,omitempty"`

	// OrderWindow bounds how far waiting requests may be served out of
	// arrival order. Requests that wait for a connection (a cap reached)
	// are served in the order they arrived across the whole fleet; a
	// connection that comes free in one process would then mostly go to a
	// request waiting in another, which costs both processes a wake-up and
	// relays the request through the connection's owner. Within the
	// window, the connection goes to its own process's oldest waiter
	// instead, if that one is at most this many arrivals behind the
	// fleet's oldest: no waiter is ever passed by one that arrived more
	// than order_window requests after it. The dial budget a closed
	// connection gives back goes in strict order whatever the window. 0
	// means strict arrival order. Default: 64.
	OrderWindow *int `json:"order_window,omitempty"`

	// ReclaimHold is how long the connections of a dead process (killed,
	// crashed) stay counted against max_conns_per_host once a sibling has
	// found it dead. The kernel closes them at once, but the upstream
	// counts each until it has read the close, and one it was answering
	// until that answer is done: dialing their replacements at once can
	// take the upstream past a connection limit of its own, and have it
	// refuse them, failing the requests sent on them. Those the upstream
	// has still not closed when the hold ends stay counted until it does,
	// for at most a minute: the kernel keeps each, orphaned in FIN_WAIT,
	// until the upstream closes its side, and says so (sock_diag, asked of
	// every address a worker of the fleet dialed the upstream at; where it
	// cannot be asked, the hold is the set time). It also bounds how long
	// a connection whose request was abandoned (its client, or the sibling
	// it served, went away) keeps its place under the cap while the
	// upstream finishes answering and closes its side; that wait ends as
	// soon as the upstream closes, and is at least 250ms. Requests waiting
	// for a connection meanwhile keep waiting, within their wait_timeout.
	// For a minute after the upstream refused a connection (closed a new
	// one at once while it still held one this worker closed after
	// reclaim_hold), an abandoned connection's place stays held while the
	// upstream holds it, up to a minute, and a refused one's while it
	// holds those. Otherwise, set it above the longest response the
	// upstream may still be sending to a request nobody waits for: an
	// abandoned connection waits no longer, and the kernel cannot tell of
	// a dead process's connection it reset (one with a response arriving
	// unread). 0 gives a dead process's budget back at once. Default: 1s.
	ReclaimHold *caddy.Duration `json:"reclaim_hold,omitempty"`

	// FixedOwnership keeps a capped upstream's connections with the worker
	// that dialed them. By default, with an order window, a worker that
	// holds at least two more of them than a worker whose requests wait for
	// one closes one in good order, and that worker dials the replacement,
	// until ownership is even (each move is one new upstream connection,
	// and for TLS one handshake); without it, a worker that dialed none at
	// the cold start relays every request through a sibling. Default:
	// false.
	FixedOwnership bool `json:"fixed_ownership,omitempty"`

	// KeepSegment leaves the segment file in place when the last process
	// of the fleet leaves, so that the next fleet inherits its counters as
	// lifetime totals. Default: false; the last process to leave removes
	// the segment and its socket directory, and a new fleet starts from
	// zero.
	KeepSegment bool `json:"keep_segment,omitempty"`

	logger *zap.Logger
	policy orbitpool.Policy
	key    string // the fleet's entry in the usage pool
	st     *appState
}

// appState is the app's membership and the requests in flight through it.
type appState struct {
	mu       sync.Mutex
	fl       *fleet
	stopping atomic.Bool
	inflight atomic.Int64
	release  sync.Once
	// followed: the membership logs to this config's logger. A config
	// that takes the running membership in Provision only has it follow
	// once the config starts: until then it may yet be refused, and its
	// logs closed. Cleanup undoes it (see fleet.unfollow): a config may
	// also be refused once started, when another of its apps fails to.
	followed bool
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "orbit_pool",
		New: func() caddy.Module { return new(App) },
	}
}

// Provision sets up the app's defaults and registers its metrics. In a
// process that already runs a config (a reload) it also joins the fleet, or
// takes the membership the running config holds with the same settings: a
// membership the fleet refuses (a segment of other table sizes, a socket
// directory of the wrong owner) then fails the new config before any of its
// servers starts, and the running one serves on. Caddy starts a config's apps
// in no set order; had the join waited for Start, a new HTTP server started
// before this app would answer its clients 502 until Caddy gave the config
// up. A first config (and `caddy validate`, which runs none) joins in Start.
func (a *App) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger()
	a.st = new(appState)
	a.setDefaults()
	a.key = a.fleetConfig().usageKey()
	registerMetrics(ctx, a)
	if caddy.ActiveContext().Context == nil {
		return nil
	}
	if err := a.Validate(); err != nil {
		return err
	}
	if _, err := a.fleet(false); err != nil {
		return fmt.Errorf("joining the fleet: %w", err)
	}
	return nil
}

// setDefaults fills in every setting left unset.
func (a *App) setDefaults() {
	if a.Segment == "" {
		a.Segment = orbitpool.DefaultSegmentPath
	}
	if a.SocketDir == "" && filepath.IsAbs(a.Segment) {
		a.SocketDir = proxy.SocketDir(filepath.Clean(a.Segment))
	}
	spec := orbitpool.PoolSpec{Lanes: a.Processes, Keys: a.Keys, ResourcesPerLane: a.ConnsPerProcess}.WithDefaults()
	if a.Processes == 0 {
		a.Processes = spec.Lanes
	}
	if a.Keys == 0 {
		a.Keys = spec.Keys
	}
	if a.ConnsPerProcess == 0 {
		a.ConnsPerProcess = spec.ResourcesPerLane
	}
	if a.Policy == "" {
		a.Policy = PolicyLocalFirst
	}
	switch a.Policy {
	case PolicyLocalFirst:
		a.policy = orbitpool.LocalFirst{}
	case PolicyLocalOnly:
		a.policy = orbitpool.LocalOnly{}
	}
	if a.WaitTimeout == 0 {
		a.WaitTimeout = caddy.Duration(DefaultWaitTimeout)
	}
	if a.DeadlineNearWindow == 0 {
		a.DeadlineNearWindow = caddy.Duration(backpressure.DefaultNearWindow)
	}
	if a.MaxInFlight == nil {
		n := DefaultMaxInFlight
		a.MaxInFlight = &n
	}
	if a.OrderWindow == nil {
		n := DefaultOrderWindow
		a.OrderWindow = &n
	}
	if a.ReclaimHold == nil {
		d := caddy.Duration(DefaultReclaimHold)
		a.ReclaimHold = &d
	}
	if a.Workers == 0 {
		a.Workers = DefaultForwardingWorkers
	}
	if a.MemoryLimit == 0 {
		a.MemoryLimit = governor.FromInputs(detectInputs(), 0).MemoryLimit()
	}
	if a.AdmissionCeiling == 0 {
		a.AdmissionCeiling = governor.DefaultInFlightCeiling
	}
	if a.ReconcileInterval == 0 {
		a.ReconcileInterval = caddy.Duration(DefaultReconcileInterval)
	}
	if a.ReservationTimeout == 0 {
		a.ReservationTimeout = caddy.Duration(DefaultReservationTimeout)
	}
	if a.DrainTimeout == 0 {
		a.DrainTimeout = caddy.Duration(DefaultDrainTimeout)
	}
}

// checkCap rejects a fleet-wide cap of n connections per upstream under
// policy local_only. A cap's connections are owned where they were dialed:
// a worker whose siblings hold them all can neither use theirs nor dial its
// own, and its requests wait until they time out. Measured with the demo's
// capped scenario (16 connections, 4 workers): 188 req/s and timeouts, where
// local_first served 2,600 req/s with none.
func (a *App) checkCap(n int) error {
	if _, ok := a.policy.(orbitpool.LocalOnly); ok && n > 0 {
		return fmt.Errorf("max_conns_per_host %d cannot be shared under policy %s: a worker whose siblings hold the capped connections waits for one until its requests time out; use %s, or no cap",
			n, PolicyLocalOnly, PolicyLocalFirst)
	}
	return nil
}

// Validate rejects a configuration that cannot work.
func (a *App) Validate() error {
	if !filepath.IsAbs(a.Segment) {
		return fmt.Errorf("segment must be an absolute path, got %q", a.Segment)
	}
	if !filepath.IsAbs(a.SocketDir) {
		return fmt.Errorf("socket_dir must be an absolute path, got %q", a.SocketDir)
	}
	if a.Processes < 1 || a.Processes > orbitpool.MaxLanes {
		return fmt.Errorf("processes must be between 1 and %d, got %d", orbitpool.MaxLanes, a.Processes)
	}
	if a.Keys < 1 {
		return fmt.Errorf("keys must be at least 1, got %d", a.Keys)
	}
	if a.ConnsPerProcess < 1 || a.ConnsPerProcess > orbitpool.MaxResourcesPerLane {
		return fmt.Errorf("conns_per_process must be between 1 and %d, got %d", orbitpool.MaxResourcesPerLane, a.ConnsPerProcess)
	}
	if err := a.fleetConfig().spec().Validate(); err != nil {
		return fmt.Errorf("table sizes: %w", err)
	}
	if a.policy == nil {
		return fmt.Errorf("unknown policy %q: want %s or %s", a.Policy, PolicyLocalFirst, PolicyLocalOnly)
	}
	if a.MaxConnsPerHost < 0 {
		return fmt.Errorf("max_conns_per_host must not be negative, got %d", a.MaxConnsPerHost)
	}
	if err := a.checkCap(a.MaxConnsPerHost); err != nil {
		return err
	}
	if a.MaxDialingPerHost < 0 {
		return fmt.Errorf("max_dialing_per_host must not be negative, got %d", a.MaxDialingPerHost)
	}
	if a.WaitTimeout < 0 {
		return fmt.Errorf("wait_timeout must be positive, got %s", time.Duration(a.WaitTimeout))
	}
	if a.DeadlineNearWindow < 0 {
		return fmt.Errorf("deadline_near_window must not be negative, got %s", time.Duration(a.DeadlineNearWindow))
	}
	if *a.MaxInFlight < 0 {
		return fmt.Errorf("max_in_flight must not be negative, got %d", *a.MaxInFlight)
	}
	if *a.OrderWindow < 0 || *a.OrderWindow > math.MaxInt32 {
		return fmt.Errorf("order_window must be between 0 and %d, got %d", math.MaxInt32, *a.OrderWindow)
	}
	if a.Workers < 0 {
		return fmt.Errorf("workers must not be negative, got %d", a.Workers)
	}
	if a.Workers > governor.MaxWorkers {
		return fmt.Errorf("workers must be at most %d, got %d", governor.MaxWorkers, a.Workers)
	}
	if a.AdmissionCeiling < 0 {
		return fmt.Errorf("admission_ceiling must not be negative, got %d", a.AdmissionCeiling)
	}
	if a.ReconcileInterval < 0 {
		return fmt.Errorf("reconcile_interval must be positive, got %s", time.Duration(a.ReconcileInterval))
	}
	if a.ReservationTimeout < 0 {
		return fmt.Errorf("reservation_timeout must be positive, got %s", time.Duration(a.ReservationTimeout))
	}
	if a.DrainTimeout < 0 {
		return fmt.Errorf("drain_timeout must be positive, got %s", time.Duration(a.DrainTimeout))
	}
	if a.ReclaimHold != nil && *a.ReclaimHold < 0 {
		return fmt.Errorf("reclaim_hold must not be negative, got %s", time.Duration(*a.ReclaimHold))
	}
	return nil
}

// Start joins the fleet, unless Provision did.
func (a *App) Start() error {
	f, err := a.fleet(true)
	if err != nil {
		return err
	}
	if *a.MaxInFlight == 0 {
		a.logger.Warn("max_in_flight is 0: draining, every request through orbit_pool is refused")
	}
	a.logger.Info("joined the fleet",
		zap.String("segment", f.cfg.Segment),
		zap.String("socket_dir", f.cfg.SocketDir),
		zap.Int("lane", f.pool.Lane()),
		zap.String("policy", a.Policy),
		zap.Int("max_conns_per_host", a.MaxConnsPerHost),
		zap.Duration("wait_timeout", time.Duration(a.WaitTimeout)))
	return nil
}

// Stop does not leave the fleet yet. Caddy stops its apps in no set order,
// and the HTTP servers of this config may still be draining: requests
// already accepted, and new ones on their open connections, still go
// through the pool. Cleanup, which Caddy runs once every app has stopped,
// leaves.
func (a *App) Stop() error { return nil }

// Cleanup lets go of the fleet, once this config's HTTP servers have
// drained. The membership is closed once no config uses it any more, and not
// before the requests this config still has in flight through it (a
// WebSocket, say) have finished: a reload whose new config shares the
// membership keeps it, connections and all. After a failed Provision there
// is nothing to let go of.
func (a *App) Cleanup() error {
	if a.st == nil || !a.st.stopping.CompareAndSwap(false, true) {
		return nil
	}
	a.st.mu.Lock()
	if a.st.followed && a.st.fl != nil {
		a.st.fl.unfollow(a.logger)
	}
	a.st.mu.Unlock()
	if a.st.inflight.Load() == 0 {
		a.releaseFleet()
	}
	return nil
}

// fleet returns the app's membership of the fleet, taking it from the usage
// pool (opening the segment if this process has not yet) on first use: in
// Provision or Start (see Provision), or for a transport whose server
// started before this app did. With follow (the config is starting), a
// membership taken from a running config logs to this config's logger from
// then on.
func (a *App) fleet(follow bool) (*fleet, error) {
	st := a.st
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.fl != nil {
		if follow && !st.followed && !st.stopping.Load() {
			st.followed = true
			a.lead(st.fl)
		}
		return st.fl, nil
	}
	if st.stopping.Load() {
		return nil, errAppStopped
	}
	cfg := a.fleetConfig()
	v, loaded, err := fleets.LoadOrNew(a.key, func() (caddy.Destructor, error) {
		return openFleet(cfg, a.logger)
	})
	if err != nil {
		return nil, err
	}
	f := v.(*fleet)
	st.followed = !loaded || follow
	if st.followed {
		a.lead(f)
	}
	st.fl = f
	return f, nil
}

// lead has membership f follow this config from now on: its logs, and how
// long it drains when it leaves.
func (a *App) lead(f *fleet) {
	f.follow(follower{log: a.logger, drain: time.Duration(a.DrainTimeout)})
}

var errAppStopped = errors.New("orbit_pool app stopped")

// begin counts a request in flight through the app's fleet, joining the
// fleet if Start has not run yet; end must follow once the exchange is over.
func (a *App) begin() (*fleet, error) {
	a.st.inflight.Add(1)
	f, err := a.fleet(true)
	if err != nil {
		a.end()
		return nil, err
	}
	return f, nil
}

func (a *App) end() {
	if a.st.inflight.Add(-1) == 0 && a.st.stopping.Load() {
		// Not on the caller's goroutine: closing the membership waits for
		// the node's goroutines.
		go a.releaseFleet()
	}
}

func (a *App) releaseFleet() {
	f := a.currentFleet()
	if f == nil {
		return
	}
	a.st.release.Do(func() {
		if _, err := fleets.Delete(a.key); err != nil && a.logger != nil {
			a.logger.Error("leaving the fleet", zap.String("segment", f.cfg.Segment), zap.Error(err))
		}
	})
}

// currentFleet is the app's membership if it has one, without taking one.
func (a *App) currentFleet() *fleet {
	if a.st == nil {
		return nil
	}
	a.st.mu.Lock()
	defer a.st.mu.Unlock()
	return a.st.fl
}

// limits are the pool limits of a transport that sets none of its own.
func (a *App) limits() orbitpool.Limits {
	return orbitpool.Limits{MaxResources: a.MaxConnsPerHost, MaxCreating: a.MaxDialingPerHost}
}

func (a *App) fleetConfig() fleetConfig {
	cfg := fleetConfig{
		Segment:            filepath.Clean(a.Segment),
		SocketDir:          a.SocketDir,
		Processes:          a.Processes,
		Keys:               a.Keys,
		ConnsPerProcess:    a.ConnsPerProcess,
		DeadlineNearWindow: time.Duration(a.DeadlineNearWindow),
		Workers:            a.Workers,
		MemoryLimit:        a.MemoryLimit,
		AdmissionCeiling:   a.AdmissionCeiling,
		ReconcileInterval:  time.Duration(a.ReconcileInterval),
		ReservationTimeout: time.Duration(a.ReservationTimeout),
		KeepSegment:        a.KeepSegment,
		FixedOwnership:     a.FixedOwnership,
	}
	if a.SocketDir != "" {
		cfg.SocketDir = filepath.Clean(a.SocketDir)
	}
	if a.MaxInFlight != nil {
		cfg.MaxInFlight = *a.MaxInFlight
	}
	if a.OrderWindow != nil {
		cfg.OrderWindow = uint32(*a.OrderWindow)
	}
	if a.ReclaimHold != nil {
		cfg.ReclaimHold = time.Duration(*a.ReclaimHold)
	}
	return cfg
}

// Interface guards
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.Validator    = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
)

// detectInputs is what the governor sizes a default budget from: the Go
// runtime's view (GOMAXPROCS, which since Go 1.25 follows the cgroup CPU
// limit, and GOMEMLIMIT, which Caddy's main sets from the cgroup) and the
// cgroup memory limit as automemlimit reads it, for a process whose main
// did not.
func detectInputs() governor.Inputs {
	in := governor.DetectInputs()
	if limit, err := memlimit.FromCgroup(); err == nil && limit > 0 {
		in.MemoryLimit = limit
	}
	return in
}
