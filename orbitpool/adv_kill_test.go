package orbitpool

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

var (
	advKeyShared = Key{0xadc, 1} // the parent's resources, reserved by children
	advKeyChurn  = Key{0xadc, 2} // created, used and removed by children under a budget
	advChurnLim  = Limits{MaxResources: 4, MaxCreating: 2}
)

// advRoleKillee does everything at once from 6 goroutines until killed:
// churn a budgeted key (Acquire/create/register/unregister/abandon), reserve
// the parent's resources and leave the leases for the parent to find, park
// on the parent's key with short deadlines.
func advRoleKillee(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	var ops atomic.Int64
	for g := range 6 {
		go func() {
			rng := rand.New(rand.NewPCG(c.args.Seed, uint64(g)))
			for {
				switch rng.IntN(4) {
				case 0, 1:
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(2000))*time.Microsecond)
					plan, err := p.Acquire(ctx, advKeyChurn, LocalFirst{}, advChurnLim)
					cancel()
					if err == nil {
						switch plan.Kind {
						case PlanCreate:
							if rng.IntN(3) == 0 {
								plan.Permit.Close()
							} else if e, err := plan.Permit.RegisterAndAccept(1 + rng.IntN(2)); err == nil {
								e.Complete()
								if rng.IntN(2) == 0 {
									p.Unregister(e.ID())
								}
							}
						case PlanReuseLocal:
							plan.Execution.Complete()
							if rng.IntN(3) == 0 {
								p.Unregister(plan.Execution.ID())
							}
						case PlanReuseRemote:
							// never presented: the owner drops it
						}
					}
				case 2:
					for _, id := range c.args.IDs {
						p.Reserve(id) // left for the parent to accept or drop
					}
				default:
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(3000))*time.Microsecond)
					plan, err := p.Acquire(ctx, advKeyShared, LocalFirst{}, Limits{MaxResources: 1})
					cancel()
					if err == nil && plan.Kind == PlanCreate {
						plan.Permit.Close()
					}
				}
				ops.Add(1)
			}
		}()
	}
	for ops.Load() < 500 {
		time.Sleep(time.Millisecond)
	}
	c.send(mpMsg{Type: "ready", Lane: p.Lane(), PID: os.Getpid()})
	c.untilParentLeaves()
	return nil
}

// TestAdvRandomKillsSettle: two children do everything at once and are
// SIGKILLed at random instants, round after round, while the parent accepts
// the leases it finds on its resources and checks capacity and budget at
// every instant. When the last child is gone and reservations have aged:
// nothing in use, pending, creating or waiting, and every key's counters
// agree with the slots.
func TestAdvRandomKillsSettle(t *testing.T) { randomKillsSettle(t, 0, false) }

// TestAdvRandomKillsSettleWithHold: the same, with every process holding
// the budget of the dead lanes it reclaims for 30ms (Options.ReclaimHold),
// and so dying, as often as not, with units of the dead held in its lane:
// the budget holds at every instant, and all is given back in the end.
func TestAdvRandomKillsSettleWithHold(t *testing.T) { randomKillsSettle(t, 30*time.Millisecond, false) }

// TestAdvRandomKillsSettleWithLingeringHolds: the same, with every process
// told that 0 to 2 of a key's connections linger, at random, each time a
// hold ends (SetLingering), so that holds last on, unevenly, through the
// kills of their holders; once nothing lingers, all is given back.
func TestAdvRandomKillsSettleWithLingeringHolds(t *testing.T) {
	randomKillsSettle(t, 30*time.Millisecond, true)
}

