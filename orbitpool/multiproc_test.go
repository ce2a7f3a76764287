package orbitpool

// Multi-process tests: the test binary re-executes itself as child processes
// that share one segment file. A child is started with ORBITPOOL_MP_CHILD set to
// its role and its parameters as JSON in ORBITPOOL_MP_ARGS; init runs the role
// and exits before the testing framework starts. Parent and child speak JSON
// lines: commands on the child's stdin, replies on its stdout. A child leaves
// when its stdin closes, and by itself after mpArgs.Lifetime in case its parent
// was killed; the parent SIGKILLs every child it started in t.Cleanup.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const (
	mpEnvRole = "ORBITPOOL_MP_CHILD"
	mpEnvArgs = "ORBITPOOL_MP_ARGS"
)

func init() {
	if role := os.Getenv(mpEnvRole); role != "" {
		os.Exit(mpChildMain(role))
	}
}

// mpSpec is the table the multi-process tests share: room for the children,
// the parent and a joiner, a few keys each.
var mpSpec = PoolSpec{Lanes: 8, Keys: 32, ResourcesPerLane: 32}

// Keys of the multi-process tests, one set per test.
var (
	mpKeyShared = Key{Hi: 0x6d70, Lo: 1}  // stress: fixed resources, never churned
	mpKeyChurn  = Key{Hi: 0x6d70, Lo: 2}  // stress: created, used and removed under a budget
	mpKeyChurn2 = Key{Hi: 0x6d70, Lo: 12} // stress: the same, so that slots move between the two keys
	mpKeyWake   = Key{Hi: 0x6d70, Lo: 3}
	mpKeyRS     = Key{Hi: 0x6d70, Lo: 4} // kill test: the parent's resource the victim reserves
	mpKeyVOwn   = Key{Hi: 0x6d70, Lo: 5} // kill test: the victim's own resource
	mpKeyVPerm  = Key{Hi: 0x6d70, Lo: 6} // kill test: the victim's creation permits
	mpKeyRSS    = Key{Hi: 0x6d70, Lo: 7} // kill test: the surviving child's resource the victim reserves
	mpKeyJoin   = Key{Hi: 0x6d70, Lo: 8}
	mpKeyCreat  = Key{Hi: 0x6d70, Lo: 9}
	mpKeyKilled = Key{Hi: 0x6d70, Lo: 10}
	mpKeyLease  = Key{Hi: 0x6d70, Lo: 11}
)

var (
	mpChurnLimits = Limits{MaxResources: 3, MaxCreating: 1}
	mpPermLimits  = Limits{MaxResources: 2, MaxCreating: 2}
)

// mpScale picks the full value, or the reduced one under -short or -race.
func mpScale[T ~int | ~int64](full, reduced T) T {
	if testing.Short() || mpRace {
		return reduced
	}
	return full
}

// mpMono reads CLOCK_MONOTONIC, which is system-wide: readings from two
// processes can be subtracted (time.Now's monotonic part cannot).
func mpMono() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return ts.Nano()
}

// mpArgs are a child's parameters.
type mpArgs struct {
	Spec       PoolSpec
	Reconcile  time.Duration
	ResTimeout time.Duration
	Dir        string // where children's unix sockets live
	Workers    int
	N          int
	Seed       uint64
	Key        Key
	Cap        int
	IDs        []ResourceID
	Peer       int // a sibling child's lane
	Dur        time.Duration
	Lifetime   time.Duration // the child exits by itself after this long
	Window     uint32        // Options.OrderWindow
	Hold       time.Duration // Options.ReclaimHold
	Linger     bool          // SetLingering: 0 to 2 lingering, at random
}

// mpMsg is one line of the protocol, in either direction.
type mpMsg struct {
	Type   string        `json:"type"`
	Lane   int           `json:"lane,omitempty"`
	PID    int           `json:"pid,omitempty"`
	Lanes  []int         `json:"lanes,omitempty"`
	IDs    []ResourceID  `json:"ids,omitempty"`
	Lease  []byte        `json:"lease,omitempty"`
	Kind   PlanKind      `json:"kind,omitempty"`
	Waited time.Duration `json:"waited,omitempty"`
	N      int           `json:"n,omitempty"`
	T      int64         `json:"t,omitempty"`
	T2     int64         `json:"t2,omitempty"`
	Nanos  []int64       `json:"nanos,omitempty"`
	Stats  *mpStats      `json:"stats,omitempty"`
	Err    string        `json:"err,omitempty"`
}

// ---- child side ----

// mpChildCtx is a child's end of the protocol.
type mpChildCtx struct {
	role string
	args mpArgs
	mu   sync.Mutex
	out  *json.Encoder
	cmds chan mpMsg
}

func mpRoleFunc(role string) func(*mpChildCtx) error {
	switch role {
	case "stress":
		return mpRoleStress
	case "waiter":
		return mpRoleWaiter
	case "victim":
		return mpRoleVictim
	case "survivor":
		return mpRoleSurvivor
	case "holder":
		return mpRoleHolder
	case "joiner":
		return mpRoleJoiner
	case "creator":
		return mpRoleCreator
	case "idle":
		return mpRoleIdle
	case "churner":
		return mpRoleChurner
	case "acceptor":
		return mpRoleAcceptor
	case "bench-owner":
		return mpRoleBenchOwner
	case "bench-remote":
		return mpRoleBenchRemote
	case "bench-ping":
		return mpRoleBenchPing
	case "bench-pong":
		return mpRoleBenchPong
	case "struct-churn":
		return mpRoleStructChurn
	case "capacity-taker":
		return mpRoleCapacityTaker
	case "capacity-window":
		return mpRoleCapacityWindow
	}
	return mpMoreRoles[role]
}

// mpMoreRoles are roles that test files other than this one add.
var mpMoreRoles = map[string]func(*mpChildCtx) error{}

func mpChildMain(role string) int {
	var a mpArgs
	if err := json.Unmarshal([]byte(os.Getenv(mpEnvArgs)), &a); err != nil {
		fmt.Fprintf(os.Stderr, "orbitpool test child %s: bad %s: %v\n", role, mpEnvArgs, err)
		return 2
	}
	f := mpRoleFunc(role)
	if f == nil {
		fmt.Fprintf(os.Stderr, "orbitpool test child: unknown role %q\n", role)
		return 2
	}
	if a.Lifetime <= 0 {
		a.Lifetime = 2 * time.Minute
	}
	time.AfterFunc(a.Lifetime, func() {
		fmt.Fprintf(os.Stderr, "orbitpool test child %s: still running after %v, leaving\n", role, a.Lifetime)
		os.Exit(3)
	})
	c := &mpChildCtx{role: role, args: a, out: json.NewEncoder(os.Stdout), cmds: make(chan mpMsg, 16)}
	go func() {
		dec := json.NewDecoder(os.Stdin)
		for {
			var m mpMsg
			if err := dec.Decode(&m); err != nil {
				close(c.cmds)
				return
			}
			c.cmds <- m
		}
	}()
	if err := f(c); err != nil {
		fmt.Fprintf(os.Stderr, "orbitpool test child %s: %v\n", role, err)
		c.send(mpMsg{Type: "error", Err: err.Error()})
		return 1
	}
	return 0
}

func (c *mpChildCtx) send(m mpMsg) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.out.Encode(m); err != nil {
		fmt.Fprintf(os.Stderr, "orbitpool test child %s: write to parent: %v\n", c.role, err)
		os.Exit(4)
	}
}

func (c *mpChildCtx) fail(format string, args ...any) {
	c.send(mpMsg{Type: "error", Err: fmt.Sprintf(format, args...)})
}

// expect waits for the parent's next command, which must be typ.
func (c *mpChildCtx) expect(typ string) (mpMsg, error) {
	m, ok := <-c.cmds
	if !ok {
		return m, fmt.Errorf("parent went away while %s waited for %q", c.role, typ)
	}
	if m.Type != typ {
		return m, fmt.Errorf("command %q, want %q", m.Type, typ)
	}
	return m, nil
}

// untilParentLeaves blocks until the parent closes stdin.
func (c *mpChildCtx) untilParentLeaves() {
	for range c.cmds {
	}
}

