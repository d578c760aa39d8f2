package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/ctrlmesh/ctrlmesh/proxy/internal/stop"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
	"github.com/ctrlmesh/ctrlmesh/proxy/webhook"
)

// Options of a running proxy; the ctrlmesh-proxy flags map onto them.
type Options struct {
	// Upstream is the real API server with the operator's credentials.
	Upstream *rest.Config
	// OwnCluster is the pod's own cluster, with the pod's credentials there: it
	// holds the pod's ShardRoute (watched, and the applied hash reported
	// into its status) and its shards' leader-election locks, which the
	// pod's agent reads. nil means Upstream. It differs when Upstream is
	// another API server (Fleet scope over the hub's objects); selectors,
	// mode detection and discovery still go to Upstream.
	OwnCluster *rest.Config
	// ListenAddress serves the operator's API requests, on loopback: only
	// containers of the pod reach it. Plain HTTP, or TLS with
	// OperatorServiceAccountDir.
	ListenAddress string
	// HealthAddress serves /healthz, /readyz and /metrics; "" disables.
	HealthAddress string
	// Pod is the pod's name, as the rules list it.
	Pod string
	// RulesFile, when set, is the static rules source.
	RulesFile string
	// RulesFileInterval is how often the file is checked for changes.
	RulesFileInterval time.Duration
	// RulesNamespace and RulesName name the ShardRoute to watch when no
	// RulesFile is given.
	RulesNamespace, RulesName string
	// Mode fixes the selector mode; "" detects it.
	Mode rules.Mode
	// OperatorKubeconfig, when set, receives a kubeconfig that points the
	// operator at ListenAddress with a client token (kept in StateDir, made
	// at start without one); the proxy then answers only requests that
	// carry it (401 otherwise).
	OperatorKubeconfig string
	// OperatorServiceAccountDir, when set, makes the proxy serve the
	// operator over TLS for in-cluster configuration (Environment and
	// Iptables interception): it receives the proxy's CA bundle, the client
	// token the proxy then requires as bearer token, and the pod's
	// namespace (RulesNamespace), as rest.InClusterConfig reads them.
	// Exclusive with OperatorKubeconfig.
	OperatorServiceAccountDir string
	// StateDir keeps, across restarts of the proxy alone, the client
	// token, the interception CA and the operator's watched streams (see
	// streamsFile); mounted in the proxy only, it lives as long as the pod.
	// Needed with OperatorServiceAccountDir; without it, a restarted proxy
	// makes a new token and counts its first rules applied at once.
	StateDir string
	// ServingNames are the addresses and DNS names the operator dials,
	// which the serving certificate names (with OperatorServiceAccountDir).
	ServingNames []string
	// WebhookListenAddress serves the admission webhook router (HTTPS with
	// the operator's certificate); "" disables it.
	WebhookListenAddress string
	// WebhookPeerPort is the port peers' routers listen on; 0 uses the port
	// of WebhookListenAddress.
	WebhookPeerPort int
	// WebhookCertDir is where the operator's webhook certificate is mounted
	// in this container; "" uses the rules' webhook.certDir.
	WebhookCertDir string
	// ForwardProxyAddress serves the operator's external HTTP and HTTPS
	// requests as a forward proxy (see ForwardProxy); "" disables it. It
	// must be a loopback IP address: the forward proxy reaches whatever
	// the pod's network does, with no credentials asked.
	ForwardProxyAddress string
	// Ready, when set, receives the addresses actually bound, once serving
	// (health and forward nil when disabled).
	Ready func(api, health, forward net.Addr)
	Log   logr.Logger
}

