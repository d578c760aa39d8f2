// Package printers prints ctrlmesh objects for people: the placement table
// of ctrlmeshctl status, which the local fleet's demo prints too.
package printers

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// ShardingConfig prints the status of sc for people: a summary line, the conditions and
// the placement table.
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
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
