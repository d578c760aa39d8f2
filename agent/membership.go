package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ctrlmesh/ctrlmesh/pkg/membership"
)

// acceptPollInterval is how often the agent asks whether the hub accepted
// its cluster, until it has. Its hub RBAC lets it get its ManagedCluster but
// not watch it, so it asks.
const acceptPollInterval = 5 * time.Second

// hubMembership joins the cluster to the hub, renews the heartbeat and, once the
// hub has accepted the cluster, calls onAccepted: before that the cluster
// gets no rules. It runs on the elected agent only, so that one replica
// speaks for the cluster.
type hubMembership struct {
	hub    client.Client
	member discovery.ServerVersionInterface
	// memberReader reads the member's kube-system namespace, whose UID is
	// the cluster ID the agent claims.
	memberReader client.Reader
	// namespace is the agent's, claimed for the labeler's binding.
	namespace  string
	heartbeat  *membership.Heartbeat
	onAccepted func(ctx context.Context) error
	log        logr.Logger
}

// NeedLeaderElection is true: one agent replica speaks for the cluster.
func (m *hubMembership) NeedLeaderElection() bool { return true }

// Start joins, retrying with backoff while the hub cannot be reached or
// refuses, then renews the heartbeat until ctx ends.
func (m *hubMembership) Start(ctx context.Context) error {
	cluster := m.heartbeat.ClusterName
	backoff := time.Second
	for {
		err := membership.Join(ctx, m.hub, membership.JoinOptions{
			ClusterName: cluster, Member: m.member, MemberClient: m.memberReader, AgentNamespace: m.namespace, LeaseDuration: m.heartbeat.LeaseDuration,
		})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		m.log.Error(err, "Joining the hub failed; retrying", "cluster", cluster, "in", backoff)
		if !sleep(ctx, backoff) {
			return nil
		}
		backoff = min(2*backoff, time.Minute)
	}
	m.log.Info("Joined the hub", "cluster", cluster)
	heartbeatDone := make(chan error, 1)
	go func() { heartbeatDone <- m.heartbeat.Run(ctx) }()

	if err := m.awaitAcceptance(ctx); err != nil {
		return err
	}
	if ctx.Err() == nil {
		m.log.Info("The hub accepted the cluster; taking rules from it", "cluster", cluster)
		if err := m.onAccepted(ctx); err != nil {
			return fmt.Errorf("starting to take rules from the hub: %w", err)
		}
		m.markJoined(ctx)
	}
	if err := <-heartbeatDone; err != nil {
		return fmt.Errorf("agent heartbeat: %w", err)
	}
	return nil
}

// awaitAcceptance returns once the hub accepted the cluster or ctx ended.
func (m *hubMembership) awaitAcceptance(ctx context.Context) error {
	cluster := m.heartbeat.ClusterName
	waiting := false
	for {
		accepted, err := membership.IsAccepted(ctx, m.hub, cluster)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			m.log.Error(err, "Asking the hub whether it accepted the cluster failed; retrying", "cluster", cluster)
		case accepted:
			return nil
		case !waiting:
			m.log.Info("Waiting for the hub to accept the cluster (ManagedCluster spec.hubAcceptsClient); no rules until then", "cluster", cluster)
			waiting = true
		}
		if !sleep(ctx, acceptPollInterval) {
			return nil
		}
	}
}

// markJoined writes the ManagedClusterJoined condition, retrying with
// backoff until it is written or ctx ends. The condition tells people and
// OCM tooling the agent took over; nothing of ctrlmesh waits for it.
func (m *hubMembership) markJoined(ctx context.Context) {
	backoff := time.Second
	for {
		err := membership.MarkJoined(ctx, m.hub, m.heartbeat.ClusterName)
		if err == nil || ctx.Err() != nil {
			return
		}
		m.log.Error(err, "Marking the cluster joined failed; retrying", "cluster", m.heartbeat.ClusterName, "in", backoff)
		if !sleep(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, time.Minute)
	}
}

// sleep waits d or until ctx ends; it reports whether ctx is still alive.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
