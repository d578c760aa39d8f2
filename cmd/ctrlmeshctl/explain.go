package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/placementview"
	ctrlmeshscheme "github.com/ctrlmesh/ctrlmesh/pkg/scheme"
)

// maxEvents bounds the events explain prints per object.
const maxEvents = 5

func newExplainCommand() *cobra.Command {
	var kubeconfig, namespace, memberKubeconfig string
	cmd := &cobra.Command{
		Use:   "explain (<namespace> | <resource>/<name> -n <namespace>)",
		Short: "Say which shard, cluster, pods and leader serve a namespace or an object",
		Long: `explain answers "who owns this?" from the hub: for every ShardingConfig
that shards the namespace (or the object's namespace, for an object of a
resource its limits name), the namespace's bucket, and in every placement
domain (each cluster in PerCluster scope, the fleet in Fleet scope) the shard
that serves it, with its cluster, pods, leader, state and health, whether a
handover is in flight, and the ShardingConfig's last events. The bucket and
the owner are computed by pkg/sharding, as the proxies compute them.

It reads only the hub; with --member-kubeconfig it also prints the last
events of the namespace or object in that member cluster.`,
		Example: `  ctrlmeshctl explain team-a --kubeconfig hub.kubeconfig
  ctrlmeshctl explain configmaps/settings -n team-a --member-kubeconfig member1.kubeconfig
  kubectl ctrlmesh explain team-a`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			target, err := parseExplainTarget(args[0], namespace)
			if err != nil {
				return err
			}
			hub, err := newClient(kubeconfig)
			if err != nil {
				return fmt.Errorf("hub: %w", err)
			}
			var member client.Client
			if memberKubeconfig != "" {
				if member, err = newClient(memberKubeconfig); err != nil {
					return fmt.Errorf("member: %w", err)
				}
			}
			return explain(cmd.Context(), cmd.OutOrStdout(), hub, member, target)
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the hub; empty uses $KUBECONFIG or ~/.kube/config")
	f.StringVarP(&namespace, "namespace", "n", "", "namespace of the object (with <resource>/<name>)")
	f.StringVar(&memberKubeconfig, "member-kubeconfig", "", "kubeconfig of a member cluster whose events of the namespace or object to print too")
	return cmd
}

// explainTarget is a namespace, or an object of a resource in one.
type explainTarget struct {
	Namespace string
	// Resource (as typed, such as "configmaps" or "configmap") and Name
	// are empty for a namespace.
	Resource, Name string
}

func parseExplainTarget(arg, namespace string) (explainTarget, error) {
	resource, name, isObject := strings.Cut(arg, "/")
	if !isObject {
		if errs := validation.IsDNS1123Label(arg); len(errs) > 0 {
			return explainTarget{}, fmt.Errorf("%q is not a namespace name (%s); name an object as <resource>/<name> -n <namespace>", arg, strings.Join(errs, "; "))
		}
		if namespace != "" && namespace != arg {
			return explainTarget{}, fmt.Errorf("explain %s -n %s: name the namespace once", arg, namespace)
		}
		return explainTarget{Namespace: arg}, nil
	}
	if resource == "" || name == "" || strings.Contains(name, "/") {
		return explainTarget{}, fmt.Errorf("%q is not <resource>/<name>", arg)
	}
	if namespace == "" {
		return explainTarget{}, fmt.Errorf("explain %s needs the object's namespace: -n <namespace>", arg)
	}
	return explainTarget{Namespace: namespace, Resource: strings.ToLower(resource), Name: name}, nil
}

func newClient(kubeconfig string) (client.Client, error) {
	loading := clientcmd.NewDefaultClientConfigLoadingRules()
	loading.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(loading, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	scheme, err := ctrlmeshscheme.New()
	if err != nil {
		return nil, err
	}
	return client.New(cfg, client.Options{Scheme: scheme})
}

// limitsName reports whether limits name resource (plural or singular, any
// group; "*" names every resource).
func limitsName(limits ctrlmeshv1alpha1.Limits, resource string) bool {
	for _, l := range limits {
		for _, g := range l.RelateResources {
			for _, r := range g.Resources {
				if r == "*" || r == resource || strings.TrimSuffix(r, "s") == resource || r == resource+"es" {
					return true
				}
			}
		}
	}
	return false
}

func explain(ctx context.Context, w io.Writer, hub, member client.Client, target explainTarget) error {
	var configs ctrlmeshv1alpha1.ShardingConfigList
	if err := hub.List(ctx, &configs); err != nil {
		return fmt.Errorf("listing the ShardingConfigs on the hub: %w", err)
	}
	what := "namespace " + target.Namespace
	if target.Resource != "" {
		what = fmt.Sprintf("%s/%s in namespace %s", target.Resource, target.Name, target.Namespace)
	}
	fmt.Fprintf(w, "%s\n", what)
	if slices.Contains(ctrlmeshv1alpha1.SystemNamespaces(), target.Namespace) {
		fmt.Fprintf(w, "%s is a system namespace: no ShardingConfig shards it; every operator pod sees its objects.\n", target.Namespace)
		return nil
	}
	slices.SortFunc(configs.Items, func(a, b ctrlmeshv1alpha1.ShardingConfig) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	shown := 0
	var errs []error
	for i := range configs.Items {
		sc := &configs.Items[i]
		if target.Resource != "" && !limitsName(sc.Spec.Limits, target.Resource) {
			continue
		}
		shown++
		if err := explainConfig(ctx, w, hub, sc, target.Namespace); err != nil {
			errs = append(errs, err)
		}
	}
	if shown == 0 {
		if target.Resource != "" {
			fmt.Fprintf(w, "no ShardingConfig's limits name %s: its objects are not sharded, and every pod of an operator sees them.\n", target.Resource)
		} else {
			fmt.Fprintln(w, "no ShardingConfig on the hub.")
		}
	}
	if member != nil {
		if err := memberEvents(ctx, w, member, target); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func explainConfig(ctx context.Context, w io.Writer, hub client.Client, sc *ctrlmeshv1alpha1.ShardingConfig, namespace string) error {
	scope := sc.Spec.Scope
	if scope == "" {
		scope = ctrlmeshv1alpha1.ScopePerCluster
	}
	view, err := placementview.New(sc)
	if err != nil {
		fmt.Fprintf(w, "\nShardingConfig %s/%s: %v\n", sc.Namespace, sc.Name, err)
		return err
	}
	bucket, owners := view.OwnersOf(namespace)
	fmt.Fprintf(w, "\nShardingConfig %s/%s (%s, %d buckets): bucket %d\n", sc.Namespace, sc.Name, scope, view.Space.Buckets(), bucket)
	for _, t := range []string{ctrlmeshv1alpha1.ConditionReady, ctrlmeshv1alpha1.ConditionDegraded} {
		if c := meta.FindStatusCondition(sc.Status.Conditions, t); c != nil {
			fmt.Fprintf(w, "  %s=%s (%s) %s\n", c.Type, c.Status, c.Reason, c.Message)
		}
	}
	handover := false
	if c := meta.FindStatusCondition(sc.Status.Conditions, ctrlmeshv1alpha1.ConditionDegraded); c != nil && c.Reason == ctrlmeshv1alpha1.ReasonHandoverPending {
		handover = true
	}
	if len(owners) == 0 {
		fmt.Fprintln(w, "  no shards placed: nobody serves it")
	} else {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  CLUSTER\tSHARD\tPODS\tLEADER\tSTATE\tHEALTH\tHANDOVER")
		for _, o := range owners {
			if o.Shard == nil {
				fmt.Fprintf(tw, "  %s\t-\t-\t-\tunowned\t-\t-\n", dash(o.Cluster))
				continue
			}
			p := o.Shard
			// A handover is in flight for this owner when its shard waits
			// for buckets (Pending) or gives them up (Draining).
			inFlight := "no"
			switch {
			case p.State == ctrlmeshv1alpha1.ShardPending:
				inFlight = "yes: shard waits for its buckets"
			case p.State == ctrlmeshv1alpha1.ShardDraining:
				inFlight = "yes: shard gives its buckets up"
			case handover:
				inFlight = "elsewhere in the config"
			}
			shard := p.Shard
			if p.Canary {
				shard += " (canary)"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Cluster, shard, dash(strings.Join(p.Pods, ",")), dash(p.Leader), p.State, p.Health, inFlight)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return printEvents(ctx, w, hub, sc.Namespace, "ShardingConfig", sc.Name, "  last events of the ShardingConfig")
}

func memberEvents(ctx context.Context, w io.Writer, member client.Client, target explainTarget) error {
	fmt.Fprintln(w)
	if target.Resource == "" {
		return printEvents(ctx, w, member, target.Namespace, "", "", "last events in namespace "+target.Namespace+" of the member")
	}
	return printEvents(ctx, w, member, target.Namespace, "", target.Name, fmt.Sprintf("last events of %s/%s in the member", target.Resource, target.Name))
}

// printEvents prints the last maxEvents events in namespace about objects
// of kind (any when empty) and name (any when empty).
func printEvents(ctx context.Context, w io.Writer, c client.Client, namespace, kind, name, title string) error {
	var events corev1.EventList
	if err := c.List(ctx, &events, client.InNamespace(namespace)); err != nil {
		return fmt.Errorf("listing the events in %s: %w", namespace, err)
	}
	var picked []corev1.Event
	for _, e := range events.Items {
		if (kind == "" || e.InvolvedObject.Kind == kind) && (name == "" || e.InvolvedObject.Name == name) {
			picked = append(picked, e)
		}
	}
	if len(picked) == 0 {
		_, err := fmt.Fprintf(w, "%s: none\n", title)
		return err
	}
	last := func(e corev1.Event) time.Time {
		switch {
		case !e.LastTimestamp.IsZero():
			return e.LastTimestamp.Time
		case !e.EventTime.IsZero():
			return e.EventTime.Time
		}
		return e.CreationTimestamp.Time
	}
	slices.SortStableFunc(picked, func(a, b corev1.Event) int { return last(a).Compare(last(b)) })
	picked = picked[max(0, len(picked)-maxEvents):]
	fmt.Fprintf(w, "%s:\n", title)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, e := range picked {
		fmt.Fprintf(tw, "    %s\t%s\t%s\t%s\n", last(e).UTC().Format(time.RFC3339), e.Type, e.Reason, e.Message)
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
