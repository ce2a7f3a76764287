package orbitpool

// View is what a Policy decides on: a key's candidates as the fleet sees them
// and the state of its creation budget.
type View struct {
	Key        Key
	Candidates []Candidate
	// Total is the key's live plus in-progress resources across the fleet;
	// Creating is the in-progress part.
	Total, Creating int
	Limits          Limits
}

// CanCreate reports whether the key's budget has room for one more creation.
func (v *View) CanCreate() bool {
	return (v.Limits.MaxResources <= 0 || v.Total < v.Limits.MaxResources) &&
		(v.Limits.MaxCreating <= 0 || v.Creating < v.Limits.MaxCreating)
}

// Budget names why creation is not possible, or ReasonNone.
func (v *View) budgetReason() Reason {
	switch {
	case v.Limits.MaxResources > 0 && v.Total >= v.Limits.MaxResources:
		return ReasonBudget
	case v.Limits.MaxCreating > 0 && v.Creating >= v.Limits.MaxCreating:
		return ReasonCreating
	}
	return ReasonNone
}

// Action is what a policy wants done next.
type Action uint8

// Actions.
const (
	ActionWait   Action = iota // park until capacity returns
	ActionReuse                // reserve Decision.Candidate
	ActionCreate               // claim creation budget
	ActionRefuse               // fail now with Decision.Reason
)

// Decision is a policy's answer for one step of Acquire.
type Decision struct {
	Action Action
	// Candidate indexes View.Candidates for ActionReuse.
	Candidate int
	// Reason says why the request is not served now (ActionWait and
	// ActionRefuse), for logs and metrics.
	Reason Reason
}

// Reason is why a policy would not serve a request now.
type Reason uint8

// Reasons.
const (
	ReasonNone     Reason = iota
	ReasonBusy            // every candidate is at capacity
	ReasonBudget          // the key's creation budget is used up
	ReasonCreating        // the key's concurrent creations are at their limit
	ReasonPolicy          // the policy declined
)

func (r Reason) String() string {
	switch r {
	case ReasonNone:
		return "none"
	case ReasonBusy:
		return "busy"
	case ReasonBudget:
		return "budget"
	case ReasonCreating:
		return "creating"
	case ReasonPolicy:
		return "policy"
	}
	return "unknown"
}

// Policy picks what Acquire does next. Decide may be called several times for
// one acquisition, with candidates that turned out busy marked full; it must
// not block. Which candidate wins is the embedder's choice: the pool decides
// nothing on its own. A waiter whose policy declines the room it was handed
// (LocalOnly, handed a sibling's resource) keeps its place in the key's
// queue, and younger waiters wait behind it until its acquisition ends.
type Policy interface {
	Decide(v *View) Decision
}

// LocalFirst is the starting policy: a local resource with room, else a remote
// one with room (least loaded first), else create within the budget, else
// wait. No number from any benchmark is built in; whether remote reuse beats
// creating a resource is for the embedder to measure and encode in its own
// policy.
type LocalFirst struct{}

// Decide implements Policy.
func (LocalFirst) Decide(v *View) Decision { return decide(v, true) }

// LocalOnly never leaves this process: local reuse, else create, else wait.
// Remote candidates are invisible to it even when they exist.
type LocalOnly struct{}

// Decide implements Policy.
func (LocalOnly) Decide(v *View) Decision { return decide(v, false) }

// CreateBeforeRemote is LocalFirst with creation ahead of a sibling's
// resource: a local resource with room, else create within the budget, else
// a remote one with room, else wait. It is for work whose every byte a
// sibling would have to relay (a large body), when that costs more than a
// new resource does.
type CreateBeforeRemote struct{}

// Decide implements Policy.
func (CreateBeforeRemote) Decide(v *View) Decision {
	if leastLoaded(v.Candidates, true) < 0 && v.CanCreate() {
		return Decision{Action: ActionCreate}
	}
	return decide(v, true)
}

func decide(v *View, remote bool) Decision {
	if i := leastLoaded(v.Candidates, true); i >= 0 {
		return Decision{Action: ActionReuse, Candidate: i}
	}
	if remote {
		if i := leastLoaded(v.Candidates, false); i >= 0 {
			return Decision{Action: ActionReuse, Candidate: i}
		}
	}
	if v.CanCreate() {
		return Decision{Action: ActionCreate}
	}
	r := v.budgetReason()
	if r == ReasonBudget && (len(v.Candidates) > 0 || v.Total > v.Creating) {
		r = ReasonBusy
	}
	return Decision{Action: ActionWait, Reason: r}
}

// leastLoaded is the candidate with room and the fewest users, local or not.
func leastLoaded(cs []Candidate, local bool) int {
	best, load := -1, 0
	for i, c := range cs {
		if c.Local != local || c.State != StateLive || c.Room() == 0 {
			continue
		}
		if l := c.InUse + c.Pending; best < 0 || l < load {
			best, load = i, l
		}
	}
	return best
}
