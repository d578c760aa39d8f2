// Package stop stops the proxy's HTTP servers: gracefully within a grace,
// then closing what is still open.
package stop

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/go-logr/logr"
)

// Grace is how long the proxy's servers wait, once stopped, for the
// requests in flight to end before closing what is still open.
const Grace = 5 * time.Second

// Servers stops servers gracefully within grace, then closes the
// connections still open: an operator's watches run until the proxy goes,
// and a client's connection that never sent a request counts as busy for
// its first 5 s (net/http), so a graceful stop alone ran out its time and
// the proxy exited with "context deadline exceeded" for what is no error.
func Servers(servers []*http.Server, grace time.Duration, log logr.Logger) error {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	var errs []error
	for _, s := range servers {
		err := s.Shutdown(ctx)
		if errors.Is(err, context.DeadlineExceeded) {
			log.Info("closing the connections still open after the stop's grace", "grace", grace)
			err = s.Close()
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
