package fleet

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

func adv11Want(t *testing.T, loads <-chan []byte, who, v string) {
	t.Helper()
	b, ok := adv9Loaded(loads, 5*time.Second)
	if !ok || !strings.Contains(string(b), `"v":"`+v+`"`) {
		t.Fatalf("%s: want a load of v=%s, got %q (%v)", who, v, b, ok)
	}
}

// TestAdv11RetryDuringReloadDoesNotSpin: a retry of the workers that
// refused the fleet's configuration, due while a reload is under way, waits
// its turn again. A reload that every worker accepted in between reset the
// retry delay to 0: the retry must not then be re-armed at once, over and
// over, spinning the supervisor's loop for as long as the reload lasts.
func TestAdv11RetryDuringReloadDoesNotSpin(t *testing.T) {
	hold, release := heldLoads(t)
	// Worker 0 holds its third load; worker 1 refuses its first.
	l := newAdv9Loop(t, adminScript{holdFrom: 3, hold: hold}, adminScript{refuse: 1})
	s, admin := l.s, l.admin
	const retryMin = 400 * time.Millisecond
	s.retryMin = retryMin
	for _, w := range s.workers {
		w.ready = true
	}
	l.start()
	defer l.stop(t)
	reload := func(v string) {
		t.Helper()
		if err := os.WriteFile(s.configFile, []byte(`{"apps":{"v":"`+v+`"}}`), 0o600); err != nil {
			t.Fatal(err)
		}
		l.send(event{kind: evSignal, sig: syscall.SIGHUP})
	}
	// Reload 2: worker 0 accepts, worker 1 refuses: a retry is due in
	// retryMin.
	reload("2")
	adv11Want(t, admin[0], "worker 0", "2")
	adv11Want(t, admin[1], "worker 1", "2")
	// Reload 3: both accept (the retry delay goes back to 0; the retry is
	// still due). Reload 4: worker 0 holds its answer past the retry.
	reload("3")
	adv11Want(t, admin[0], "worker 0", "3")
	adv11Want(t, admin[1], "worker 1", "3")
	reload("4")
	adv11Want(t, admin[0], "worker 0", "4")
	adv11Want(t, admin[1], "worker 1", "4")

	// Count the retries the loop sees while reload 4 is under way, taking
	// each event from the queue and putting it back.
	var retries int
	end := time.Now().Add(3 * retryMin)
	for time.Now().Before(end) {
		select {
		case ev := <-s.events:
			if ev.kind == evRetryRefused {
				retries++
			}
			s.events <- ev
		case <-time.After(5 * time.Millisecond):
		}
	}
	release()
	if retries > 4 {
		t.Errorf("the loop saw %d retry events in %s while a reload was under way; want at most one every %s", retries, 3*retryMin, retryMin)
	}
}
