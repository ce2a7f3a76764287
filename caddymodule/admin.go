package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"sort"
	"time"

	"github.com/caddyserver/caddy/v2"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// adminAPI is the admin API route GET /orbit_pool/: the fleet's table, as
// this process reads it from shared memory, with this process's own view
// (its lane, the upstream names it knows, its node counters).
type adminAPI struct{}

// CaddyModule returns the Caddy module information.
func (adminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.orbit_pool",
		New: func() caddy.Module { return new(adminAPI) },
	}
}

// Routes returns the admin routes of the module.
func (adminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/orbit_pool/", Handler: caddy.AdminHandlerFunc(serveFleetTable)}}
}

// FleetTable is the JSON body of GET /orbit_pool/.
type FleetTable struct {
	// PID is this process.
	PID int `json:"pid"`
	// Fleets are the memberships this process holds: normally one, two
	// while a reload that changed the fleet settings drains the old one.
	Fleets []FleetView `json:"fleets"`
}

// FleetView is one fleet as one of its processes sees it.
type FleetView struct {
	Segment         string         `json:"segment"`
	SocketDir       string         `json:"socket_dir"`
	Lane            int            `json:"lane"`
	Processes       int            `json:"processes"`
	Keys            int            `json:"keys"`
	ConnsPerProcess int            `json:"conns_per_process"`
	Members         []MemberView   `json:"members"`
	Upstreams       []UpstreamView `json:"upstreams"`
	Node            NodeView       `json:"node"`
	Joined          time.Time      `json:"joined"`
}

// MemberView is one process of the fleet.
type MemberView struct {
	Lane        int       `json:"lane"`
	PID         int       `json:"pid"`
	Self        bool      `json:"self,omitempty"`
	Started     time.Time `json:"started"`
	Heartbeat   time.Time `json:"heartbeat"`
	Connections int       `json:"connections"`
}

// UpstreamView is one pool key: gauges now, counters summed over the fleet.
type UpstreamView struct {
	Key          string   `json:"key"`
	Upstreams    []string `json:"upstreams,omitempty"`
	Live         int      `json:"live"`
	Dialing      int      `json:"dialing"`
	Held         int      `json:"held"` // budget of a dead process's connections, held back (reclaim_hold)
	Idle         int      `json:"idle"`
	Busy         int      `json:"busy"`
	InFlight     int      `json:"in_flight"`
	Pending      int      `json:"pending"`
	Waiting      int      `json:"waiting"`
	Created      uint64   `json:"created"`
	ReusedLocal  uint64   `json:"reused_local"`
	ReusedRemote uint64   `json:"reused_remote"`
	Accepted     uint64   `json:"accepted"`
	Aged         uint64   `json:"aged"`
	Waits        uint64   `json:"waits"`
	WaitTimeouts uint64   `json:"wait_timeouts"`
	WaitSeconds  float64  `json:"wait_seconds"`
}

// NodeView is this process's own forwarding counters.
type NodeView struct {
	OwnedConnections int    `json:"owned_connections"`
	Created          uint64 `json:"created"`
	ReusedLocal      uint64 `json:"reused_local"`
	ReusedRemote     uint64 `json:"reused_remote"`
	ServedRemote     uint64 `json:"served_remote"`
	SplicedBodies    uint64 `json:"spliced_bodies"`
	LeasesRefused    uint64 `json:"leases_refused"`
	Retired          uint64 `json:"retired"`
	Rebalanced       uint64 `json:"rebalanced"`
	DialsPassed      uint64 `json:"dials_passed"`
	DialsHeld        uint64 `json:"dials_held"`
	RelayDials       uint64 `json:"relay_dials"`
	UpstreamRefused  uint64 `json:"upstream_refused"`
	// IdleBeforeReuseSeconds over IdleReuses is the mean time a
	// connection sat idle between exchanges (see
	// proxy.NodeStats.IdleBeforeReuse).
	IdleBeforeReuseSeconds float64 `json:"idle_before_reuse_seconds"`
	IdleReuses             uint64  `json:"idle_reuses"`
	Retries                uint64  `json:"retries"`
	IdlePeerStreams        int     `json:"idle_peer_streams"`
}

func serveFleetTable(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed", r.Method)}
	}
	table, err := readFleetTable()
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "\t")
	return enc.Encode(table)
}

func readFleetTable() (FleetTable, error) {
	out := FleetTable{PID: os.Getpid(), Fleets: []FleetView{}}
	fls := openFleets()
	sort.Slice(fls, func(i, j int) bool { return fls[i].opened.Before(fls[j].opened) })
	for _, f := range fls {
		v, err := f.view()
		if err != nil {
			return out, fmt.Errorf("reading the pool table of %s: %w", f.cfg.Segment, err)
		}
		out.Fleets = append(out.Fleets, v)
	}
	return out, nil
}

func (f *fleet) view() (FleetView, error) {
	snap, err := f.pool.Snapshot()
	if err != nil {
		return FleetView{}, err
	}
	v := FleetView{
		Segment:         f.cfg.Segment,
		SocketDir:       f.cfg.SocketDir,
		Lane:            f.pool.Lane(),
		Processes:       snap.Spec.Lanes,
		Keys:            snap.Spec.Keys,
		ConnsPerProcess: snap.Spec.ResourcesPerLane,
		Members:         []MemberView{},
		Upstreams:       []UpstreamView{},
		Joined:          f.opened,
	}
	for _, l := range snap.Lanes {
		v.Members = append(v.Members, MemberView{
			Lane:        l.Lane,
			PID:         l.PID,
			Self:        l.Local,
			Started:     l.Started,
			Heartbeat:   l.Heartbeat,
			Connections: l.Resources,
		})
	}
	for _, ks := range snap.Keys {
		v.Upstreams = append(v.Upstreams, UpstreamView{
			Key:          ks.Key.String(),
			Upstreams:    f.names.of(ks.Key),
			Live:         ks.Live,
			Dialing:      ks.Creating,
			Held:         ks.Held,
			Idle:         ks.Idle,
			Busy:         ks.Busy,
			InFlight:     ks.InUse,
			Pending:      ks.Pending,
			Waiting:      ks.Waiting,
			Created:      ks.Created,
			ReusedLocal:  ks.ReusedLocal,
			ReusedRemote: ks.ReusedRemote,
			Accepted:     ks.Accepted,
			Aged:         ks.Aged,
			Waits:        ks.Waits,
			WaitTimeouts: ks.Timeouts,
			WaitSeconds:  ks.WaitTime.Seconds(),
		})
	}
	st := f.node.Stats()
	v.Node = NodeView{
		OwnedConnections:       st.OpenConns,
		Created:                st.Created,
		ReusedLocal:            st.ReusedLocal,
		ReusedRemote:           st.ReusedRemote,
		ServedRemote:           st.ServedRemote,
		SplicedBodies:          st.SplicedBodies,
		LeasesRefused:          st.Refused,
		Retired:                st.Retired,
		Rebalanced:             st.Rebalanced,
		DialsPassed:            st.DialsPassed,
		DialsHeld:              st.DialsHeld,
		RelayDials:             st.RelayDials,
		UpstreamRefused:        st.UpstreamRefused,
		IdleBeforeReuseSeconds: st.IdleBeforeReuse.Seconds(),
		IdleReuses:             st.IdleReuses,
		Retries:                st.Retries,
		IdlePeerStreams:        st.IdlePeerConns,
	}
	return v, nil
}

// Interface guards
var _ caddy.AdminRouter = (*adminAPI)(nil)
