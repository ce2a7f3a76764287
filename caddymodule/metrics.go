package caddymodule

import (
	"errors"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

const (
	metricsNamespace = "caddy"
	metricsSubsystem = "orbit_pool"
)

// waitObserver records one request's wait.
type waitObserver interface{ Observe(float64) }

// localMetrics are what this process saw of its own requests. They are
// process-wide, so that they survive config reloads, and registered in each
// config's registry.
var localMetrics = struct {
	refused   *prometheus.CounterVec
	wait      *prometheus.HistogramVec
	deadlines *prometheus.CounterVec
}{
	deadlines: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: metricsNamespace,
		Subsystem: metricsSubsystem,
		Name:      "deadlines_total",
		Help:      "Requests through orbit_pool transports by where their deadline came from: context, header, timeout, write_timeout, or none.",
	}, []string{"source"}),
	refused: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: metricsNamespace,
		Subsystem: metricsSubsystem,
		Name:      "refused_total",
		Help:      "Requests this process refused instead of sending them upstream, by upstream and reason (saturated, draining, deadline_near, deadline_elapsed, client_canceled, busy, budget, creating, wait_timeout, policy, admission, owner_busy, table_full).",
	}, []string{"upstream", "reason"}),
	wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: metricsNamespace,
		Subsystem: metricsSubsystem,
		Name:      "wait_duration_seconds",
		Help:      "Time a request of this process took to get its upstream connection: back-pressure permit, pool wait, for a new connection the dial, and for a sibling's connection the sibling's wait for a worker.",
		Buckets:   []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"upstream"}),
}

// deadlineCounts is deadlines_total's counter for each deadline source, so
// that counting a request does not look its label up: that lookup cost more
// than the count. Every source's series is there from the start, at 0.
var deadlineCounts = func() map[string]prometheus.Counter {
	m := make(map[string]prometheus.Counter)
	for _, src := range []string{DeadlineNone, DeadlineContext, DeadlineHeader, DeadlineTimeout, DeadlineWriteTimeout} {
		m[src] = localMetrics.deadlines.WithLabelValues(src)
	}
	return m
}()

// countDeadline counts a request under its deadline's source.
func countDeadline(src string) {
	if c, ok := deadlineCounts[src]; ok {
		c.Inc()
		return
	}
	localMetrics.deadlines.WithLabelValues(src).Inc()
}

// registerMetrics registers the app's collectors in the config's registry.
// A registry that has them already (the app provisioned twice in one
// context) keeps the ones it has.
func registerMetrics(ctx caddy.Context, a *App) {
	reg := ctx.GetMetricsRegistry()
	if reg == nil {
		return
	}
	for _, c := range []prometheus.Collector{localMetrics.refused, localMetrics.wait, localMetrics.deadlines, &tableCollector{app: a}} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				a.logger.Error("registering metrics", zap.Error(err))
			}
		}
	}
}

func newDesc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(metricsNamespace, metricsSubsystem, name), help, labels, nil)
}

// newFleetDesc describes a fleet-wide metric: every worker reads it from the
// one shared table and reports the same value, so its name says fleet_ and it
// must not be summed over workers (take max). The other metrics are each
// process's own and sum over workers.
func newFleetDesc(name, help string, labels ...string) *prometheus.Desc {
	return newDesc("fleet_"+name, help+" Fleet-wide: every process reports the same value; do not sum over processes.", labels...)
}