func (c *mpChildCtx) open() (*Pool, error) {
	p, err := Open(c.args.Spec, Options{ReconcileInterval: c.args.Reconcile, ReservationTimeout: c.args.ResTimeout, OrderWindow: c.args.Window, ReclaimHold: c.args.Hold})
	if err == nil && c.args.Linger {
		p.SetLingering(func(Key) int { return rand.IntN(3) })
	}
	return p, err
}

// mpWaitSnap polls p's snapshot until cond holds, at most d.
func mpWaitSnap(p *Pool, d time.Duration, cond func(Snapshot) bool) (Snapshot, bool) {
	deadline := time.Now().Add(d)
	for {
		snap, err := p.Snapshot()
		if err == nil && cond(snap) {
			return snap, true
		}
		if time.Now().After(deadline) {
			return snap, false
		}
		time.Sleep(time.Millisecond)
	}
}

// mpKS is snap's stats for k (zero if the key has no entry).
func mpKS(snap Snapshot, k Key) KeyStats {
	for _, ks := range snap.Keys {
		if ks.Key == k {
			return ks
		}
	}
	return KeyStats{Key: k}
}

func mpLeaseBytes(l Lease) []byte {
	b, err := l.MarshalBinary()
	if err != nil {
		panic(err)
	}
	return b
}

func mpSockPath(dir string, lane int) string {
	return filepath.Join(dir, fmt.Sprintf("l%d.sock", lane))
}

// Lease hand-off status codes, owner to reserver.
const (
	mpOK byte = iota
	mpStale
	mpNotOwner
	mpBadLease
	mpOtherErr
	mpWrongKey // accepted, on a resource of another key than the reserver's
)

func mpCode(err error) byte {
	switch {
	case err == nil:
		return mpOK
	case errors.Is(err, ErrStale):
		return mpStale
	case errors.Is(err, ErrNotOwner):
		return mpNotOwner
	}
	return mpOtherErr
}

// ---- parent side ----

type mpBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *mpBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *mpBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// mpChild is a running child process.
type mpChild struct {
	t      testing.TB
	role   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	msgs   chan mpMsg
	quit   chan struct{}
	done   chan struct{}
	werr   error // cmd.Wait's result, once done is closed
	stderr mpBuffer
}

// mpStart runs the test binary as a child in role. The child is killed in
// t.Cleanup whatever happens.
func mpStart(t testing.TB, role string, a mpArgs) *mpChild {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if a.Lifetime <= 0 {
		a.Lifetime = 2 * time.Minute
	}
	js, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), mpEnvRole+"="+role, mpEnvArgs+"="+string(js))
	c := &mpChild{t: t, role: role, cmd: cmd, msgs: make(chan mpMsg, 64), quit: make(chan struct{}), done: make(chan struct{})}
	cmd.Stderr = &c.stderr
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		dec := json.NewDecoder(stdout)
		for {
			var m mpMsg
			if err := dec.Decode(&m); err != nil {
				break
			}
			select {
			case c.msgs <- m:
			case <-c.quit:
			}
		}
		close(c.msgs)
		c.werr = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		close(c.quit)
		select {
		case <-c.done:
		case <-time.After(10 * time.Second):
			t.Errorf("child %s (pid %d) still there 10s after SIGKILL", role, cmd.Process.Pid)
		}
		if s := c.stderr.String(); t.Failed() && s != "" {
			t.Logf("child %s (pid %d) stderr:\n%s", role, cmd.Process.Pid, mpTail(s))
		}
	})
	return c
}

func mpTail(s string) string {
	if len(s) > 8000 {
		return "..." + s[len(s)-8000:]
	}
	return s
}

func (c *mpChild) pid() int { return c.cmd.Process.Pid }

func (c *mpChild) diag() string {
	if s := c.stderr.String(); s != "" {
		return "\nchild stderr:\n" + mpTail(s)
	}
	return ""
}

func (c *mpChild) send(m mpMsg) {
	c.t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := c.stdin.Write(append(b, '\n')); err != nil {
		c.t.Fatalf("send %q to child %s: %v%s", m.Type, c.role, err, c.diag())
	}
}

func (c *mpChild) check(m mpMsg, ok bool) mpMsg {
	c.t.Helper()
	if !ok {
		<-c.done
		c.t.Fatalf("child %s (pid %d) exited (%v) before replying%s", c.role, c.pid(), c.werr, c.diag())
	}
	if m.Type == "error" {
		c.t.Fatalf("child %s (pid %d) failed: %s%s", c.role, c.pid(), m.Err, c.diag())
	}
	return m
}

func (c *mpChild) recv(d time.Duration) mpMsg {
	c.t.Helper()
	select {
	case m, ok := <-c.msgs:
		return c.check(m, ok)
	case <-time.After(d):
		c.t.Fatalf("child %s (pid %d): no reply within %v%s", c.role, c.pid(), d, c.diag())
	}
	panic("unreachable")
}

// tryRecv returns a message if one is there.
func (c *mpChild) tryRecv() (mpMsg, bool) {
	c.t.Helper()
	select {
	case m, ok := <-c.msgs:
		return c.check(m, ok), true
	default:
		return mpMsg{}, false
	}
}

func (c *mpChild) expect(typ string, d time.Duration) mpMsg {
	c.t.Helper()
	m := c.recv(d)
	if m.Type != typ {
		c.t.Fatalf("child %s sent %q, want %q", c.role, m.Type, typ)
	}
	return m
}

// finish closes the child's stdin, its signal to leave, and checks that it
// exits cleanly (under -race, a child that saw a race exits with status 66).
func (c *mpChild) finish(d time.Duration) {
	c.t.Helper()
	c.stdin.Close()
	select {
	case <-c.done:
	case <-time.After(d):
		c.t.Fatalf("child %s (pid %d) did not exit within %v of being told to%s", c.role, c.pid(), d, c.diag())
	}
	for m := range c.msgs {
		if m.Type == "error" {
			c.t.Errorf("child %s: %s", c.role, m.Err)
		}
	}
	if c.werr != nil {
		c.t.Fatalf("child %s (pid %d): %v%s", c.role, c.pid(), c.werr, c.diag())
	}
}

// kill SIGKILLs the child and waits until it is gone.
func (c *mpChild) kill() {
	c.t.Helper()
	if err := c.cmd.Process.Kill(); err != nil {
		c.t.Fatalf("kill child %s: %v", c.role, err)
	}
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		c.t.Fatalf("child %s (pid %d) still there 10s after SIGKILL", c.role, c.pid())
	}
}

