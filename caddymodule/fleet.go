package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/orbitproxy/orbit/backpressure"
	orbitfleet "github.com/orbitproxy/orbit/fleet"
	"github.com/orbitproxy/orbit/governor"
	"github.com/orbitproxy/orbit/orbitpool"
	"github.com/orbitproxy/orbit/proxy"
)

// fleets holds this process's memberships, by their settings. A config
// reload that keeps the settings reuses the open membership; one that changes
// them gets a new membership (another lane of the same segment), and the old
// one closes when the old config's last request is over.
var fleets = caddy.NewUsagePool()

// fleetConfig is everything about a membership that is fixed once it is
// open. Settings read per request (policy, caps, wait timeout) are not here:
// changing them on a reload keeps the membership.
type fleetConfig struct {
	Segment            string        `json:"segment"`
	SocketDir          string        `json:"socket_dir"`
	Processes          int           `json:"processes"`
	Keys               int           `json:"keys"`
	ConnsPerProcess    int           `json:"conns_per_process"`
	MaxInFlight        int           `json:"max_in_flight"`
	DeadlineNearWindow time.Duration `json:"deadline_near_window"`
	Workers            int           `json:"workers"`
	MemoryLimit        uint64        `json:"memory_limit"`
	AdmissionCeiling   int           `json:"admission_ceiling"`
	ReconcileInterval  time.Duration `json:"reconcile_interval"`
	ReservationTimeout time.Duration `json:"reservation_timeout"`
	KeepSegment        bool          `json:"keep_segment"`
	OrderWindow        uint32        `json:"order_window"`
	ReclaimHold        time.Duration `json:"reclaim_hold"`
	FixedOwnership     bool          `json:"fixed_ownership"`
}

func (c fleetConfig) usageKey() string {
	b, _ := json.Marshal(c) // plain fields: cannot fail
	return "orbit_pool:" + string(b)
}

func (c fleetConfig) spec() orbitpool.PoolSpec {
	return orbitpool.PoolSpec{
		Path:             c.Segment,
		Lanes:            c.Processes,
		Keys:             c.Keys,
		ResourcesPerLane: c.ConnsPerProcess,
		Protocol:         proxy.Protocol,
	}
}

// fleet is one open membership: the pool table, the node that owns this
// process's upstream connections and serves siblings, the governor bounding
// that service, and the back-pressure permits shared by every transport.
type fleet struct {
	cfg     fleetConfig
	pool    *orbitpool.Pool
	node    *proxy.Node
	gov     *governor.Governor
	adm     *governor.Admission
	limiter *backpressure.Limiter
	names   *keyNames
	opened  time.Time
	log     atomic.Pointer[zap.Logger]
	drain   atomic.Int64 // how long Destruct runs siblings' exchanges, as a time.Duration
	// followers are the configs that started with this membership and
	// have not let go of it, oldest first (see follow).
	followMu  sync.Mutex
	followers []follower
}