// Descriptions of the metrics read from the shared table at scrape time.
// Gauges are the fleet's state now; counters are summed over every process
// of the fleet since the upstream's table entry was made (a new fleet starts
// from zero unless keep_segment kept the last fleet's table).
var (
	descProcesses   = newFleetDesc("processes", "Processes that are members of the fleet.")
	descUpstream    = newDesc("upstream_info", "The upstream a pool key stands for.", "key", "upstream")
	descLive        = newFleetDesc("connections", "Open upstream connections across the fleet.", "key")
	descDialing     = newFleetDesc("connections_dialing", "Upstream connections being dialed across the fleet.", "key")
	descHeld        = newFleetDesc("connections_held", "Connections of dead processes still counted against the connection cap until reclaim_hold ends.", "key")
	descIdle        = newFleetDesc("connections_idle", "Open upstream connections with no request on them.", "key")
	descBusy        = newFleetDesc("connections_busy", "Open upstream connections with a request on them or reserved.", "key")
	descInUse       = newFleetDesc("requests_in_flight", "Requests using upstream connections across the fleet.", "key")
	descPending     = newFleetDesc("reservations_pending", "Reservations on connections not yet taken up by their owner.", "key")
	descWaiting     = newFleetDesc("requests_waiting", "Requests waiting across the fleet for a connection to come free.", "key")
	descCreated     = newFleetDesc("connections_created_total", "Upstream connections dialed and shared.", "key")
	descReused      = newFleetDesc("reused_total", "Requests that reused an open connection, of their own process (local) or a sibling's (remote).", "key", "where")
	descAccepted    = newFleetDesc("leases_accepted_total", "Reservations taken up by the connection's owner.", "key")
	descAged        = newFleetDesc("reservations_aged_total", "Reservations dropped because they were never taken up.", "key")
	descWaits       = newFleetDesc("waits_total", "Requests that waited for a connection and got one.", "key")
	descTimeouts    = newFleetDesc("wait_timeouts_total", "Requests that waited for a connection and gave up.", "key")
	descWaitSeconds = newFleetDesc("wait_seconds_total", "Total time requests spent waiting for a connection, including the time a connection's owner held a sibling's request waiting for a worker, served or refused.", "key")

	descOwned           = newDesc("owned_connections", "Upstream connections this process owns.")
	descServedRemote    = newDesc("served_remote_total", "Siblings' requests this process forwarded on its connections.")
	descSpliced         = newDesc("bodies_spliced_total", "Siblings' response bodies this process moved from an upstream connection to the sibling's stream with splice(2), without copying them through its memory.")
	descLeaseRefused    = newDesc("leases_refused_total", "Siblings' reservations this process refused, by reason: stale, gone (the connection closed), closing (this process is leaving), deadline (passed or too near), busy (no worker of the budget in time, or an HTTP/2 connection full), admission (the admission backstop), other.", "reason")
	descRetired         = newDesc("connections_retired_total", "Upstream connections this process closed.")
	descEvicted         = newDesc("connections_evicted_total", "Idle upstream connections this process closed to make room in the fleet's full table for another upstream's, the one idle longest first.")
	descUnpooled        = newDesc("unpooled_requests_total", "Requests this process sent on a connection of its own outside the fleet's table, which had no room for another (raise conns_per_process or keys): such a connection is kept idle for this process's next such request, and not shared with its siblings.")
	descRebalanced      = newDesc("connections_rebalanced_total", "Connections of a capped upstream this process closed because it held at least two more of them than a sibling waiting for one, so that the sibling dials the replacement.")
	descDialsHeld       = newDesc("dials_held_total", "Dials of a capped upstream's connections this process held back for a moment, holding its share of them already, so that a sibling about to wait for one could dial it instead.")
	descRelayDials      = newDesc("relay_dials_total", "Connections of an uncapped HTTP/1.1 upstream this process dialed because it kept relaying the upstream's requests through siblings' connections, which may then sit idle until they time out.")
	descUpstreamRefused = newDesc("upstream_refused_total", "New connections of a capped upstream that it closed at once, before answering their first request, while it still held connections the fleet had closed before it let them go: each one's share of the cap stays held while the upstream still holds those, and a replayable request on it is sent again.")
	descDialsPassed     = newDesc("dials_passed_total", "Dials of a capped upstream's connections this process left to a sibling waiting for one while holding fewer, which dialed in its place: what a rebalancing move does, without closing a connection.")
	descIdleBeforeReuse = newDesc("idle_before_reuse_seconds", "Time this process's HTTP/1.1 upstream connections sat idle between an exchange's end and the next one taking them. Under a cap, with requests waiting, it is how long the fleet takes to hand a connection on.")
	descRetries         = newDesc("retries_total", "Requests this process sent again after a failure that reached no upstream.")
	descBudgetWorkers   = newDesc("budget_workers", "The process budget's workers (the app's workers): the most exchanges, own and siblings', that run at once.")
	descBudgetInUse     = newDesc("budget_workers_in_use", "Workers of the process budget held by running exchanges, own and siblings'; an exchange with a large body may hold more than one.")
	descBudgetMemory    = newDesc("budget_memory_limit_bytes", "The process budget's memory limit (the app's memory_limit) for exchange buffers.")
	descBudgetReserved  = newDesc("budget_memory_reserved_bytes", "Exchange buffer memory charged to the process budget now; it can exceed the limit by one buffer per exchange, the price of never refusing an exchange its first buffer.")
	descPermits         = newDesc("permits", "The back-pressure cap (the app's max_in_flight).")
	descPermitsInUse    = newDesc("permits_in_use", "Back-pressure permits held by requests of this process now.")
	descAdmission       = newDesc("admission_ceiling", "The admission backstop's ceiling (the app's admission_ceiling): connections owned and being dialed, or siblings' exchanges running, at which new ones are refused.")
	descDialsRefused    = newDesc("dials_not_admitted_total", "New upstream connections the admission backstop refused to dial.")
	descLeakedGuards    = newDesc("leaked_guards_total", "What this process held and let the garbage collector find without releasing it, and gave back then: a bug. By kind: connection (connection uses and dial permits), permit (back-pressure permits), budget (budget leases, each of one or more workers); each is logged when it happens.", "kind")
)