// mpSockDir is a short directory for unix sockets (their paths are limited
// to 107 bytes).
func mpSockDir(t testing.TB) string {
	dir, err := os.MkdirTemp("", "orbitmp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// mpOpenParent makes a fresh segment and joins it from the test process.
func mpOpenParent(t testing.TB, opts Options) (*Pool, PoolSpec) {
	t.Helper()
	spec := mpSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	p, err := Open(spec, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, spec
}

// ---- a: stress ----

// mpStats are a stress child's counters.
type mpStats struct {
	LocalReuse         int // Acquire -> PlanReuseLocal
	RemoteReuse        int // Acquire -> PlanReuseRemote, accepted by the owner
	DirectLocal        int // Reserve + own Accept
	DirectRemote       int // Reserve on a sibling's resource, accepted by the owner
	Busy               int // Reserve -> ErrBusy
	Created            int // churn key: permits registered
	Abandoned          int // churn key: permits closed unregistered
	Unregistered       int
	BudgetRefused      int // ClaimCreate -> ErrBudget
	StaleChurn         int // churn-key leases the owner found stale (the resource went away: allowed)
	DupRejected        int // second presentation of an accepted lease refused
	KeyChecked         int // executions whose resource's key was checked against the key asked for
	WrongOwnerRejected int // lease presented to a process that does not own it, refused
	RemoteOK           int // leases this process handed over and the owner accepted
	Served             int // leases of other processes this process accepted as owner
	Violations         []string
}

func (s *mpStats) add(o *mpStats) {
	s.LocalReuse += o.LocalReuse
	s.RemoteReuse += o.RemoteReuse
	s.DirectLocal += o.DirectLocal
	s.DirectRemote += o.DirectRemote
	s.Busy += o.Busy
	s.Created += o.Created
	s.Abandoned += o.Abandoned
	s.Unregistered += o.Unregistered
	s.BudgetRefused += o.BudgetRefused
	s.StaleChurn += o.StaleChurn
	s.DupRejected += o.DupRejected
	s.KeyChecked += o.KeyChecked
	s.WrongOwnerRejected += o.WrongOwnerRejected
	s.RemoteOK += o.RemoteOK
	s.Served += o.Served
	s.Violations = append(s.Violations, o.Violations...)
}

type mpStress struct {
	p       *Pool
	a       mpArgs
	lanes   []int // every stress child's lane
	mu      sync.Mutex
	st      mpStats
	tickets map[uint64]bool    // tickets this owner accepted
	keyOf   map[ResourceID]Key // this owner's churn resources, by the key they were made for
}

// churnKeys are the keys whose resources the stress creates and removes.
var churnKeys = []Key{mpKeyChurn, mpKeyChurn2}

// checkKey flags an execution on id for key k that is on another key's
// resource. A sibling can reserve a resource between its registration and
// the owner's record of it, so an unknown id is looked up again briefly.
func (s *mpStress) checkKey(id ResourceID, k Key) bool {
	for range 1000 {
		s.mu.Lock()
		got, ok := s.keyOf[id]
		if ok && got == k {
			s.st.KeyChecked++
		}
		s.mu.Unlock()
		if ok {
			if got != k {
				s.violation("execution for key %v on resource %v of key %v", k, id, got)
			}
			return got == k
		}
		time.Sleep(10 * time.Microsecond)
	}
	s.violation("execution for key %v on resource %v, which this owner never made", k, id)
	return false
}

func (s *mpStress) count(f func(*mpStats)) {
	s.mu.Lock()
	f(&s.st)
	s.mu.Unlock()
}

func (s *mpStress) violation(format string, args ...any) {
	msg := fmt.Sprintf("lane %d: ", s.p.Lane()) + fmt.Sprintf(format, args...)
	fmt.Fprintln(os.Stderr, msg)
	s.mu.Lock()
	if len(s.st.Violations) < 20 {
		s.st.Violations = append(s.st.Violations, msg)
	}
	s.mu.Unlock()
}

// accepted records that this owner accepted l, and flags a second acceptance.
func (s *mpStress) accepted(l Lease, remote bool) {
	s.mu.Lock()
	dup := s.tickets[l.Ticket]
	s.tickets[l.Ticket] = true
	if remote {
		s.st.Served++
	}
	s.mu.Unlock()
	if dup {
		s.violation("lease %v ticket %#x accepted twice", l.ID, l.Ticket)
	}
}

func mpHold(rng *rand.Rand) {
	if rng.IntN(2) == 0 {
		time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
	} else {
		runtime.Gosched()
	}
}

// serve is the owner's side of lease hand-off: read a lease, Accept it, hold
// the execution briefly, Complete it, and reply with a status byte.
func (s *mpStress) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
			var b [LeaseSize + 1]byte // the lease, and the churn key it is for (or none)
			for {
				if _, err := io.ReadFull(c, b[:]); err != nil {
					return
				}
				var l Lease
				code := mpBadLease
				if l.UnmarshalBinary(b[:LeaseSize]) == nil {
					e, err := s.p.Accept(l)
					code = mpCode(err)
					if err == nil {
						s.accepted(l, true)
						if tag := int(b[LeaseSize]); tag < len(churnKeys) && !s.checkKey(e.ID(), churnKeys[tag]) {
							code = mpWrongKey
						}
						mpHold(rng)
						e.Complete()
					}
				}
				if _, err := c.Write([]byte{code}); err != nil {
					return
				}
			}
		}()
	}
}

// rpc hands l, taken for churn key tag (or none, 0xff), to the process in
// lane and returns its verdict.
func (s *mpStress) rpc(conns map[int]net.Conn, lane int, l Lease, tag byte) (byte, error) {
	c := conns[lane]
	if c == nil {
		var err error
		if c, err = net.Dial("unix", mpSockPath(s.a.Dir, lane)); err != nil {
			return 0, err
		}
		conns[lane] = c
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(append(mpLeaseBytes(l), tag)); err != nil {
		return 0, err
	}
	var r [1]byte
	if _, err := io.ReadFull(c, r[:]); err != nil {
		return 0, err
	}
	return r[0], nil
}

// handOver presents a lease on a sibling's resource to its owner, sometimes
// first to a process that does not own it and sometimes twice, and returns
// the owner's verdict on the first real presentation.
func (s *mpStress) handOver(rng *rand.Rand, conns map[int]net.Conn, l Lease, tag byte) byte {
	owner := l.ID.Lane()
	if rng.IntN(8) == 0 {
		for _, other := range s.lanes {
			if other == owner || other == s.p.Lane() {
				continue
			}
			code, err := s.rpc(conns, other, l, tag)
			switch {
			case err != nil:
				s.violation("hand %v to lane %d: %v", l.ID, other, err)
			case code != mpNotOwner:
				s.violation("lane %d answered %d, not not-owner, to a lease on %v", other, code, l.ID)
			default:
				s.count(func(st *mpStats) { st.WrongOwnerRejected++ })
			}
			break
		}
	}
	code, err := s.rpc(conns, owner, l, tag)
	if err != nil {
		s.violation("hand %v to its owner: %v", l.ID, err)
		return mpOtherErr
	}
	if code == mpOK {
		s.count(func(st *mpStats) { st.RemoteOK++ })
		if rng.IntN(4) == 0 {
			again, err := s.rpc(conns, owner, l, tag)
			switch {
			case err != nil:
				s.violation("hand %v again: %v", l.ID, err)
			case again != mpStale:
				s.violation("lease %v ticket %#x presented twice: second answer %d, want stale", l.ID, l.Ticket, again)
			default:
				s.count(func(st *mpStats) { st.DupRejected++ })
			}
		}
	}
	return code
}

func (s *mpStress) acquireShared(rng *rand.Rand, conns map[int]net.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	plan, err := s.p.Acquire(ctx, mpKeyShared, LocalFirst{}, Limits{MaxResources: s.a.N})
	cancel()
	if err != nil {
		s.violation("acquire on the shared key: %v", err)
		return
	}
	switch plan.Kind {
	case PlanReuseLocal:
		mpHold(rng)
		plan.Execution.Complete()
		s.count(func(st *mpStats) { st.LocalReuse++ })
	case PlanReuseRemote:
		if code := s.handOver(rng, conns, plan.Lease, 0xff); code != mpOK {
			s.violation("owner refused an Acquire lease on the shared key: code %d", code)
		} else {
			s.count(func(st *mpStats) { st.RemoteReuse++ })
		}
	case PlanCreate:
		s.violation("Acquire planned a creation on the shared key, whose budget of %d is used", s.a.N)
		plan.Permit.Close()
	}
}

func (s *mpStress) reserveDirect(rng *rand.Rand, conns map[int]net.Conn) {
	cands, err := s.p.Candidates(mpKeyShared, nil)
	if err != nil || len(cands) != s.a.N {
		s.violation("candidates of the shared key: %d, %v; want %d", len(cands), err, s.a.N)
		return
	}
	c := cands[rng.IntN(len(cands))]
	l, err := s.p.Reserve(c.ID)
	if errors.Is(err, ErrBusy) {
		s.count(func(st *mpStats) { st.Busy++ })
		return
	}
	if err != nil {
		s.violation("reserve %v: %v", c.ID, err)
		return
	}
	if !c.Local {
		if code := s.handOver(rng, conns, l, 0xff); code != mpOK {
			s.violation("owner refused a lease on the shared key: code %d", code)
		} else {
			s.count(func(st *mpStats) { st.DirectRemote++ })
		}
		return
	}
	e, err := s.p.Accept(l)
	if err != nil {
		s.violation("accept own lease %v: %v", l.ID, err)
		return
	}
	s.accepted(l, false)
	if _, err := s.p.Accept(l); !errors.Is(err, ErrStale) {
		s.violation("second accept of own lease %v: %v, want ErrStale", l.ID, err)
	}
	mpHold(rng)
	e.Complete()
	s.count(func(st *mpStats) { st.DirectLocal++ })
}

func (s *mpStress) unregister(id ResourceID) {
	switch err := s.p.Unregister(id); {
	case err == nil:
		s.count(func(st *mpStats) { st.Unregistered++ })
	case !errors.Is(err, ErrStale): // another local worker removed it first
		s.violation("unregister %v: %v", id, err)
	}
}

func (s *mpStress) acquireChurn(rng *rand.Rand, conns map[int]net.Conn) {
	tag := rng.IntN(len(churnKeys))
	k := churnKeys[tag]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	plan, err := s.p.Acquire(ctx, k, LocalFirst{}, mpChurnLimits)
	cancel()
	if err != nil {
		s.violation("acquire on churn key %v: %v", k, err)
		return
	}
	switch plan.Kind {
	case PlanCreate:
		mpHold(rng)
		if rng.IntN(4) == 0 {
			plan.Permit.Close()
			s.count(func(st *mpStats) { st.Abandoned++ })
			return
		}
		// The record comes first under the lock that checkKey reads it
		// with, so no sibling can present a lease on it before it exists.
		s.mu.Lock()
		e, err := plan.Permit.RegisterAndAccept(1)
		if err == nil {
			s.keyOf[e.ID()] = k
		}
		s.mu.Unlock()
		if err != nil {
			s.violation("register churn resource: %v", err)
			return
		}
		s.count(func(st *mpStats) { st.Created++ })
		mpHold(rng)
		e.Complete()
		if rng.IntN(2) == 0 {
			s.unregister(e.ID())
		}
	case PlanReuseLocal:
		s.checkKey(plan.Execution.ID(), k)
		mpHold(rng)
		plan.Execution.Complete()
		s.count(func(st *mpStats) { st.LocalReuse++ })
		if rng.IntN(3) == 0 {
			s.unregister(plan.Execution.ID())
		}
	case PlanReuseRemote:
		switch code := s.handOver(rng, conns, plan.Lease, byte(tag)); code {
		case mpOK:
			s.count(func(st *mpStats) { st.RemoteReuse++ })
		case mpStale:
			s.count(func(st *mpStats) { st.StaleChurn++ })
		default:
			s.violation("owner answered %d to a churn-key lease", code)
		}
	}
}

func (s *mpStress) claimChurn(rng *rand.Rand) {
	cp, err := s.p.ClaimCreate(churnKeys[rng.IntN(len(churnKeys))], mpChurnLimits)
	if errors.Is(err, ErrBudget) {
		s.count(func(st *mpStats) { st.BudgetRefused++ })
		return
	}
	if err != nil {
		s.violation("claim on the churn key: %v", err)
		return
	}
	mpHold(rng)
	cp.Close()
	s.count(func(st *mpStats) { st.Abandoned++ })
}

func (s *mpStress) worker(w int, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(s.a.Seed, uint64(w)))
	conns := map[int]net.Conn{}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for {
		select {
		case <-stop:
			return
		default:
		}
		switch r := rng.IntN(100); {
		case r < 50:
			s.acquireShared(rng, conns)
		case r < 70:
			s.reserveDirect(rng, conns)
		case r < 90:
			s.acquireChurn(rng, conns)
		default:
			s.claimChurn(rng)
		}
	}
}

