package controlplane

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// RestartKubelet stops the node's kubelet for down and runs it again with
// the same configuration and credentials, as a restart of its service (an
// upgrade, a crash) would: SIGKILL, so that it cleans nothing up. The
// pods keep running meanwhile (the node's containerd holds them); the new
// kubelet finds them in the runtime and takes them over. It returns once
// the Node is Ready again, with how long that took after the kill.
func (n *Node) RestartKubelet(ctx context.Context, c *Cluster, down, within time.Duration) (time.Duration, error) {
	old := n.kubelet
	old.Kill()
	killed := time.Now()
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(down):
	}
	kubelet, err := StartProcess(old.name, old.logPath, false, old.binary, old.args...)
	if err != nil {
		return 0, fmt.Errorf("restarting the kubelet of %s: %w", n.Name, err)
	}
	n.kubelet = kubelet
	// The kubelet reports the Node Ready again once its runtime and
	// network are up; the condition's heartbeat must be the new kubelet's.
	if err := n.waitReadySince(ctx, c, killed, within); err != nil {
		return 0, err
	}
	return time.Since(killed), nil
}

// waitReadySince waits until the Node is Ready by a status its kubelet
// posted after since (its heartbeat, in whole seconds, later than since:
// the Ready condition of a kubelet that stopped stays until the node
// lifecycle controller notices), failing early when a component exits.
func (n *Node) waitReadySince(ctx context.Context, c *Cluster, since time.Time, within time.Duration) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, within, true, func(ctx context.Context) (bool, error) {
		if err := n.Err(); err != nil {
			return false, err
		}
		var node corev1.Node
		if err := c.Client.Get(ctx, client.ObjectKey{Name: n.Name}, &node); err != nil {
			last = err.Error()
			return false, nil
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				last = fmt.Sprintf("Ready=%s at %s: %s", cond.Status, cond.LastHeartbeatTime.Format(time.TimeOnly), cond.Message)
				return cond.Status == corev1.ConditionTrue && cond.LastHeartbeatTime.After(since), nil
			}
		}
		last = "no Ready condition"
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for node %s to be Ready again after %s (last: %s): %w", n.Name, since.Format(time.TimeOnly), last, err)
	}
	return nil
}
