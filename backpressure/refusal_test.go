package backpressure

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"
)

func TestRefusalFor(t *testing.T) {
	tests := []struct {
		err  error
		want Refusal
		ok   bool
	}{
		{ErrSaturated, Refusal{http.StatusServiceUnavailable, time.Second, ReasonSaturated}, true},
		{ErrQuotaExceeded, Refusal{http.StatusServiceUnavailable, time.Second, ReasonDraining}, true},
		{ErrDeadlineNear, Refusal{http.StatusServiceUnavailable, 0, ReasonDeadlineNear}, true},
		{ErrDeadlineElapsed, Refusal{http.StatusGatewayTimeout, 0, ReasonDeadlineElapsed}, true},
		{context.DeadlineExceeded, Refusal{http.StatusGatewayTimeout, 0, ReasonDeadlineElapsed}, true},
		{context.Canceled, Refusal{StatusClientClosedRequest, 0, ReasonClientCanceled}, true},
		{fmt.Errorf("forwarding: %w", ErrSaturated), Refusal{http.StatusServiceUnavailable, time.Second, ReasonSaturated}, true},
		{nil, Refusal{}, false},
		{errors.New("connection refused"), Refusal{}, false},
	}
	for _, tt := range tests {
		got, ok := RefusalFor(tt.err)
		if got != tt.want || ok != tt.ok {
			t.Errorf("RefusalFor(%v) = %+v, %v; want %+v, %v", tt.err, got, ok, tt.want, tt.ok)
		}
	}
}

func TestRetryAfterHeader(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{0, ""},
		{-time.Second, ""},
		{time.Second, "1"},
		{1500 * time.Millisecond, "2"},
		{time.Millisecond, "1"},
	}
	for _, tt := range tests {
		if got := (Refusal{RetryAfter: tt.d}).RetryAfterHeader(); got != tt.want {
			t.Errorf("RetryAfterHeader for %v = %q, want %q", tt.d, got, tt.want)
		}
	}
}