func mpRoleStress(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	defer p.Close()
	s := &mpStress{p: p, a: c.args, tickets: map[uint64]bool{}, keyOf: map[ResourceID]Key{}}
	ln, err := net.Listen("unix", mpSockPath(c.args.Dir, p.Lane()))
	if err != nil {
		return err
	}
	defer ln.Close()
	go s.serve(ln)
	var ids []ResourceID
	for _, capacity := range []int{1, 2} {
		id, err := p.Register(mpKeyShared, capacity)
		if err != nil {
			return err
		}
		ids = append(ids, id)
	}
	c.send(mpMsg{Type: "ready", Lane: p.Lane(), PID: os.Getpid(), IDs: ids})
	m, err := c.expect("go")
	if err != nil {
		return err
	}
	s.lanes = m.Lanes
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range c.args.Workers {
		wg.Go(func() { s.worker(w, stop) })
	}
	_, err = c.expect("stop")
	close(stop)
	wg.Wait()
	if err != nil {
		return err
	}
	c.send(mpMsg{Type: "stopped"})
	// Siblings may still hand leases to this owner until they have all
	// stopped: report only then.
	if _, err := c.expect("report"); err != nil {
		return err
	}
	s.mu.Lock()
	st := s.st
	s.mu.Unlock()
	c.send(mpMsg{Type: "report", Stats: &st})
	c.untilParentLeaves()
	return nil
}

// mpMonitor reads the table from another process while the stress runs and
// checks what must hold at every instant.
func mpMonitor(p *Pool, stop <-chan struct{}, shared int) (rounds int, bad []string) {
	flag := func(format string, args ...any) {
		if len(bad) < 20 {
			bad = append(bad, fmt.Sprintf(format, args...))
		}
	}
	var cands []Candidate
	for {
		select {
		case <-stop:
			return rounds, bad
		default:
		}
		rounds++
		snap, err := p.Snapshot()
		if err != nil {
			flag("snapshot: %v", err)
			continue
		}
		if ks := mpKS(snap, mpKeyShared); ks.Live != shared || ks.Creating != 0 {
			flag("shared key: live %d creating %d, want %d and 0", ks.Live, ks.Creating, shared)
		}
		for _, k := range churnKeys {
			if ks := mpKS(snap, k); ks.Live+ks.Creating > mpChurnLimits.MaxResources || ks.Creating > mpChurnLimits.MaxCreating || ks.Live < 0 {
				flag("churn key %v: live %d + creating %d over its budget %+v", k, ks.Live, ks.Creating, mpChurnLimits)
			}
		}
		cands, err = p.Candidates(mpKeyShared, cands[:0])
		if err != nil || len(cands) != shared {
			flag("shared key: %d candidates, %v; want %d", len(cands), err, shared)
		}
		for _, c := range cands {
			if c.Capacity < 1 || c.Capacity > 2 || c.InUse < 0 || c.Pending < 0 || c.InUse+c.Pending > c.Capacity {
				flag("shared key candidate %+v: in use + pending over capacity", c)
			}
		}
		for _, k := range churnKeys {
			cands, err = p.Candidates(k, cands[:0])
			if err != nil {
				flag("churn key candidates: %v", err)
			}
			for _, c := range cands {
				// A candidate is read as one life of its slot: word,
				// capacity and key agree.
				if c.InUse+c.Pending > c.Capacity {
					flag("churn key candidate %+v: in use + pending over capacity", c)
				}
			}
		}
		time.Sleep(300 * time.Microsecond)
	}
}

// TestMultiProcessStress runs four processes doing Reserve/Accept/Complete and
// Acquire(LocalFirst) on each other's resources, handing remote leases to their
// owners over unix sockets, and creating and removing resources of two keys so
// that slots move between keys, while a fifth (the test) reads the table:
// capacity is never exceeded, the creation budget holds fleet-wide, no lease
// is accepted twice or by a non-owner, every execution is on a resource of
// the key asked for, and at the end every unit is back.
func TestMultiProcessStress(t *testing.T) {
	mpStressRun(t, mpScale(2*time.Second, 800*time.Millisecond))
}

var mpStressDuration = flag.Duration("orbitpool.stress", 60*time.Second, "how long BenchmarkMultiProcessStress runs")

// BenchmarkMultiProcessStress is TestMultiProcessStress run for
// -orbitpool.stress (60s by default), reporting its counts:
//
//	go test -run '^$' -bench MultiProcessStress -benchtime 1x ./orbitpool/
func BenchmarkMultiProcessStress(b *testing.B) {
	for b.Loop() {
		st, acc := mpStressRun(b, *mpStressDuration)
		b.ReportMetric(float64(st.LocalReuse+st.DirectLocal), "local-uses")
		b.ReportMetric(float64(st.RemoteReuse+st.DirectRemote), "remote-uses")
		b.ReportMetric(float64(acc), "accepted")
		b.ReportMetric(float64(st.Created), "created")
		b.ReportMetric(float64(st.Unregistered), "unregistered")
		b.ReportMetric(float64(st.KeyChecked), "key-checked")
		b.ReportMetric(float64(st.StaleChurn), "stale-churn")
		b.ReportMetric(float64(len(st.Violations)), "violations")
	}
}

