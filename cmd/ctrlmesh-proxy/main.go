// Command ctrlmesh-proxy is the sidecar that shards an unmodified operator.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/version"
	"github.com/ctrlmesh/ctrlmesh/proxy"
	"github.com/ctrlmesh/ctrlmesh/proxy/redirect"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

func main() {
	// SIGTERM (the kubelet stopping the pod) and SIGINT end the proxy
	// gracefully.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	cmd, args := commandFor(os.Args[1:], proxy.Run, applyRedirect)
	err := cmd.execute(ctx, args, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		os.Exit(1)
	}
}

// commandFor is the command args name, with the arguments left for it:
// "redirect ..." is the init container of Iptables interception, anything
// else the proxy.
func commandFor(args []string, run runFunc, apply applyFunc) (*command, []string) {
	if len(args) > 0 && args[0] == ctrlmeshv1alpha1.RedirectCommand {
		return newRedirectCommand(apply), args[1:]
	}
	return newCommand(run), args
}

// runFunc runs the proxy: proxy.Run, or a stand-in in tests of the command
// line.
type runFunc func(context.Context, proxy.Options) error

// command is the command line: its flags, and what runs once they are
// parsed. It is plain pflag, not a command framework: a sidecar in every
// operator pod has one command, and pays in memory for every package it
// links.
type command struct {
	flags *pflag.FlagSet
	// usage is the help text above the flags.
	usage string
	run   func(ctx context.Context) error
}

// usage is the command's help text, above its flags.
const usage = `ctrlmesh-proxy: makes one operator pod see, write and lead only its shard

Usage: ctrlmesh-proxy [flags]

ctrlmesh-proxy runs next to an operator container, between the operator and
kube-apiserver. Point the operator's kubeconfig at --listen-address (see
--operator-kubeconfig). The proxy then:

  - narrows list and watch of the resources the rules shard to the pod's
    buckets: server-side with KEP-5866 shardSelector where kube-apiserver
    supports it, else with the ctrlmesh.io/sharding-hash label; in range
    mode a response is handed on only once proven sharded: from a
    kube-apiserver without the ShardedListAndWatch gate the operator gets
    503s, never other shards' objects;
  - refuses every write (create, update, patch, delete, deletecollection,
    subresources, dry runs, server-side apply) in namespaces outside the
    shard, and of Namespaces it does not serve (403, naming the bucket and
    its owner);
  - renames the leader-election lock to <name>---<shard> in the ShardRoute's
    namespace and where the pod may write anyway;
  - stops serving when its ShardRoute is deleted (sharded reads 503, writes
    403) until it is back; to run the operator without ctrlmesh, remove the
    ` + ctrlmeshv1alpha1.EnableProxyLabel + ` label from its pod template and restart it;
  - with --webhook-listen-address, sends each admission request to the pod
    whose shard owns the object's namespace (never answering on its own);
  - serves the operator's external HTTP and HTTPS requests as a forward
    proxy on --forward-proxy-address (HTTP_PROXY, HTTPS_PROXY), under the
    same traffic policies (deny rules, rate limits, circuit breakers,
    faults), matched by host; it refuses the API server;
  - reloads rules without restarts, ending affected watches with 410 Expired
    so informers relist.

Upstream it uses verified TLS and the operator's own credentials: in-cluster
service-account credentials, or --upstream-kubeconfig. When the upstream is
another API server than the pod's own (Fleet scope over the hub's objects),
--rules-kubeconfig names the pod's own cluster, where its ShardRoute and its
shards' leader-election locks live.`

// execute parses args and runs the proxy until ctx ends. --help and
// --version print to stdout and return nil; errors are printed to stderr
// and returned.
func (c *command) execute(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c.flags.SetOutput(stderr)
	err := c.flags.Parse(args)
	switch {
	case errors.Is(err, pflag.ErrHelp):
		_, _ = fmt.Fprintf(stdout, "%s\n\nFlags:\n%s", c.usage, c.flags.FlagUsages())
		return nil
	case err != nil:
	case c.flags.NArg() > 0:
		err = fmt.Errorf("unexpected arguments: %v", c.flags.Args())
	case c.version():
		_, _ = fmt.Fprintln(stdout, "ctrlmesh-proxy version", version.Version)
		return nil
	default:
		err = c.run(ctx)
	}
	if err != nil {
		_, _ = fmt.Fprintln(stderr, "Error:", err)
	}
	return err
}

func (c *command) version() bool {
	v, _ := c.flags.GetBool("version")
	return v
}