func openFleet(cfg fleetConfig, log *zap.Logger) (*fleet, error) {
	if log == nil {
		log = zap.NewNop()
	}
	f := &fleet{cfg: cfg, opened: time.Now()}
	f.log.Store(log)
	f.drain.Store(int64(DefaultDrainTimeout))
	tag := orbitfleet.Tag()
	pool, err := orbitpool.Open(cfg.spec(), orbitpool.Options{
		Tag:                tag,
		ReconcileInterval:  cfg.ReconcileInterval,
		ReservationTimeout: cfg.ReservationTimeout,
		KeepSegment:        cfg.KeepSegment,
		OrderWindow:        cfg.OrderWindow,
		ReclaimHold:        cfg.ReclaimHold,
		OnReclaim: func(li orbitpool.LaneInfo) {
			f.logger().Warn("reclaimed the connections of a dead process",
				zap.Int("pid", li.PID),
				zap.Int("lane", li.Lane),
				zap.Int("connections", li.Resources),
				zap.Duration("budget_held_for", cfg.ReclaimHold))
		},
		OnError: func(err error) {
			if errors.Is(err, orbitpool.ErrLeakedGuard) {
				f.logger().Error("a connection use or dial permit was never released; the garbage collector returned it", zap.Error(err))
				return
			}
			f.logger().Error("pool housekeeping", zap.Error(err))
		},
	})
	if err != nil {
		return nil, fmt.Errorf("opening segment %s: %w", cfg.Segment, err)
	}
	f.pool = pool
	if err := f.logMembers(tag); err != nil {
		pool.Close()
		return nil, err
	}
	f.gov = governor.New(cfg.Workers, cfg.MemoryLimit)
	f.gov.OnLeak(func(n int) {
		f.logger().Error("a request's budget lease was never released; the garbage collector returned its workers and memory", zap.Int("leases", n))
	})
	f.adm = governor.NewAdmission(cfg.AdmissionCeiling)
	node, err := proxy.NewNode(pool, proxy.NodeOptions{
		SocketDir:          cfg.SocketDir,
		Governor:           f.gov,
		Admission:          f.adm,
		DeadlineNearWindow: cfg.DeadlineNearWindow,
		// Well before the pool ages the reservation out: a lease the
		// owner cannot start is rejected and given back instead.
		MaxLeaseWait:   cfg.ReservationTimeout / 2,
		FixedOwnership: cfg.FixedOwnership,
		// The upstream may count a connection whose request was
		// abandoned as long as it counts a dead process's.
		FailedCloseWait: cfg.ReclaimHold,
		// The node is part of the membership: it logs where the
		// membership does (see follow), not to the opening config's
		// logs, which Caddy closes once that config is replaced.
		Logger: log.WithOptions(zap.WrapCore(func(zapcore.Core) zapcore.Core {
			return &followingCore{f: f}
		})).Named("node"),
	})
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("listening for siblings in %s: %w", cfg.SocketDir, err)
	}
	f.node = node
	if f.names, err = openKeyNames(f.namesDir()); err != nil {
		node.Close()
		pool.Close()
		return nil, fmt.Errorf("upstream names: %w", err)
	}
	f.limiter = backpressure.New(
		backpressure.WithCap(cfg.MaxInFlight),
		backpressure.WithNearWindow(cfg.DeadlineNearWindow),
		backpressure.WithOnLeak(func(n int) {
			f.logger().Error("a request's back-pressure permit was never released; the garbage collector returned it", zap.Int("permits", n))
		}),
	)
	return f, nil
}

// logMembers says who else uses the segment. Processes of another fleet
// (another supervisor, or none) share this one's connections and caps: that
// can be meant, as when two sites on one host cap the same upstream, or when
// a new fleet takes over from an old one, so it is logged, not refused.
// `caddy orbit-fleet` refuses the one case that must be a mistake, a second
// fleet on the same listening address, unless told it is a hand-over.
func (f *fleet) logMembers(tag uint64) error {
	snap, err := f.pool.Snapshot()
	if err != nil {
		return fmt.Errorf("reading the fleet table: %w", err)
	}
	var pids, foreign []int
	for _, li := range snap.Lanes {
		if li.Local {
			continue
		}
		pids = append(pids, li.PID)
		if li.Tag != tag {
			foreign = append(foreign, li.PID)
		}
	}
	switch {
	case len(foreign) > 0:
		f.logger().Warn("joining a segment processes of another fleet are using: they share connections and caps with this one",
			zap.String("segment", f.cfg.Segment), zap.Ints("pids", pids), zap.Ints("other_fleet_pids", foreign))
	case len(pids) > 0:
		f.logger().Info("joining processes already in the fleet", zap.String("segment", f.cfg.Segment), zap.Ints("pids", pids))
	}
	return nil
}

func (f *fleet) logger() *zap.Logger { return f.log.Load() }