// mpStressRun runs the stress for dur and returns the children's counters and
// the number of leases owners accepted on the shared key.
func mpStressRun(t testing.TB, dur time.Duration) (mpStats, uint64) {
	const children, workers = 4, 6
	mon, spec := mpOpenParent(t, Options{ReconcileInterval: 20 * time.Millisecond})
	dir := mpSockDir(t)
	args := mpArgs{Spec: spec, Reconcile: 20 * time.Millisecond, ResTimeout: 5 * time.Second, Dir: dir, Workers: workers, N: 2 * children}
	var cs []*mpChild
	for i := range children {
		a := args
		a.Seed = uint64(i + 1)
		a.Window = uint32(4 * i) // strict order in one process, windows of 4 to 12 in the others
		cs = append(cs, mpStart(t, "stress", a))
	}
	var lanes []int
	for _, c := range cs {
		lanes = append(lanes, c.expect("ready", 30*time.Second).Lane)
	}
	stopMon := make(chan struct{})
	type monResult struct {
		rounds int
		bad    []string
	}
	monDone := make(chan monResult, 1)
	go func() {
		r, bad := mpMonitor(mon, stopMon, 2*children)
		monDone <- monResult{r, bad}
	}()
	defer func() {
		select {
		case <-stopMon:
		default:
			close(stopMon)
		}
	}()
	for _, c := range cs {
		c.send(mpMsg{Type: "go", Lanes: lanes})
	}
	time.Sleep(dur)
	for _, c := range cs {
		c.send(mpMsg{Type: "stop"})
	}
	for _, c := range cs {
		c.expect("stopped", 30*time.Second)
	}
	var total mpStats
	for _, c := range cs {
		c.send(mpMsg{Type: "report"})
		total.add(c.expect("report", 10*time.Second).Stats)
	}
	close(stopMon)
	mr := <-monDone

	for _, v := range total.Violations {
		t.Error(v)
	}
	for _, v := range mr.bad {
		t.Errorf("monitor: %s", v)
	}
	if total.RemoteOK != total.Served {
		t.Errorf("reservers saw %d leases accepted, owners accepted %d", total.RemoteOK, total.Served)
	}
	if total.LocalReuse == 0 || total.RemoteReuse == 0 || total.DirectRemote == 0 || total.DirectLocal == 0 || total.Created == 0 {
		t.Errorf("some paths were never taken: %+v", total)
	}

	// Quiescent, every process still in: every unit is back.
	snap, err := mon.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sh, ch := mpKS(snap, mpKeyShared), mpKS(snap, mpKeyChurn)
	if sh.Live != 2*children || sh.InUse != 0 || sh.Pending != 0 || sh.Waiting != 0 || sh.Idle != 2*children {
		t.Errorf("shared key after the run: %+v", sh)
	}
	for _, k := range churnKeys {
		if ks := mpKS(snap, k); ks.InUse != 0 || ks.Pending != 0 || ks.Creating != 0 || ks.Waiting != 0 || ks.Live > mpChurnLimits.MaxResources {
			t.Errorf("churn key %v after the run: %+v", k, ks)
		}
	}
	if total.KeyChecked == 0 {
		t.Errorf("no execution on a churn key was checked for its key: %+v", total)
	}
	t.Logf("%v x %d processes x %d workers: %d monitor rounds; shared key: %d accepted, %d waits (%v waiting in all); churn: %d created, %d waits; %+v",
		dur, children, workers, mr.rounds, sh.Accepted, sh.Waits, sh.WaitTime.Round(time.Millisecond), ch.Created, ch.Waits, total)

	for _, c := range cs {
		c.finish(10 * time.Second)
	}
	snap, err = mon.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Lanes) != 1 || !snap.Lanes[0].Local {
		t.Errorf("lanes after the children left: %+v", snap.Lanes)
	}
	for _, k := range append([]Key{mpKeyShared}, churnKeys...) {
		if ks := mpKS(snap, k); ks.Live != 0 || ks.Creating != 0 || ks.InUse != 0 || ks.Pending != 0 || ks.Waiting != 0 {
			t.Errorf("key %v after the children left: %+v", k, ks)
		}
	}
	return total, sh.Accepted
}

// ---- b: cross-process wake ----

func mpRoleWaiter(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	defer p.Close()
	c.send(mpMsg{Type: "ready", Lane: p.Lane(), PID: os.Getpid()})
	for range c.args.N {
		if _, err := c.expect("go"); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		plan, err := p.Acquire(ctx, c.args.Key, LocalFirst{}, Limits{MaxResources: 1})
		now := mpMono()
		cancel()
		if err != nil {
			return err
		}
		if plan.Kind != PlanReuseRemote {
			return fmt.Errorf("plan %v, want %v", plan.Kind, PlanReuseRemote)
		}
		c.send(mpMsg{Type: "acquired", T: now, Lease: mpLeaseBytes(plan.Lease), Kind: plan.Kind, Waited: plan.Waited})
	}
	c.untilParentLeaves()
	return nil
}

// TestMultiProcessWake parks an Acquire in a child on a key whose only
// resource (capacity 1) the test process holds, completes it, and measures
// until the child's Acquire returns: the doorbell, the child's dispatcher and
// the wake-up of its goroutine, across processes.
func TestMultiProcessWake(t *testing.T) {
	const rounds = 5
	p, spec := mpOpenParent(t, Options{ReconcileInterval: time.Second, ReservationTimeout: 5 * time.Second})
	if _, err := p.Register(mpKeyWake, 1); err != nil {
		t.Fatal(err)
	}
	plan, err := p.Acquire(context.Background(), mpKeyWake, LocalOnly{}, Limits{})
	if err != nil || plan.Kind != PlanReuseLocal {
		t.Fatalf("hold the resource: %v %v", plan.Kind, err)
	}
	e := plan.Execution
	b := mpStart(t, "waiter", mpArgs{Spec: spec, Reconcile: time.Second, ResTimeout: 5 * time.Second, Key: mpKeyWake, N: rounds})
	b.expect("ready", 30*time.Second)
	var lats []time.Duration
	for i := range rounds {
		b.send(mpMsg{Type: "go"})
		if snap, ok := mpWaitSnap(p, 5*time.Second, func(s Snapshot) bool { return mpKS(s, mpKeyWake).Waiting == 1 }); !ok {
			t.Fatalf("round %d: the child never parked: %+v", i, mpKS(snap, mpKeyWake))
		}
		// Let the child's goroutine and dispatcher go to sleep: a wake from
		// sleep is what is measured.
		time.Sleep(20 * time.Millisecond)
		t0 := mpMono()
		e.Complete()
		m := b.expect("acquired", 5*time.Second)
		lat := time.Duration(m.T - t0)
		lats = append(lats, lat)
		if lat > time.Second {
			t.Errorf("round %d: waiter in another process woke %v after Complete, want < 1s", i, lat)
		}
		var l Lease
		if err := l.UnmarshalBinary(m.Lease); err != nil {
			t.Fatal(err)
		}
		if e, err = p.Accept(l); err != nil {
			t.Fatalf("round %d: accept the waiter's lease: %v", i, err)
		}
	}
	e.Complete()
	t.Logf("cross-process wake latency (Complete here to Acquire returning in the child): %v", lats)
	b.finish(10 * time.Second)
	snap, _ := p.Snapshot()
	if ks := mpKS(snap, mpKeyWake); ks.InUse != 0 || ks.Pending != 0 || ks.Waiting != 0 || ks.Waits != rounds {
		t.Errorf("after the rounds: %+v, want idle with %d waits counted", ks, rounds)
	}
}

// ---- c: SIGKILL ----