// Run serves until ctx ends.
func Run(ctx context.Context, opts Options) error {
	if (opts.RulesFile == "") == (opts.RulesName == "") {
		return errors.New("exactly one rules source is needed: a rules file, or the name of a ShardRoute")
	}
	if opts.Pod == "" {
		return errors.New("the pod name is needed: the rules assign buckets by pod")
	}
	// Every client of the proxy speaks HTTP/1.1, as its forwarding does
	// (newReverse): a sidecar that never runs Go's HTTP/2 client does not
	// pay for its code and buffers.
	opts.Upstream = http1Only(opts.Upstream)
	if opts.OwnCluster != nil {
		opts.OwnCluster = http1Only(opts.OwnCluster)
	}
	httpClient, err := rest.HTTPClientFor(opts.Upstream)
	if err != nil {
		return fmt.Errorf("upstream client: %w", err)
	}
	mapper, err := newDiscoveryMapper(opts.Upstream.Host, httpClient)
	if err != nil {
		return fmt.Errorf("discovery: %w", err)
	}
	scopes := rules.NewMapperScopes(mapper)
	// The pod's own cluster: its ShardRoute and its shards' locks.
	own := opts.OwnCluster
	if own == nil {
		own = opts.Upstream
	}
	// With an operator kubeconfig or service-account directory to write,
	// only a caller that read it may use the proxy: the token is in it and
	// nowhere else.
	var clientToken string
	var interception *InterceptionState
	var serving *tls.Config
	switch {
	case opts.OperatorServiceAccountDir != "" && opts.OperatorKubeconfig != "":
		return errors.New("an operator kubeconfig and an operator service-account directory exclude each other: the operator reaches the proxy one way")
	case opts.OperatorServiceAccountDir != "":
		if opts.StateDir == "" {
			return errors.New("the state directory is needed with an operator service-account directory: the proxy keeps its CA there")
		}
		if interception, err = LoadInterceptionState(opts.StateDir); err != nil {
			return err
		}
		if serving, err = interception.TLSConfig(opts.ServingNames); err != nil {
			return err
		}
		clientToken = interception.ClientToken
	case opts.OperatorKubeconfig != "":
		if clientToken, err = loadClientToken(opts.StateDir); err != nil {
			return err
		}
	}
	p, err := New(Config{Upstream: opts.Upstream, LockUpstream: opts.OwnCluster, Scopes: scopes, ClientToken: clientToken,
		ClientTokenBearer: interception != nil, StateDir: opts.StateDir, Log: opts.Log})
	if err != nil {
		return err
	}
	defer p.Stop()
	loader := &Loader{Proxy: p, Pod: opts.Pod, Scopes: scopes, Mode: opts.Mode, Upstream: opts.Upstream, Mapper: mapper, Log: opts.Log}

	apiListener, err := net.Listen("tcp", opts.ListenAddress)
	if err != nil {
		return fmt.Errorf("listening for the operator on %s: %w", opts.ListenAddress, err)
	}
	if serving != nil {
		apiListener = tls.NewListener(apiListener, serving)
	}
	servers := []*http.Server{{Handler: p, ReadHeaderTimeout: 10 * time.Second}}
	listeners := []net.Listener{apiListener}
	var healthAddr, forwardAddr net.Addr
	if opts.ForwardProxyAddress != "" {
		forward, err := forwardServer(ctx, p, opts)
		if err != nil {
			_ = apiListener.Close()
			return err
		}
		forwardListener, err := net.Listen("tcp", opts.ForwardProxyAddress)
		if err != nil {
			_ = apiListener.Close()
			return fmt.Errorf("listening as the operator's forward proxy on %s: %w", opts.ForwardProxyAddress, err)
		}
		forwardAddr = forwardListener.Addr()
		servers = append(servers, forward)
		listeners = append(listeners, forwardListener)
	}
	if opts.HealthAddress != "" {
		healthListener, err := net.Listen("tcp", opts.HealthAddress)
		if err != nil {
			for _, l := range listeners {
				_ = l.Close()
			}
			return fmt.Errorf("listening for probes on %s: %w", opts.HealthAddress, err)
		}
		healthAddr = healthListener.Addr()
		servers = append(servers, &http.Server{Handler: healthMux(p), ReadHeaderTimeout: 10 * time.Second})
		listeners = append(listeners, healthListener)
	}
	// Written before anything serves, so before /readyz passes and the
	// kubelet starts the operator containers.
	if interception != nil {
		if err := interception.WriteServiceAccountFiles(opts.OperatorServiceAccountDir, opts.RulesNamespace); err != nil {
			_ = apiListener.Close()
			return err
		}
	}
	if opts.OperatorKubeconfig != "" {
		if err := WriteOperatorKubeconfig(opts.OperatorKubeconfig, apiListener.Addr().String(), clientToken); err != nil {
			return err
		}
	}

	g, ctx := errgroup.WithContext(ctx)
	for i := range servers {
		g.Go(func() error {
			if err := servers[i].Serve(listeners[i]); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	g.Go(func() error {
		<-ctx.Done()
		return stop.Servers(servers, stop.Grace, opts.Log)
	})
	if opts.WebhookListenAddress != "" {
		g.Go(func() error {
			return webhook.Run(ctx, webhook.Options{
				Rules: p.RulesInForce, ListenAddress: opts.WebhookListenAddress, ListenPort: opts.WebhookPeerPort,
				CertDir: opts.WebhookCertDir, Log: opts.Log.WithName("webhook"), Registry: p.metrics.Registry,
			})
		})
	}
	if opts.RulesFile != "" {
		g.Go(func() error {
			RunFileSource(ctx, opts.RulesFile, opts.RulesFileInterval, loader)
			return nil
		})
	} else {
		source := &APISource{Config: own, Namespace: opts.RulesNamespace, Name: opts.RulesName, Loader: loader}
		g.Go(func() error { return source.Run(ctx) })
	}
	if opts.Ready != nil {
		opts.Ready(apiListener.Addr(), healthAddr, forwardAddr)
	}
	opts.Log.Info("proxy serving", "api", apiListener.Addr().String(), "forwardProxy", forwardAddr, "upstream", opts.Upstream.Host, "ownCluster", own.Host, "pod", opts.Pod)
	return g.Wait()
}

// forwardServer is the forward proxy's server, which refuses the API
// servers the proxy knows (Upstream, OwnCluster, the ServingNames the
// operator dials for them) and lives as long as ctx: its tunnels end with
// it.
func forwardServer(ctx context.Context, p *Proxy, opts Options) (*http.Server, error) {
	host, _, err := net.SplitHostPort(opts.ForwardProxyAddress)
	if ip, perr := netip.ParseAddr(host); err != nil || perr != nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("the forward proxy's address %q is not a loopback IP address and port: anything reaching it reaches what the pod's network does", opts.ForwardProxyAddress)
	}
	urls := []string{opts.Upstream.Host}
	if opts.OwnCluster != nil {
		urls = append(urls, opts.OwnCluster.Host)
	}
	api, err := NewAPIAddresses(ctx, urls, opts.ServingNames, func(ctx context.Context, host string) ([]netip.Addr, error) {
		return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	})
	if err != nil {
		return nil, err
	}
	return &http.Server{Handler: p.ForwardProxy(api), ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return ctx }}, nil
}

// http1Only returns a copy of cfg whose TLS connections offer only
// HTTP/1.1.
func http1Only(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.TLSClientConfig.NextProtos = []string{"http/1.1"}
	return c
}

func healthMux(p *Proxy) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		snap, refusal := p.RulesInForce()
		if refusal != "" {
			http.Error(w, "serving no shard: "+refusal, http.StatusServiceUnavailable)
			return
		}
		if snap == nil {
			http.Error(w, "rules not loaded", http.StatusServiceUnavailable)
			return
		}
		// "rules" is what the operator has taken up; "enforcing" what the
		// proxy enforces, ahead of it while the operator relists.
		applied, _ := p.Applied()
		appliedHash := "none"
		if applied != nil {
			appliedHash = applied.Hash()
		}
		_, _ = fmt.Fprintf(w, "ok: rules %s applied; enforcing %s (generation %d), shard %q\n", appliedHash, snap.Hash(), snap.Generation(), snap.Shard)
	})
	mux.Handle("/metrics", p.metrics.Registry)
	return mux
}

// WriteOperatorKubeconfig writes a kubeconfig that sends the operator to the
// proxy at addr, under the path of the proxy's client token
// (Config.ClientToken). It carries none of the operator's credentials: the
// proxy adds the operator's own.
func WriteOperatorKubeconfig(path, addr, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["ctrlmesh-proxy"] = &clientcmdapi.Cluster{Server: "http://" + addr + "/" + token}
	cfg.AuthInfos["operator"] = &clientcmdapi.AuthInfo{}
	cfg.Contexts["ctrlmesh-proxy"] = &clientcmdapi.Context{Cluster: "ctrlmesh-proxy", AuthInfo: "operator"}
	cfg.CurrentContext = "ctrlmesh-proxy"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("writing the operator kubeconfig %s: %w", path, err)
	}
	return os.Chmod(path, 0o644)
}
