// Package leaderelection gives a component's leader election a client of
// its own, apart from its controllers' client.
//
// controller-runtime's manager builds its leader-election client from the
// manager's rest.Config unless given one: the elector then takes the
// controllers' client-side limit (a hub run with a small --kube-api-qps
// cannot renew its Lease in time and steps down) and shares their
// connection to the API server (client-go caches one transport per TLS
// configuration, so a renewal waits behind thousands of Work writes on one
// HTTP/2 connection). A leader that cannot renew within its RenewDeadline
// stops, as it must; its renewals should wait on nothing but the API server.
package leaderelection

import (
	"net"
	"time"

	"k8s.io/client-go/rest"
)

// QPS and Burst of the elector's own client-side limit. The elector sends
// at most a GET and an UPDATE of its Lease per retry period (2 s by
// controller-runtime's default), and Events when it gains or loses the
// lead; client-go's own default (5 per second, bursts of 10) is ample.
const (
	QPS   = rest.DefaultQPS
	Burst = rest.DefaultBurst
)

// Config is the rest.Config for component's leader election (give it to
// manager.Options.LeaderElectionConfig), made from cfg, the component's
// own config, which is not changed:
//   - its own client-side limit, QPS and Burst, whatever cfg's;
//   - its own connection: a dialer of its own makes client-go build it a
//     transport of its own instead of reusing the cached one of cfg's
//     TLS configuration (unless cfg brings its own Transport, which it
//     keeps);
//   - a User-Agent of its own, component/leader-election once
//     controller-runtime appended its suffix, so that the API server's
//     logs, audit and priority and fairness can tell it apart.
func Config(cfg *rest.Config, component string) *rest.Config {
	out := rest.CopyConfig(cfg)
	out.QPS, out.Burst, out.RateLimiter = QPS, Burst, nil
	out.UserAgent = component
	if out.Dial == nil && out.Transport == nil {
		// client-go's default dialer; a Dial of its own keys a transport of
		// its own.
		out.Dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	return out
}