// mpRoleVictim holds everything a process can hold on the table, and waits
// to be killed: two executions on its own resource, three reservations on two
// siblings' resources (one of them in another child), two creation permits,
// and four goroutines parked in Acquire on two keys.
func mpRoleVictim(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	rs, rss := c.args.IDs[0], c.args.IDs[1]
	own, err := p.Register(mpKeyVOwn, 2)
	if err != nil {
		return err
	}
	plan, err := p.Acquire(context.Background(), mpKeyVOwn, LocalFirst{}, Limits{})
	if err != nil || plan.Kind != PlanReuseLocal {
		return fmt.Errorf("own execution: %v %v", plan.Kind, err)
	}
	l, err := p.Reserve(own)
	if err != nil {
		return err
	}
	e2, err := p.Accept(l)
	if err != nil {
		return err
	}
	var leases []Lease
	for _, id := range []ResourceID{rs, rs, rss} {
		l, err := p.Reserve(id)
		if err != nil {
			return fmt.Errorf("reserve %v: %w", id, err)
		}
		leases = append(leases, l)
	}
	var permits []*CreationPermit
	for range 2 {
		cp, err := p.ClaimCreate(mpKeyVPerm, mpPermLimits)
		if err != nil {
			return err
		}
		permits = append(permits, cp)
	}
	park := func(k Key, lim Limits) {
		plan, err := p.Acquire(context.Background(), k, LocalFirst{}, lim)
		c.fail("acquire on %v returned %v, %v; it should have stayed parked", k, plan.Kind, err)
	}
	for range 2 {
		go park(mpKeyRS, Limits{MaxResources: 1})
		go park(mpKeyVPerm, mpPermLimits)
	}
	if snap, ok := mpWaitSnap(p, 10*time.Second, func(s Snapshot) bool {
		return mpKS(s, mpKeyRS).Waiting == 2 && mpKS(s, mpKeyVPerm).Waiting == 2
	}); !ok {
		return fmt.Errorf("waiters never parked: %+v", snap.Keys)
	}
	c.send(mpMsg{Type: "ready", Lane: p.Lane(), PID: os.Getpid(), IDs: []ResourceID{own}})
	c.untilParentLeaves()
	runtime.KeepAlive(plan)
	runtime.KeepAlive(e2)
	runtime.KeepAlive(leases)
	runtime.KeepAlive(permits)
	return nil
}

func mpRoleSurvivor(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	defer p.Close()
	id, err := p.Register(mpKeyRSS, 1)
	if err != nil {
		return err
	}
	c.send(mpMsg{Type: "ready", Lane: p.Lane(), PID: os.Getpid(), IDs: []ResourceID{id}})
	if _, err := c.expect("go"); err != nil {
		return err
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		plan, err := p.Acquire(ctx, mpKeyRS, LocalFirst{}, Limits{MaxResources: 1})
		now := mpMono()
		if err != nil {
			c.fail("survivor's acquire: %v", err)
			return
		}
		c.send(mpMsg{Type: "acquired", T: now, Kind: plan.Kind, Lease: mpLeaseBytes(plan.Lease), Waited: plan.Waited})
	}()
	c.untilParentLeaves()
	return nil
}

// TestMultiProcessKillReclaims SIGKILLs a process holding executions,
// reservations on two siblings' resources, creation permits and parked
// waiters, and checks that the survivors (the test and a child) get all of it
// back within a second, through the kernel's lane lock: the reservations are
// dropped because their taker's lane died, long before ReservationTimeout.
func TestMultiProcessKillReclaims(t *testing.T) {
	opts := Options{ReconcileInterval: 50 * time.Millisecond, ReservationTimeout: 5 * time.Second}
	p, spec := mpOpenParent(t, opts)
	rs, err := p.Register(mpKeyRS, 2)
	if err != nil {
		t.Fatal(err)
	}
	args := mpArgs{Spec: spec, Reconcile: opts.ReconcileInterval, ResTimeout: opts.ReservationTimeout}
	s := mpStart(t, "survivor", args)
	rss := s.expect("ready", 30*time.Second).IDs[0]
	args.IDs = []ResourceID{rs, rss}
	v := mpStart(t, "victim", args)
	vm := v.expect("ready", 30*time.Second)
	s.send(mpMsg{Type: "go"})
	if snap, ok := mpWaitSnap(p, 5*time.Second, func(s Snapshot) bool { return mpKS(s, mpKeyRS).Waiting == 3 }); !ok {
		t.Fatalf("survivor never parked: %+v", mpKS(snap, mpKeyRS))
	}
	snap, _ := p.Snapshot()
	rsk, rssk, own, perm := mpKS(snap, mpKeyRS), mpKS(snap, mpKeyRSS), mpKS(snap, mpKeyVOwn), mpKS(snap, mpKeyVPerm)
	got := fmt.Sprintf("test's resource: pending %d, waiting %d; child's resource: pending %d; victim's resource: live %d, in use %d; permits: creating %d, waiting %d",
		rsk.Pending, rsk.Waiting, rssk.Pending, own.Live, own.InUse, perm.Creating, perm.Waiting)
	if want := "test's resource: pending 2, waiting 3; child's resource: pending 1; victim's resource: live 1, in use 2; permits: creating 2, waiting 2"; got != want {
		t.Fatalf("before the kill:\n%s\nwant\n%s", got, want)
	}

	t0 := time.Now()
	v.kill()
	var (
		acquired *mpMsg
		why      string
	)
	deadline := t0.Add(time.Second)
	for {
		if acquired == nil {
			if m, ok := s.tryRecv(); ok {
				acquired = &m
			}
		}
		snap, err := p.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		rsk, rssk, own, perm := mpKS(snap, mpKeyRS), mpKS(snap, mpKeyRSS), mpKS(snap, mpKeyVOwn), mpKS(snap, mpKeyVPerm)
		switch {
		case slices.ContainsFunc(snap.Lanes, func(l LaneInfo) bool { return l.Lane == vm.Lane || l.PID == vm.PID }):
			why = "dead lane still listed"
		case own.Live != 0 || own.InUse != 0:
			why = fmt.Sprintf("dead process's resource: %+v", own)
		case perm.Creating != 0 || perm.Live != 0 || perm.Waiting != 0:
			why = fmt.Sprintf("dead process's permits and waiters: %+v", perm)
		case rssk.Pending != 0:
			why = fmt.Sprintf("reservation on the surviving child's resource: %+v", rssk)
		case rsk.Waiting != 0 || rsk.Pending > 1:
			why = fmt.Sprintf("reservations and waiters on the test's resource: %+v", rsk)
		case acquired == nil:
			why = "the surviving child's Acquire has not returned"
		default:
			why = ""
		}
		if why == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("1s after SIGKILL: %s\nsnapshot: %+v", why, snap)
		}
		time.Sleep(2 * time.Millisecond)
	}
	recovered := time.Since(t0)
	t.Logf("survivors had everything back %v after SIGKILL; surviving child waited %v", recovered, acquired.Waited)

	// The budget the permits held is whole again.
	var cps []*CreationPermit
	for range mpPermLimits.MaxResources {
		cp, err := p.ClaimCreate(mpKeyVPerm, mpPermLimits)
		if err != nil {
			t.Fatalf("claim after the kill: %v", err)
		}
		cps = append(cps, cp)
	}
	if _, err := p.ClaimCreate(mpKeyVPerm, mpPermLimits); !errors.Is(err, ErrBudget) {
		t.Fatalf("claim past the budget: %v, want ErrBudget", err)
	}
	for _, cp := range cps {
		cp.Close()
	}
	// The surviving child's lease is good, and the test's resource is whole.
	if acquired.Kind != PlanReuseRemote {
		t.Fatalf("surviving child's plan %v, want %v", acquired.Kind, PlanReuseRemote)
	}
	var l Lease
	if err := l.UnmarshalBinary(acquired.Lease); err != nil {
		t.Fatal(err)
	}
	e, err := p.Accept(l)
	if err != nil {
		t.Fatalf("accept the surviving child's lease: %v", err)
	}
	e.Complete()
	snap, _ = p.Snapshot()
	if ks := mpKS(snap, mpKeyRS); ks.InUse != 0 || ks.Pending != 0 || ks.Waiting != 0 || ks.Aged < 2 {
		t.Errorf("test's resource at the end: %+v, want idle with the 2 dead reservations counted as aged", ks)
	}
	s.finish(10 * time.Second)
}

// ---- d: a joining process reclaims a dead lane ----

