package proxy

import (
	"errors"
	"fmt"
	"testing"
)

// Which errors wentAway takes as the upstream going away (and RoundTrip
// then backs off before it retries): every kind as the caller sees it,
// locally and through a sibling's unix leg, and nothing else.
func TestAdv65WentAwayKinds(t *testing.T) {
	gone := map[string]error{
		"local stream left out": &Error{Op: "roundtrip", RetrySafe: true, connGone: true, Err: ErrConnBroken},
		"relayed by an owner":   responseFrame{typ: frameError, flags: flagConnGone | flagNothingSent, msg: "upstream connection broken"}.ownerError(true),
		"lease refused as gone": &Error{Op: "lease", RetrySafe: true, beforeAccept: true,
			Err: fmt.Errorf("%w: %w: %s", ErrLeaseRefused, errLeaseGone, "x")},
		"GOAWAY at start": &Error{Op: "dial", RetrySafe: true, Err: fmt.Errorf("http2: a %w", errGoAwayAtStart)},
	}
	notGone := map[string]error{
		"refused stream":   &Error{Op: "roundtrip", RetrySafe: true, Err: ErrConnBroken},
		"owner busy":       &Error{Op: "lease", RetrySafe: true, Err: fmt.Errorf("%w: %w", ErrLeaseRefused, ErrOwnerBusy)},
		"owner leaving":    &Error{Op: "lease", RetrySafe: true, Err: fmt.Errorf("%w: %w", ErrLeaseRefused, errOwnerLeaving)},
		"relayed, no gone": responseFrame{typ: frameError, flags: flagNothingSent, msg: "x"}.ownerError(true),
		"dial":             &Error{Op: "dial", RetrySafe: true, Err: errors.New("connection refused")},
	}
	for name, err := range gone {
		if !wentAway(err) {
			t.Errorf("%s (%v): not taken as the upstream going away", name, err)
		}
	}
	for name, err := range notGone {
		if wentAway(err) {
			t.Errorf("%s (%v): taken as the upstream going away", name, err)
		}
	}
}