// tableCollector reads the fleet's table when scraped.
type tableCollector struct{ app *App }

func (c *tableCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		descProcesses, descUpstream, descLive, descDialing, descHeld, descIdle, descBusy, descInUse,
		descPending, descWaiting, descCreated, descReused, descAccepted, descAged, descWaits,
		descTimeouts, descWaitSeconds, descOwned, descServedRemote, descSpliced, descLeaseRefused,
		descRetired, descEvicted, descUnpooled, descRebalanced, descDialsPassed, descDialsHeld, descRelayDials, descUpstreamRefused, descIdleBeforeReuse, descRetries, descLeakedGuards, descBudgetWorkers, descBudgetInUse,
		descBudgetMemory, descBudgetReserved, descPermits, descPermitsInUse, descAdmission,
		descDialsRefused,
	} {
		ch <- d
	}
}

func (c *tableCollector) Collect(ch chan<- prometheus.Metric) {
	f := c.app.currentFleet()
	if f == nil {
		return
	}
	snap, err := f.pool.Snapshot()
	if err != nil {
		f.logger().Error("reading the pool table for metrics", zap.Error(err))
		return
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	gauge(descProcesses, float64(len(snap.Lanes)))
	for _, ks := range snap.Keys {
		k := ks.Key.String()
		for _, name := range f.names.of(ks.Key) {
			gauge(descUpstream, 1, k, name)
		}
		gauge(descLive, float64(ks.Live), k)
		gauge(descDialing, float64(ks.Creating), k)
		gauge(descHeld, float64(ks.Held), k)
		gauge(descIdle, float64(ks.Idle), k)
		gauge(descBusy, float64(ks.Busy), k)
		gauge(descInUse, float64(ks.InUse), k)
		gauge(descPending, float64(ks.Pending), k)
		gauge(descWaiting, float64(ks.Waiting), k)
		counter(descCreated, float64(ks.Created), k)
		counter(descReused, float64(ks.ReusedLocal), k, "local")
		counter(descReused, float64(ks.ReusedRemote), k, "remote")
		counter(descAccepted, float64(ks.Accepted), k)
		counter(descAged, float64(ks.Aged), k)
		counter(descWaits, float64(ks.Waits), k)
		counter(descTimeouts, float64(ks.Timeouts), k)
		counter(descWaitSeconds, ks.WaitTime.Seconds(), k)
	}
	st := f.node.Stats()
	gauge(descOwned, float64(st.OpenConns))
	counter(descServedRemote, float64(st.ServedRemote))
	counter(descSpliced, float64(st.SplicedBodies))
	for _, reason := range []string{"stale", "gone", "closing", "deadline", "busy", "admission", "other"} {
		counter(descLeaseRefused, float64(st.RefusedBy[reason]), reason)
	}
	counter(descDialsRefused, float64(st.DialsNotAdmitted))
	gauge(descBudgetWorkers, float64(f.gov.Workers()))
	gauge(descBudgetInUse, float64(f.gov.Outstanding()))
	gauge(descBudgetMemory, float64(f.gov.MemoryLimit()))
	gauge(descBudgetReserved, float64(f.gov.ReservedBytes()))
	gauge(descPermits, float64(f.limiter.MaxConcurrent()))
	gauge(descPermitsInUse, float64(f.limiter.Active()))
	gauge(descAdmission, float64(f.adm.Ceiling()))
	counter(descRetired, float64(st.Retired))
	counter(descEvicted, float64(st.Evicted))
	counter(descUnpooled, float64(st.Unpooled))
	counter(descRebalanced, float64(st.Rebalanced))
	counter(descDialsPassed, float64(st.DialsPassed))
	counter(descDialsHeld, float64(st.DialsHeld))
	counter(descRelayDials, float64(st.RelayDials))
	counter(descUpstreamRefused, float64(st.UpstreamRefused))
	ch <- prometheus.MustNewConstSummary(descIdleBeforeReuse, st.IdleReuses, st.IdleBeforeReuse.Seconds(), nil)
	counter(descRetries, float64(st.Retries))
	counter(descLeakedGuards, float64(f.pool.LeakedGuards()), "connection")
	counter(descLeakedGuards, float64(f.limiter.Leaked()), "permit")
	counter(descLeakedGuards, float64(f.gov.Leaked()), "budget")
}

// Interface guards
var _ prometheus.Collector = (*tableCollector)(nil)