// newCommand builds the command line. Flag defaults that come from the
// environment (POD_NAME, POD_NAMESPACE) are read when it is built.
func newCommand(run runFunc) *command {
	opts := proxy.Options{}
	var upstreamKubeconfig, rulesKubeconfig, mode, cpuProfile string
	zapOpts := zap.Options{}
	f := pflag.NewFlagSet("ctrlmesh-proxy", pflag.ContinueOnError)
	cmd := &command{
		flags: f,
		usage: usage,
		run: func(ctx context.Context) error {
			log := zap.New(zap.UseFlagOptions(&zapOpts))
			upstream, err := loadKubeconfig(upstreamKubeconfig)
			if err != nil {
				return fmt.Errorf("upstream credentials: %w", err)
			}
			if rulesKubeconfig != "" {
				if opts.OwnCluster, err = loadKubeconfig(rulesKubeconfig); err != nil {
					return fmt.Errorf("rules cluster credentials: %w", err)
				}
			}
			switch rules.Mode(mode) {
			case rules.ModeRange, rules.ModeLabel:
				opts.Mode = rules.Mode(mode)
			case "auto":
			default:
				return fmt.Errorf("--selector-mode must be auto, range or label, not %q", mode)
			}
			if opts.RulesNamespace == "" && opts.RulesFile == "" {
				return fmt.Errorf("--pod-namespace (or POD_NAMESPACE) is needed to find the ShardRoute %q", opts.RulesName)
			}
			opts.Upstream = upstream
			opts.Log = log
			if cpuProfile != "" {
				return profiled(cpuProfile, func() error { return run(ctx, opts) })
			}
			return run(ctx, opts)
		},
	}
	f.Bool("version", false, "print the version and exit")
	f.StringVar(&opts.ListenAddress, ctrlmeshv1alpha1.ProxyFlagListenAddress, fmt.Sprintf("127.0.0.1:%d", ctrlmeshv1alpha1.ProxyListenPort), "address serving the operator's API requests (plain HTTP; keep it on loopback)")
	// Off unless asked for, as the injector does (127.0.0.1:15082, where it
	// points the operator's HTTP_PROXY): proxies run side by side outside
	// pods (tests, the process-based local fleet) would otherwise contend
	// for one port.
	f.StringVar(&opts.ForwardProxyAddress, ctrlmeshv1alpha1.ProxyFlagForwardProxyAddress, "", fmt.Sprintf("address serving the operator's external HTTP and HTTPS requests as a forward proxy, under the traffic policies (a loopback IP address; the API server is refused there); the injector sets 127.0.0.1:%d; empty disables", ctrlmeshv1alpha1.ProxyForwardPort))
	f.StringVar(&opts.HealthAddress, ctrlmeshv1alpha1.ProxyFlagHealthAddress, fmt.Sprintf(":%d", ctrlmeshv1alpha1.ProxyHealthPort), "address serving /healthz, /readyz and /metrics; empty disables")
	f.StringVar(&upstreamKubeconfig, "upstream-kubeconfig", "", "kubeconfig with the operator's own credentials for the real API server; empty uses in-cluster credentials")
	f.StringVar(&rulesKubeconfig, "rules-kubeconfig", "", "kubeconfig for this pod's own cluster, which holds its ShardRoute and its shards' leader-election locks, when --upstream-kubeconfig points at another API server (Fleet scope over the hub's objects); empty: the upstream")
	f.StringVar(&opts.Pod, "pod-name", os.Getenv(ctrlmeshv1alpha1.ProxyEnvPodName), "name of this pod, as the rules list it (default $POD_NAME)")
	f.StringVar(&opts.RulesNamespace, "pod-namespace", os.Getenv(ctrlmeshv1alpha1.ProxyEnvPodNamespace), "namespace of this pod and of its ShardRoute (default $POD_NAMESPACE)")
	f.StringVar(&opts.RulesName, ctrlmeshv1alpha1.ProxyFlagRulesName, "", "name of the ShardRoute to enforce, watched through the API server (read-only), applied hash reported into its status")
	f.StringVar(&opts.RulesFile, "rules-file", "", "static rules: a ShardRoute in YAML or JSON, reloaded when it changes (instead of --rules-name)")
	f.DurationVar(&opts.RulesFileInterval, "rules-file-interval", time.Second, "how often --rules-file is checked for changes")
	f.StringVar(&mode, "selector-mode", "auto", "how list and watch are narrowed: range (KEP-5866 shardSelector; every kube-apiserver needs the ShardedListAndWatch gate, or sharded reads are refused), label (ctrlmesh.io/sharding-hash), or auto (ask the API server)")
	f.StringVar(&opts.OperatorKubeconfig, ctrlmeshv1alpha1.ProxyFlagOperatorKubeconfig, "", "write a kubeconfig pointing at --listen-address to this path, for the operator")
	f.StringVar(&opts.OperatorServiceAccountDir, ctrlmeshv1alpha1.ProxyFlagOperatorServiceAccountDir, "", "serve the operator over TLS for in-cluster configuration: write the proxy's CA bundle (ca.crt), the client token it then requires (token) and the namespace into this directory, mounted in the operator containers at /var/run/secrets/kubernetes.io/serviceaccount (instead of --operator-kubeconfig)")
	f.StringVar(&opts.StateDir, ctrlmeshv1alpha1.ProxyFlagStateDir, "", "directory, mounted in the proxy only and living as long as the pod, keeping across the proxy's own restarts the operator's client token, the interception CA and the operator's watched streams (so a restarted proxy's first rules count as applied once those have relisted); needed with --"+ctrlmeshv1alpha1.ProxyFlagOperatorServiceAccountDir)
	f.StringSliceVar(&opts.ServingNames, ctrlmeshv1alpha1.ProxyFlagServingNames, nil, "IP addresses and DNS names the operator dials, for the serving certificate (with --"+ctrlmeshv1alpha1.ProxyFlagOperatorServiceAccountDir+")")
	f.StringVar(&opts.WebhookListenAddress, ctrlmeshv1alpha1.ProxyFlagWebhookListenAddress, "", "address serving the operator's admission webhooks (HTTPS with the operator's certificate): each request goes to the pod whose shard owns the object's namespace; point the webhook Service's targetPort here; empty disables")
	f.IntVar(&opts.WebhookPeerPort, "webhook-peer-port", 0, "port the other pods' webhook routers listen on; 0 uses the port of --webhook-listen-address")
	f.StringVar(&opts.WebhookCertDir, ctrlmeshv1alpha1.ProxyFlagWebhookCertDir, "", "where the operator's webhook certificate (tls.crt, tls.key, optional ca.crt) is mounted in this container; empty uses the rules' webhook.certDir")
	f.StringVar(&cpuProfile, "cpu-profile", "", "write a CPU profile (pprof) of the whole run to this file, complete once the proxy stops (SIGTERM); for measuring the proxy (make bench-proxy BENCH_ARGS=-proxy-cpuprofile=...); empty profiles nothing. It opens no port")
	logFlags := flag.NewFlagSet("log", flag.ContinueOnError)
	zapOpts.BindFlags(logFlags)
	f.AddGoFlagSet(logFlags)
	return cmd
}

