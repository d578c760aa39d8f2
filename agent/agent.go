// Package agent is ctrlmesh's agent in one member cluster: the hub's hands
// there. So far it joins the cluster to the hub and keeps its heartbeat; the
// labeller (agent/labeler) and the rules, status and injection parts are
// wired in as they are built.
package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ctrlmesh/ctrlmesh/agent/join"
)

// Options of a running agent.
type Options struct {
	// Hub is a client of the hub with the agent's credentials.
	Hub client.Client
	// Member answers the member cluster's version.
	Member discovery.ServerVersionInterface
	// ClusterName is the member's name on the hub.
	ClusterName string
	// Identity is this agent's holder identity, such as its pod name.
	Identity string
	// LeaseDuration and RenewInterval of the heartbeat; zero for defaults.
	LeaseDuration, RenewInterval time.Duration
	Log                          logr.Logger
}

// Run joins the hub — retrying with backoff while the hub cannot be reached
// or refuses — then renews the heartbeat until ctx ends.
func Run(ctx context.Context, opts Options) error {
	if opts.Hub == nil || opts.Member == nil || opts.ClusterName == "" || opts.Identity == "" {
		return errors.New("agent: hub client, member, cluster name and identity are all required")
	}
	heartbeat := &join.Heartbeat{
		Hub: opts.Hub, ClusterName: opts.ClusterName, Identity: opts.Identity,
		LeaseDuration: opts.LeaseDuration, RenewInterval: opts.RenewInterval, Log: opts.Log.WithName("heartbeat"),
	}
	backoff := time.Second
	for {
		err := join.Join(ctx, opts.Hub, join.JoinOptions{ClusterName: opts.ClusterName, Member: opts.Member})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		opts.Log.Error(err, "joining the hub failed; retrying", "cluster", opts.ClusterName, "in", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Minute)
	}
	opts.Log.Info("joined the hub", "cluster", opts.ClusterName)
	if err := heartbeat.Run(ctx); err != nil {
		return fmt.Errorf("agent heartbeat: %w", err)
	}
	return nil
}