func mpRoleHolder(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	defer p.Close()
	id, err := p.Register(c.args.Key, c.args.Cap)
	if err != nil {
		return err
	}
	var held []*Execution
	for range c.args.Cap {
		plan, err := p.Acquire(context.Background(), c.args.Key, LocalOnly{}, Limits{})
		if err != nil || plan.Kind != PlanReuseLocal {
			return fmt.Errorf("hold %v: %v %v", id, plan.Kind, err)
		}
		held = append(held, plan.Execution)
	}
	c.send(mpMsg{Type: "ready", Lane: p.Lane(), PID: os.Getpid(), IDs: []ResourceID{id}})
	c.untilParentLeaves()
	for _, e := range held {
		e.Complete()
	}
	return nil
}

func mpRoleJoiner(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	defer p.Close()
	c.send(mpMsg{Type: "ready", Lane: p.Lane(), PID: os.Getpid()})
	c.untilParentLeaves()
	return nil
}

type mpPlanResult struct {
	plan Plan
	err  error
	at   time.Time
}

// mpAcquireAsync runs Acquire in a goroutine.
func mpAcquireAsync(p *Pool, d time.Duration, k Key, lim Limits) <-chan mpPlanResult {
	ch := make(chan mpPlanResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		plan, err := p.Acquire(ctx, k, LocalFirst{}, lim)
		ch <- mpPlanResult{plan, err, time.Now()}
	}()
	return ch
}

// TestMultiProcessJoinReclaimWakesLaneZero: a process that joins the segment
// reclaims the lanes of dead processes, and must wake the waiters whose
// capacity that freed, in whatever lane they are. The test process is lane 0
// and never reconciles by itself here (ReconcileInterval 1h), so only the
// joiner's reclaim can wake it.
func TestMultiProcessJoinReclaimWakesLaneZero(t *testing.T) {
	opts := Options{ReconcileInterval: time.Hour, ReservationTimeout: 5 * time.Second}
	p, spec := mpOpenParent(t, opts)
	if p.Lane() != 0 {
		t.Fatalf("the first process got lane %d", p.Lane())
	}
	args := mpArgs{Spec: spec, Reconcile: time.Hour, ResTimeout: 5 * time.Second, Key: mpKeyJoin, Cap: 1}
	h := mpStart(t, "holder", args)
	hm := h.expect("ready", 30*time.Second)
	res := mpAcquireAsync(p, 3*time.Second, mpKeyJoin, Limits{MaxResources: 1})
	if snap, ok := mpWaitSnap(p, 5*time.Second, func(s Snapshot) bool { return mpKS(s, mpKeyJoin).Waiting == 1 }); !ok {
		t.Fatalf("never parked: %+v", mpKS(snap, mpKeyJoin))
	}
	h.kill()
	j := mpStart(t, "joiner", args)
	jm := j.expect("ready", 30*time.Second)
	joined := time.Now()
	snap, _ := p.Snapshot()
	if ks := mpKS(snap, mpKeyJoin); ks.Live != 0 || slices.ContainsFunc(snap.Lanes, func(l LaneInfo) bool { return l.PID == hm.PID }) {
		t.Fatalf("the joiner (lane %d) did not reclaim the dead lane %d: %+v", jm.Lane, hm.Lane, snap)
	}
	select {
	case r := <-res:
		if r.err != nil || r.plan.Kind != PlanCreate {
			t.Fatalf("acquire: %v %v, want a creation plan", r.plan.Kind, r.err)
		}
		r.plan.Permit.Close()
		t.Logf("woken %v after the joiner reclaimed the dead lane", r.at.Sub(joined))
	case <-time.After(time.Second):
		t.Fatalf("waiter in lane 0 not woken 1s after the joiner (lane %d) reclaimed dead lane %d and freed the key's budget: a reclaim during join must ring every lane, lane 0 included", jm.Lane, hm.Lane)
	}
	j.finish(10 * time.Second)
}

// ---- e: a creation slot coming back wakes waiters ----

func mpRoleCreator(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	defer p.Close()
	cp, err := p.ClaimCreate(c.args.Key, Limits{MaxResources: 2, MaxCreating: 1})
	if err != nil {
		return err
	}
	c.send(mpMsg{Type: "ready", Lane: p.Lane(), PID: os.Getpid()})
	if _, err := c.expect("register"); err != nil {
		return err
	}
	e, err := cp.RegisterAndAccept(1)
	if err != nil {
		return err
	}
	c.send(mpMsg{Type: "registered", IDs: []ResourceID{e.ID()}})
	c.untilParentLeaves()
	e.Complete()
	return nil
}

// TestMultiProcessCreatingSlotReturnWakes: with Limits{MaxResources: 2,
// MaxCreating: 1}, a waiter parked because the one creation slot is taken by
// another process must be woken when that creation finishes, even if its
// creator keeps the new resource busy (RegisterAndAccept): the key now has
// room to create a second one.
func TestMultiProcessCreatingSlotReturnWakes(t *testing.T) {
	lim := Limits{MaxResources: 2, MaxCreating: 1}
	p, spec := mpOpenParent(t, Options{ReconcileInterval: 50 * time.Millisecond, ReservationTimeout: 5 * time.Second})
	c := mpStart(t, "creator", mpArgs{Spec: spec, Reconcile: 50 * time.Millisecond, ResTimeout: 5 * time.Second, Key: mpKeyCreat})
	c.expect("ready", 30*time.Second)
	res := mpAcquireAsync(p, 3*time.Second, mpKeyCreat, lim)
	if snap, ok := mpWaitSnap(p, 5*time.Second, func(s Snapshot) bool { return mpKS(s, mpKeyCreat).Waiting == 1 }); !ok {
		t.Fatalf("never parked: %+v", mpKS(snap, mpKeyCreat))
	}
	c.send(mpMsg{Type: "register"})
	c.expect("registered", 5*time.Second)
	registered := time.Now()
	select {
	case r := <-res:
		if r.err != nil || r.plan.Kind != PlanCreate {
			t.Fatalf("acquire: %v %v, want a creation plan", r.plan.Kind, r.err)
		}
		r.plan.Permit.Close()
		t.Logf("woken %v after the other process registered", r.at.Sub(registered))
	case <-time.After(time.Second):
		snap, _ := p.Snapshot()
		t.Fatalf("waiter not woken 1s after the creation slot came back (key %+v): registering frees a concurrent-creation unit, which must wake a waiter", mpKS(snap, mpKeyCreat))
	}
	c.finish(10 * time.Second)
}

// ---- idle CPU ----

// mpRoleIdle parks N goroutines in Acquire over 16 keys whose resources are
// all held, then measures its own CPU time (getrusage) over Dur.
func mpRoleIdle(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	defer p.Close()
	const keys = 16
	key := func(i int) Key { return Key{Hi: 0x1d1e, Lo: uint64(i % keys)} }
	var held []*Execution
	for i := range keys {
		if _, err := p.Register(key(i), 1); err != nil {
			return err
		}
		plan, err := p.Acquire(context.Background(), key(i), LocalOnly{}, Limits{})
		if err != nil {
			return err
		}
		held = append(held, plan.Execution)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var unexpected atomic.Int64
	for i := range c.args.N {
		wg.Go(func() {
			_, err := p.Acquire(ctx, key(i), LocalFirst{}, Limits{MaxResources: 1})
			if we := (*WaitError)(nil); !errors.As(err, &we) {
				unexpected.Add(1)
			}
		})
	}
	if snap, ok := mpWaitSnap(p, 20*time.Second, func(s Snapshot) bool {
		n := 0
		for _, ks := range s.Keys {
			n += ks.Waiting
		}
		return n == c.args.N
	}); !ok {
		cancel()
		return fmt.Errorf("waiters never all parked: %+v", snap.Keys)
	}
	runtime.GC()
	time.Sleep(100 * time.Millisecond)
	cpu := func() int64 {
		var ru unix.Rusage
		if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
			panic(err)
		}
		return unix.TimevalToNsec(ru.Utime) + unix.TimevalToNsec(ru.Stime)
	}
	c0, w0 := cpu(), mpMono()
	time.Sleep(c.args.Dur)
	c1, w1 := cpu(), mpMono()
	cancel()
	wg.Wait()
	for _, e := range held {
		e.Complete()
	}
	c.send(mpMsg{Type: "idle", T: c1 - c0, T2: w1 - w0, N: int(unexpected.Load())})
	c.untilParentLeaves()
	return nil
}