func randomKillsSettle(t *testing.T, hold time.Duration, linger bool) {
	opts := Options{ReconcileInterval: 10 * time.Millisecond, ReservationTimeout: 100 * time.Millisecond, ReclaimHold: hold}
	p, spec := mpOpenParent(t, opts)
	var settling atomic.Bool
	var asked atomic.Int64
	if linger {
		p.SetLingering(func(Key) int {
			if settling.Load() {
				return 0
			}
			asked.Add(1)
			return rand.IntN(3)
		})
	}
	var ids []ResourceID
	for range 3 {
		id, err := p.Register(advKeyShared, 2)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	s := p.seg
	stop := make(chan struct{})
	done := make(chan struct{})
	var bad atomic.Value
	var accepted atomic.Int64
	var sawHeld atomic.Bool
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, id := range ids {
				off := s.slotOff(id.Lane(), id.Slot())
				w := atomic.LoadUint64(s.u64(off + slWord))
				for b := range PendingReservations {
					tk := atomic.LoadUint64(s.u64(off + slTickets + 8*b))
					if tk != 0 && w&(1<<b) != 0 && tk%3 != 0 { // a third never presented
						if e, err := p.Accept(Lease{ID: id, Owner: p.Incarnation(), Ticket: tk, Bit: uint8(b)}); err == nil {
							accepted.Add(1)
							e.Complete()
						}
					}
				}
			}
			// Every live slot of every lane: in use + pending <= capacity.
			for l := range s.l.nlanes {
				for i := range s.l.perLane {
					off := s.slotOff(l, i)
					w := atomic.LoadUint64(s.u64(off + slWord))
					c := int(atomic.LoadUint32(s.u32(off + slCapacity)))
					w2 := atomic.LoadUint64(s.u64(off + slWord))
					if wState(w) == StateLive && w == w2 && wUse(w)+wPendN(w) > c {
						bad.Store(fmt.Sprintf("slot %d/%d word %#x: in use %d + pending %d > capacity %d", l, i, w, wUse(w), wPendN(w), c))
					}
				}
			}
			ks := keyStats(t, p, advKeyChurn)
			if ks.Live+ks.Held+ks.Creating > advChurnLim.MaxResources || ks.Creating > advChurnLim.MaxCreating {
				bad.Store(fmt.Sprintf("churn key over its budget: %+v", ks))
			}
			if ks.Held > 0 {
				sawHeld.Store(true)
			}
		}
	}()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
			<-done
		}
	}()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 5))
	rounds := mpScale(20, 6)
	args := mpArgs{Spec: spec, Reconcile: 10 * time.Millisecond, ResTimeout: 100 * time.Millisecond, Hold: hold, Linger: linger, IDs: ids, Lifetime: 60 * time.Second}
	killRounds(t, p, "adv-killee", args, rounds, rng, 20*time.Millisecond, func(round int) {
		if v := bad.Load(); v != nil {
			t.Fatalf("round %d: %v", round, v)
		}
	})
	settling.Store(true)
	close(stop)
	<-done
	if v := bad.Load(); v != nil {
		t.Fatal(v)
	}
	// Settle: reservations of dead reservers drop at once, others age.
	snap, ok := mpWaitSnap(p, 3*time.Second, func(s Snapshot) bool {
		sh, ch := mpKS(s, advKeyShared), mpKS(s, advKeyChurn)
		return sh.InUse == 0 && sh.Pending == 0 && sh.Waiting == 0 && sh.Held == 0 && ch.Live == 0 && ch.Held == 0 && ch.Creating == 0 && ch.Waiting == 0 && ch.InUse == 0
	})
	if !ok {
		t.Fatalf("after %d rounds of kills the table did not settle: shared %+v; churn %+v", rounds, mpKS(snap, advKeyShared), mpKS(snap, advKeyChurn))
	}
	for k := range s.l.nkeys {
		c := atomic.LoadUint64(s.u64(s.keyOff(k) + kfCtl))
		if kState(c) != keyLive {
			continue
		}
		total, creating := 0, 0
		for l := range s.l.nlanes {
			if lnState(atomic.LoadUint64(s.u64(s.laneOff(l)+lnCtl))) != laneLive {
				continue
			}
			for i := range s.l.perLane {
				off := s.slotOff(l, i)
				st := wState(atomic.LoadUint64(s.u64(off + slWord)))
				if kk, kg, ok := p.slotKey(off); ok && kk == k && kg == kGen(c) && (st == StateLive || st == StateCreating) {
					total++
					if st == StateCreating {
						creating++
					}
				}
			}
		}
		if kTotal(c) != total || kCreating(c) != creating {
			t.Errorf("key entry %d counts %d total, %d creating; its slots hold %d and %d", k, kTotal(c), kCreating(c), total, creating)
		}
	}
	if linger && asked.Load() == 0 {
		t.Errorf("in %d rounds of kills, no hold of the parent's ended to ask what lingers", rounds)
	}
	if hold > 0 && !sawHeld.Load() {
		t.Errorf("in %d rounds of kills, no unit of the churn key was ever seen held", rounds)
	}
	t.Logf("%d rounds of 2 kills; %d leases accepted", rounds, accepted.Load())
}

// killRounds runs rounds of two children in role, started with args (each
// with its own seed). Once both are ready it waits up to lead, SIGKILLs them
// a few milliseconds apart, and waits for their lanes to be reclaimed; then
// after, if set, checks the round.
func killRounds(t *testing.T, p *Pool, role string, args mpArgs, rounds int, rng *rand.Rand, lead time.Duration, after func(round int)) {
	t.Helper()
	for round := range rounds {
		var cs []*mpChild
		for i := range 2 {
			a := args
			a.Seed = uint64(round*2 + i + 1)
			cs = append(cs, mpStart(t, role, a))
		}
		var pids []int
		for _, c := range cs {
			pids = append(pids, c.expect("ready", 30*time.Second).PID)
		}
		time.Sleep(time.Duration(rng.Int64N(int64(lead))))
		for _, c := range cs {
			c.kill()
			time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
		}
		if _, ok := mpWaitSnap(p, 3*time.Second, func(s Snapshot) bool {
			return !slices.ContainsFunc(s.Lanes, func(l LaneInfo) bool { return slices.Contains(pids, l.PID) })
		}); !ok {
			t.Fatalf("round %d: killed lanes not reclaimed in 3s", round)
		}
		if after != nil {
			after(round)
		}
	}
}
