package localfleet

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"k8s.io/client-go/tools/clientcmd"
)

// Relay is a fault-injecting TCP relay in front of an API server: a
// toxiproxy proxy run in this process (no toxiproxy server, no API). With
// Options.Relays, each agent reaches the hub and each pod's proxy reaches its
// upstream API server through one, and a test cuts, heals or drops that one
// link while everything else stays up. TLS passes through it untouched: the
// API servers' certificates name 127.0.0.1, where every relay listens.
type Relay struct {
	// Name says which link it carries, such as "agent member2 -> hub".
	Name  string
	proxy *toxiproxy.Proxy
}

// relayServer holds the relays' toxic collections; its HTTP API is never
// started.
var relayServer = sync.OnceValue(func() *toxiproxy.ApiServer {
	return toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
})

// startRelay listens on a free loopback port and relays to upstream
// (host:port).
func startRelay(name, upstream string) (*Relay, error) {
	p := toxiproxy.NewProxy(relayServer(), name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("localfleet: relay %s: %w", name, err)
	}
	return &Relay{Name: name, proxy: p}, nil
}

// relayedURL is server (an https URL) with its host and port replaced by the
// relay's.
func (r *Relay) relayedURL(server string) (string, error) {
	u, err := url.Parse(server)
	if err != nil {
		return "", fmt.Errorf("localfleet: relay %s: server %q: %w", r.Name, server, err)
	}
	u.Host = r.Addr()
	return u.String(), nil
}

// Addr is where the relay listens, host:port.
func (r *Relay) Addr() string {
	r.proxy.Lock()
	defer r.proxy.Unlock()
	return r.proxy.Listen
}

// Cut partitions the link: connections stay open and new ones are
// accepted, but no byte passes either way (toxiproxy's timeout toxic with no
// timeout), as when a network drops the packets. Clients notice only by
// their own timeouts. Heal ends it.
func (r *Relay) Cut() error {
	for _, stream := range []string{"upstream", "downstream"} {
		if err := r.addToxic(fmt.Sprintf(`{"name":"cut-%s","type":"timeout","stream":%q,"toxicity":1,"attributes":{"timeout":0}}`, stream, stream)); err != nil {
			return err
		}
	}
	return nil
}

// DelayResponses delays every byte from the server to its clients by
// latency (toxiproxy's latency toxic downstream): responses and watch events
// arrive late, requests on time, as over a slow link. Heal ends it.
func (r *Relay) DelayResponses(latency time.Duration) error {
	return r.addToxic(fmt.Sprintf(`{"name":"delay","type":"latency","stream":"downstream","toxicity":1,"attributes":{"latency":%d}}`, latency.Milliseconds()))
}

func (r *Relay) addToxic(toxic string) error {
	if _, err := r.proxy.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
		return fmt.Errorf("localfleet: relay %s: adding toxic %s: %w", r.Name, toxic, err)
	}
	return nil
}

// Heal ends a Cut or a DelayResponses. Connections that lost bytes
// meanwhile break (their TLS records no longer line up) and the clients
// dial again.
func (r *Relay) Heal() {
	r.proxy.Toxics.ResetToxics(context.Background())
}

// Drop closes every connection through the relay and refuses new ones for
// down, then relays again on the same port: what a restart of the API server
// behind it looks like to its clients (watches end, dials fail, then
// succeed), without losing the API server's state.
func (r *Relay) Drop(down time.Duration) error {
	r.proxy.Stop()
	time.Sleep(down)
	if err := r.proxy.Start(); err != nil {
		return fmt.Errorf("localfleet: relay %s: listening again after a drop: %w", r.Name, err)
	}
	return nil
}

// stop ends the relay and its connections.
func (r *Relay) stop() { r.proxy.Stop() }

// relay starts a relay named name in front of the API server at server (an
// https URL).
func (f *Fleet) relay(name, server string) (*Relay, error) {
	u, err := url.Parse(server)
	if err != nil {
		return nil, fmt.Errorf("localfleet: relay %s: server %q: %w", name, server, err)
	}
	return startRelay(name, u.Host)
}

// relayedKubeconfig writes a copy of the kubeconfig at path whose servers
// are the relay's, to out.
func (r *Relay) relayedKubeconfig(path, out string) error {
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return fmt.Errorf("localfleet: relay %s: %w", r.Name, err)
	}
	for _, c := range cfg.Clusters {
		if c.Server, err = r.relayedURL(c.Server); err != nil {
			return err
		}
	}
	if err := clientcmd.WriteToFile(*cfg, out); err != nil {
		return fmt.Errorf("localfleet: relay %s: %w", r.Name, err)
	}
	return nil
}

// skewedClock is an agent's clock: the real one plus a skew that
// SkewAgentClock changes while the agent runs.
type skewedClock struct {
	skew atomic.Int64
}

func (c *skewedClock) Now() time.Time                  { return time.Now().Add(time.Duration(c.skew.Load())) }
func (c *skewedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