// mpIdleCPU runs the idle role and returns CPU time over wall time.
func mpIdleCPU(t testing.TB, waiters int, d time.Duration) (cpu, wall time.Duration) {
	t.Helper()
	spec := PoolSpec{Path: filepath.Join(t.TempDir(), "seg")} // the default table
	c := mpStart(t, "idle", mpArgs{Spec: spec, N: waiters, Dur: d})
	m := c.expect("idle", d+60*time.Second)
	if m.N != 0 {
		t.Errorf("%d waiters ended other than by their context", m.N)
	}
	c.finish(10 * time.Second)
	return time.Duration(m.T), time.Duration(m.T2)
}

// TestMultiProcessIdleWaitersUseNoCPU: 1,000 goroutines parked on 16 keys
// with nothing happening cost (almost) no CPU: no goroutine polls, the
// dispatcher sleeps on its futex between Reconciles.
func TestMultiProcessIdleWaitersUseNoCPU(t *testing.T) {
	cpu, wall := mpIdleCPU(t, 1000, time.Second)
	share := float64(cpu) / float64(wall)
	t.Logf("1000 parked waiters: %v CPU over %v (%.2f%% of a core)", cpu, wall.Round(time.Millisecond), 100*share)
	if share > 0.05 {
		t.Errorf("1000 idle waiters used %v CPU in %v: %.1f%% of a core, want < 5%%", cpu, wall, 100*share)
	}
}

// ---- f: SIGKILL at a random instant of a budget operation ----

// mpRoleChurner claims, registers, unregisters and abandons resources of one
// key as fast as it can from several goroutines, until it is killed.
func mpRoleChurner(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	var ops atomic.Int64
	for g := range 4 {
		go func() {
			rng := rand.New(rand.NewPCG(c.args.Seed, uint64(g)))
			for {
				cp, err := p.ClaimCreate(mpKeyKilled, Limits{MaxResources: 1000})
				if err != nil {
					c.fail("claim: %v", err)
					return
				}
				if rng.IntN(2) == 0 {
					cp.Close()
				} else if e, err := cp.RegisterAndAccept(1); err == nil {
					e.Complete()
					p.Unregister(e.ID())
				}
				ops.Add(1)
			}
		}()
	}
	for ops.Load() < 2000 {
		time.Sleep(time.Millisecond)
	}
	c.send(mpMsg{Type: "ready", Lane: p.Lane(), PID: os.Getpid()})
	c.untilParentLeaves()
	return nil
}

// TestMultiProcessKillAnywhereLeaksNoBudget SIGKILLs, at random instants, a
// process that does nothing but take and give back a key's creation budget
// (ClaimCreate, Register, Unregister, CreationPermit.Close), and checks each
// time that once its lane is reclaimed the key counts no resource: the
// survivors reclaim everything the dead process held, wherever it died.
// A failure here is probabilistic evidence (a kill must land in the window);
// a pass on a correct table is certain.
func TestMultiProcessKillAnywhereLeaksNoBudget(t *testing.T) {
	rounds := mpScale(12, 6)
	p, spec := mpOpenParent(t, Options{ReconcileInterval: 10 * time.Millisecond, ReservationTimeout: 5 * time.Second})
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0))
	for i := range rounds {
		c := mpStart(t, "churner", mpArgs{Spec: spec, Reconcile: time.Second, ResTimeout: 5 * time.Second, Seed: uint64(i)})
		m := c.expect("ready", 30*time.Second)
		time.Sleep(time.Duration(rng.IntN(5000)) * time.Microsecond)
		c.kill()
		snap, ok := mpWaitSnap(p, 2*time.Second, func(s Snapshot) bool {
			return !slices.ContainsFunc(s.Lanes, func(l LaneInfo) bool { return l.PID == m.PID })
		})
		if !ok {
			t.Fatalf("round %d: lane %d of the killed process not reclaimed in 2s", i, m.Lane)
		}
		if ks := mpKS(snap, mpKeyKilled); ks.Live != 0 || ks.Creating != 0 {
			t.Fatalf("round %d: lane %d was SIGKILLed and reclaimed, no resource of the key is left anywhere, yet the key counts live %d, creating %d: "+
				"a budget operation half done when the process died was not undone by the reclaim",
				i, m.Lane, ks.Live, ks.Creating)
		}
	}
	t.Logf("%d random kills, no budget lost", rounds)
}

// ---- g: leases outliving their owner ----

// mpRoleAcceptor registers a resource and accepts (and completes) the leases
// the parent sends it, replying with the status code.
func mpRoleAcceptor(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	defer p.Close()
	id, err := p.Register(c.args.Key, c.args.Cap)
	if err != nil {
		return err
	}
	c.send(mpMsg{Type: "ready", Lane: p.Lane(), PID: os.Getpid(), IDs: []ResourceID{id}, T: int64(p.Incarnation())})
	for m := range c.cmds {
		var l Lease
		if err := l.UnmarshalBinary(m.Lease); err != nil {
			return err
		}
		e, err := p.Accept(l)
		if err == nil {
			e.Complete()
		}
		c.send(mpMsg{Type: "accepted", N: int(mpCode(err)), Err: fmt.Sprint(err)})
	}
	return nil
}

// TestMultiProcessLeaseOnDeadOwnerIsStale: a lease on a resource whose owner
// was SIGKILLed is refused by the process that takes the owner's lane next,
// even pointed at the slot's new resource, and the dead owner's resource id is
// stale for Reserve.
func TestMultiProcessLeaseOnDeadOwnerIsStale(t *testing.T) {
	p, spec := mpOpenParent(t, Options{ReconcileInterval: 20 * time.Millisecond, ReservationTimeout: 5 * time.Second})
	args := mpArgs{Spec: spec, Reconcile: 20 * time.Millisecond, ResTimeout: 5 * time.Second, Key: mpKeyLease, Cap: 2}
	a := mpStart(t, "acceptor", args)
	am := a.expect("ready", 30*time.Second)
	old := am.IDs[0]
	l, err := p.Reserve(old)
	if err != nil {
		t.Fatal(err)
	}
	// The live owner takes a lease as a control.
	ctl, err := p.Reserve(old)
	if err != nil {
		t.Fatal(err)
	}
	a.send(mpMsg{Type: "accept", Lease: mpLeaseBytes(ctl)})
	if m := a.expect("accepted", 5*time.Second); byte(m.N) != mpOK {
		t.Fatalf("live owner refused a fresh lease: %s", m.Err)
	}
	a.kill()
	if _, ok := mpWaitSnap(p, 2*time.Second, func(s Snapshot) bool {
		return !slices.ContainsFunc(s.Lanes, func(li LaneInfo) bool { return li.PID == am.PID })
	}); !ok {
		t.Fatal("dead owner's lane not reclaimed")
	}
	if _, err := p.Reserve(old); !errors.Is(err, ErrStale) {
		t.Fatalf("reserve on the dead owner's resource: %v, want ErrStale", err)
	}
	b := mpStart(t, "acceptor", args)
	bm := b.expect("ready", 30*time.Second)
	fresh := bm.IDs[0]
	if fresh.Lane() != old.Lane() || fresh.Slot() != old.Slot() || fresh.Generation() == old.Generation() {
		t.Fatalf("the new owner's resource %v is not a new generation of %v's slot; the test needs it to be", fresh, old)
	}
	retarget := l
	retarget.ID = fresh
	reowned := retarget
	reowned.Owner = Incarnation(bm.T)
	for _, c := range []struct {
		name string
		l    Lease
	}{
		{"the lease as taken", l},
		{"the lease pointed at the slot's new resource", retarget},
		{"the lease pointed at the new resource and the new incarnation", reowned},
	} {
		b.send(mpMsg{Type: "accept", Lease: mpLeaseBytes(c.l)})
		if m := b.expect("accepted", 5*time.Second); byte(m.N) != mpStale {
			t.Errorf("lane %d's next process accepting %s: %s (code %d), want ErrStale", old.Lane(), c.name, m.Err, m.N)
		}
	}
	snap, _ := p.Snapshot()
	if ks := mpKS(snap, mpKeyLease); ks.Live != 1 || ks.InUse != 0 || ks.Pending != 0 {
		t.Errorf("key after the new owner refused the old leases: %+v", ks)
	}
	b.finish(10 * time.Second)
}