// follower is what a config that started with a membership sets for it:
// where it logs, and how long it drains when it leaves.
type follower struct {
	log   *zap.Logger
	drain time.Duration
}

// follow makes the membership log and drain as c says from now on.
func (f *fleet) follow(c follower) {
	f.followMu.Lock()
	defer f.followMu.Unlock()
	f.followers = append(f.followers, c)
	f.apply(c)
}

// unfollow is follow's undoing, when the config whose logger l is lets go
// of the membership (Cleanup): the membership logs and drains as the
// newest of the configs still following it says. A config refused after
// its apps started (another app's Start failed) let go of it before the
// running config did, and its logs are closed. The last follower's
// settings stay, for the membership's leaving.
func (f *fleet) unfollow(l *zap.Logger) {
	f.followMu.Lock()
	defer f.followMu.Unlock()
	i := slices.IndexFunc(f.followers, func(c follower) bool { return c.log == l })
	if i < 0 {
		return
	}
	f.followers = slices.Delete(f.followers, i, i+1)
	if n := len(f.followers); n > 0 {
		f.apply(f.followers[n-1])
	}
}

func (f *fleet) apply(c follower) {
	if c.log != nil {
		f.log.Store(c.log)
	}
	f.drain.Store(int64(c.drain))
}

// followingCore writes to the core of the membership's logger of the
// moment (see follow).
type followingCore struct {
	f      *fleet
	fields []zapcore.Field
}

func (c *followingCore) core() zapcore.Core {
	core := c.f.logger().Core()
	if len(c.fields) > 0 {
		core = core.With(c.fields)
	}
	return core
}

func (c *followingCore) Enabled(l zapcore.Level) bool { return c.f.logger().Core().Enabled(l) }

func (c *followingCore) With(fields []zapcore.Field) zapcore.Core {
	return &followingCore{f: c.f, fields: append(slices.Clip(c.fields), fields...)}
}

func (c *followingCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	return c.core().Check(e, ce)
}

func (c *followingCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	return c.core().Write(e, fields)
}

func (c *followingCore) Sync() error { return c.f.logger().Core().Sync() }

func (f *fleet) socketDir() string {
	if f.cfg.SocketDir != "" {
		return f.cfg.SocketDir
	}
	return proxy.SocketDir(f.cfg.Segment)
}

// namesDir is where the members write the upstream names of the fleet's
// keys: beside their forwarding sockets, in a directory only their user may
// enter.
func (f *fleet) namesDir() string { return filepath.Join(f.socketDir(), "names") }

// Destruct leaves the fleet: this process's connections are closed and
// unregistered, its socket removed and its lane freed.
func (f *fleet) Destruct() error {
	f.logger().Info("leaving the fleet", zap.String("segment", f.cfg.Segment), zap.Int("lane", f.pool.Lane()))
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(f.drain.Load()))
	nerr := f.node.Shutdown(ctx)
	cancel()
	perr := f.pool.Close()
	// The last member's leaving empties the socket directory, but for the
	// upstream names and what the members wrote there for one another;
	// removing a directory still in use fails and is meant to.
	if _, err := os.Stat(f.cfg.Segment); errors.Is(err, fs.ErrNotExist) {
		f.names.remove()
		proxy.RemoveFleetFiles(f.socketDir())
		os.Remove(f.socketDir())
	}
	if nerr != nil {
		return fmt.Errorf("closing node: %w", nerr)
	}
	if perr != nil {
		return fmt.Errorf("closing pool: %w", perr)
	}
	return nil
}

// openFleets lists the memberships this process holds now.
func openFleets() []*fleet {
	var out []*fleet
	fleets.Range(func(_, v any) bool {
		if f, ok := v.(*fleet); ok {
			out = append(out, f)
		}
		return true
	})
	return out
}

// Interface guards
var _ caddy.Destructor = (*fleet)(nil)
