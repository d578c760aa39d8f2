// Package printers prints ctrlmesh objects for people: the placement table
// of ctrlmeshctl status, which the local fleet's demo prints too, the
// ShardingConfig's subsets, and the traffic policies bound to it.
package printers

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// ShardingConfig prints the status of sc for people: a summary line, the conditions,
// the placement table and, when sc has subsets, the subsets table.
func ShardingConfig(w io.Writer, sc *ctrlmeshv1alpha1.ShardingConfig) error {
	st := &sc.Status
	fmt.Fprintf(w, "ShardingConfig %s/%s: generation %d, observed %d; %d clusters, %d shards, %d ready\n",
		sc.Namespace, sc.Name, sc.Generation, st.ObservedGeneration, st.Clusters, st.Shards, st.ReadyShards)
	if st.Canary != nil && sc.Spec.Canary != nil {
		since := "not healthy"
		if st.Canary.HealthySince != nil {
			since = "healthy since " + st.Canary.HealthySince.UTC().Format("15:04:05")
		}
		fmt.Fprintf(w, "canary: step %d of %d, %s\n", st.Canary.Step+1, len(sc.Spec.Canary.Steps), since)
	}
	for _, c := range st.Conditions {
		fmt.Fprintf(w, "%s=%s (%s) %s\n", c.Type, c.Status, c.Reason, c.Message)
	}
	if len(st.Placement) == 0 {
		_, err := fmt.Fprintln(w, "no shards placed")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARD\tCLUSTER\tPODS\tLEADER\tBUCKETS\tNAMESPACES\tCANARY\tSTATE\tHEALTH")
	for _, p := range st.Placement {
		canary := ""
		if p.Canary {
			canary = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Shard, p.Cluster, orDash(strings.Join(p.Pods, ",")),
			orDash(p.Leader), orDash(p.Buckets), orDash(strings.Join(p.Namespaces, ",")), orDash(canary), p.State, p.Health)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return subsets(w, sc)
}

// subsets prints, for each subset of sc's spec, its pod selector and rules,
// and per shard the placement gives it (one per member cluster where its
// pods run) the cluster, the pods and what they are served; a subset no
// shard serves gets one row of dashes.
func subsets(w io.Writer, sc *ctrlmeshv1alpha1.ShardingConfig) error {
	if len(sc.Spec.Subsets) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SUBSET\tSELECTOR\tRULES\tCLUSTER\tPODS\tBUCKETS\tNAMESPACES\tSTATE")
	for i := range sc.Spec.Subsets {
		s := &sc.Spec.Subsets[i]
		selector := metav1.FormatLabelSelector(&s.Selector)
		served := false
		for _, p := range sc.Status.Placement {
			if p.Subset != s.Name {
				continue
			}
			served = true
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, selector, subsetRules(s), p.Cluster, orDash(strings.Join(p.Pods, ",")),
				orDash(p.Buckets), orDash(strings.Join(p.Namespaces, ",")), p.State)
		}
		if !served {
			fmt.Fprintf(tw, "%s\t%s\t%s\t-\t-\t-\t-\t-\n", s.Name, selector, subsetRules(s))
		}
	}
	return tw.Flush()
}

// subsetRules is what a subset's spec names for its pods to serve.
func subsetRules(s *ctrlmeshv1alpha1.Subset) string {
	var rules []string
	if s.Buckets != "" {
		rules = append(rules, "buckets "+s.Buckets)
	}
	if len(s.Namespaces) > 0 {
		rules = append(rules, "namespaces "+strings.Join(s.Namespaces, ","))
	}
	if s.NamespaceSelector != nil {
		rules = append(rules, "namespaceSelector "+metav1.FormatLabelSelector(s.NamespaceSelector))
	}
	if s.NamespaceRegex != "" {
		rules = append(rules, "namespaceRegex "+s.NamespaceRegex)
	}
	return strings.Join(rules, "; ")
}

// Policies prints the traffic policies bound to a ShardingConfig (the
// caller lists them): for each, its generation and Enforced condition,
// and per member cluster how many of the operator's proxies enforce its
// generation; for a CircuitBreaker also each breaker that is not closed
// in the cluster, its state, the pods it is in that state in and since
// when (on their proxies' clocks).
func Policies(w io.Writer, breakers []ctrlmeshv1alpha1.CircuitBreaker, faults []ctrlmeshv1alpha1.FaultInjection) error {
	if len(breakers)+len(faults) == 0 {
		_, err := fmt.Fprintln(w, "no traffic policies")
		return err
	}
	for i := range breakers {
		if err := policy(w, "CircuitBreaker", &breakers[i].ObjectMeta, &breakers[i].Status, len(breakers[i].Spec.Breakers) > 0); err != nil {
			return err
		}
	}
	for i := range faults {
		if err := policy(w, "FaultInjection", &faults[i].ObjectMeta, &faults[i].Status, false); err != nil {
			return err
		}
	}
	return nil
}

func policy(w io.Writer, kind string, m *metav1.ObjectMeta, st *ctrlmeshv1alpha1.PolicyStatus, hasBreakers bool) error {
	fmt.Fprintf(w, "%s %s/%s: generation %d, observed %d\n", kind, m.Namespace, m.Name, m.Generation, st.ObservedGeneration)
	for _, c := range st.Conditions {
		fmt.Fprintf(w, "%s=%s (%s) %s\n", c.Type, c.Status, c.Reason, c.Message)
	}
	if len(st.Clusters) == 0 {
		_, err := fmt.Fprintln(w, "no member cluster reports it")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if !hasBreakers {
		fmt.Fprintln(tw, "CLUSTER\tENFORCING")
		for _, c := range st.Clusters {
			fmt.Fprintf(tw, "%s\t%d/%d\n", c.Cluster, c.Enforcing, c.Proxies)
		}
		return tw.Flush()
	}
	fmt.Fprintln(tw, "CLUSTER\tENFORCING\tBREAKER\tSTATE\tPODS\tSINCE")
	for _, c := range st.Clusters {
		if len(c.Breakers) == 0 {
			fmt.Fprintf(tw, "%s\t%d/%d\tall\t%s\t-\t-\n", c.Cluster, c.Enforcing, c.Proxies, ctrlmeshv1alpha1.BreakerClosed)
			continue
		}
		for _, b := range c.Breakers {
			fmt.Fprintf(tw, "%s\t%d/%d\t%s\t%s\t%s\t%s\n", c.Cluster, c.Enforcing, c.Proxies, b.Name, b.State,
				orDash(strings.Join(b.Pods, ",")), b.LastTransitionTime.UTC().Format(time.RFC3339))
		}
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
