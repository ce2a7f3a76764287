package proxy

import (
	"errors"
	"fmt"

	"go.uber.org/zap"
)

// errPanic marks an exchange that ended because one of its goroutines
// panicked. Like net/http's server with a handler, the process recovers:
// one bad exchange must not take a Caddy worker and everything in flight in
// it down.
var errPanic = errors.New("proxy: panic in exchange")

// recovered logs a recovered panic with the stack that raised it (it is
// called from the deferred function, so the stack still holds the panicking
// frames) and returns it as an error for the exchange. Each recovery point
// logs what it recovered and no other, so a stack is logged once.
func recovered(log *zap.Logger, where string, p any) error {
	if log == nil {
		log = zap.NewNop()
	}
	log.Error("recovered panic in "+where, zap.Any("panic", p), zap.Stack("stack"))
	return fmt.Errorf("%w: %s: %v", errPanic, where, p)
}