// profiled runs f under Go's CPU profiler, writing the profile to path
// once f returns. The profile is taken in the process, into a file: no
// port is opened for it (a sidecar's profiling endpoint would be reachable
// by everything in the pod's network namespace).
func profiled(path string, f func() error) (err error) {
	out, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--cpu-profile: %w", err)
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		_ = out.Close()
		return fmt.Errorf("--cpu-profile: %w", err)
	}
	defer func() {
		pprof.StopCPUProfile()
		if cerr := out.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("--cpu-profile: %w", cerr))
		}
	}()
	return f()
}

// applyRedirect programs the redirection in this process's network
// namespace: redirect.Apply, or a stand-in in tests of the command line.
type applyFunc func(redirect.Options) error

func applyRedirect(opts redirect.Options) error {
	conn, err := nftables.New()
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	return redirect.Apply(conn, opts)
}

// redirectUsage is the help text of "ctrlmesh-proxy redirect".
const redirectUsage = `ctrlmesh-proxy redirect: the init container of Iptables interception (needs NET_ADMIN)

Usage: ctrlmesh-proxy redirect [flags]

redirect writes netfilter (nftables) rules into the pod's network namespace
that send every TCP connection to the --destination addresses (the API
server's Service and endpoints) to 127.0.0.1:--to-port, where the proxy
serves, except connections of the user --exclude-uid (the proxy's own).
It exits once the rules are in force, and fails on any error, so that the
kubelet starts neither the proxy nor the operator.`

// newRedirectCommand is "ctrlmesh-proxy redirect", the init container of
// Iptables interception. main runs it when the first argument is
// ctrlmeshv1alpha1.RedirectCommand.
func newRedirectCommand(apply applyFunc) *command {
	var destinations []string
	var toPort, excludeUID uint32
	f := pflag.NewFlagSet("ctrlmesh-proxy "+ctrlmeshv1alpha1.RedirectCommand, pflag.ContinueOnError)
	f.StringArrayVar(&destinations, ctrlmeshv1alpha1.RedirectFlagDestination, nil, "IPv4 address:port to redirect (repeat for each)")
	f.Uint32Var(&toPort, ctrlmeshv1alpha1.RedirectFlagToPort, ctrlmeshv1alpha1.ProxyListenPort, "the proxy's port on 127.0.0.1")
	f.Uint32Var(&excludeUID, ctrlmeshv1alpha1.RedirectFlagExcludeUserID, ctrlmeshv1alpha1.ProxyUserID, "user ID of the proxy, whose connections are not redirected")
	return &command{
		flags: f,
		usage: redirectUsage,
		run: func(context.Context) error {
			opts := redirect.Options{ExcludeUserID: excludeUID}
			if toPort > 65535 {
				return fmt.Errorf("--%s %d is not a port", ctrlmeshv1alpha1.RedirectFlagToPort, toPort)
			}
			opts.ToPort = uint16(toPort)
			for _, d := range destinations {
				addr, err := redirect.ParseDestination(d)
				if err != nil {
					return err
				}
				opts.Destinations = append(opts.Destinations, addr)
			}
			if err := apply(opts); err != nil {
				return fmt.Errorf("redirecting the API server's connections to the proxy: %w", err)
			}
			fmt.Printf("redirecting %v to 127.0.0.1:%d, except user %d\n", opts.Destinations, opts.ToPort, opts.ExcludeUserID)
			return nil
		},
	}
}

// loadKubeconfig loads the kubeconfig at path; "" uses in-cluster
// credentials.
func loadKubeconfig(path string) (*rest.Config, error) {
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: path}, &clientcmd.ConfigOverrides{}).ClientConfig()
}
